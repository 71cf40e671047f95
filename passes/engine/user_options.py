"""What the user asks of pipesplit beside ``strategy.pipeline``, before ``dist.to_static``:
:func:`use_costs`, :func:`measure_costs`, :func:`use_memory_budget` (kept as
:class:`~.state.UserOptions` on the user's strategy, re-exported by
:mod:`pipesplit.passes.strategy`), and what they mean for a request: the budget's check
(:func:`check_memory_budget`) and the training step measured for a re-plan
(:func:`measured_step`)."""
from __future__ import annotations

import os
from typing import Optional, Tuple

from pipesplit.job_list.costs import Costs
from pipesplit.job_list.registry import ScheduleSpec, searching_schedules
from pipesplit.passes.engine.knobs import runtimes_given
from pipesplit.passes.engine.state import DEFAULT_MEASURE, Request, options_of, set_options
from pipesplit.passes.engine.strategy_config import requested_spec
from pipesplit.passes.measure.replan import MEASURED_STEP
from pipesplit.passes.transport.devices import measured_on_host


def use_costs(strategy, costs) -> None:
    """Give the schedule built through the engine measured job costs: ``auto`` / ``autoV``
    search with them, every schedule's lowering and simulation use them.  ``costs``: a
    :class:`~pipesplit.job_list.Costs`, its dict, or the path of a cost file (what
    ``pipesplit profile`` writes).  ``strategy``: the ``dist.Strategy`` (or its ``pipeline``
    section) given to ``dist.to_static``, before that call."""
    pipeline = _pipeline_section(strategy)
    if isinstance(costs, (str, os.PathLike)):
        path = os.fspath(costs)
        if not os.path.isfile(path):
            raise ValueError(f"costs: no cost file {path!r} (`pipesplit profile ... --json "
                             "FILE` writes one)")
        costs = Costs.load(path)
    elif isinstance(costs, dict):
        costs = Costs.from_dict(costs)
    elif not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, a dict or the path of a cost file, got "
                        f"{type(costs).__name__}")
    set_options(pipeline, costs=costs)


def measure_costs(strategy, step: Optional[int] = MEASURED_STEP) -> None:
    """Measure every rank's jobs during training step ``step`` (0-based) through the engine
    and build the training plan again once with the costs measured (see
    :mod:`pipesplit.passes.measure.replan`); ``step=None`` measures nothing.  By default ``auto`` /
    ``autoV`` measure step :data:`~pipesplit.passes.measure.replan.MEASURED_STEP` on a CPU build when
    :func:`use_costs` gave no costs; other schedules measure nothing (their order does not
    depend on costs).  Host-side job times stand for the jobs' costs only on CPU: on a
    CUDA build give a cost file (:func:`use_costs`) instead."""
    pipeline = _pipeline_section(strategy)
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int or None, got {type(step).__name__}")
        if step < 0:
            raise ValueError(f"step must be >= 0 (a 0-based training step), got {step}")
        if not measured_on_host():
            raise ValueError("measure_costs: host times of CUDA jobs are not their costs; on a "
                             "CUDA build give measured costs with use_costs(strategy, FILE)")
    set_options(pipeline, measure_step=step)


def use_memory_budget(strategy, budget) -> None:
    """Keep ``auto`` / ``autoV`` within ``budget`` bytes of allocated memory per process: an
    int of bytes or a string such as ``"48MB"`` / ``"60GB"`` (binary: 1 KB = 1024 B); None
    removes it.  The measured training step (:func:`measure_costs`) then also measures each
    rank's bytes (resident, per kept forward, temporaries:
    :mod:`pipesplit.passes.measure.memory_budget`), and the re-plan searches only schedules
    whose peak stays within the budget on every rank.  A budget no schedule fits is a
    :class:`~pipesplit.passes.measure.memory_budget.MemoryBudgetError` (a ``ValueError``) at
    the re-plan, on every process, naming the smallest budget that would serve.  Measured
    through Paddle's host allocator: CPU builds only in this version.  Without a budget
    nothing changes."""
    from pipesplit.passes.measure.memory_budget import parse_budget

    pipeline = _pipeline_section(strategy)
    set_options(pipeline, memory_budget=None if budget is None else parse_budget(budget))


def reshard_after_forward(strategy, enabled: bool = True) -> None:
    """Under sharding stage 3 (``dist.ShardingStage3``, ``sharding_level`` 3), whether a weight
    gathered from its shards for a micro-batch's forward is dropped after the forward job and
    gathered again for its backward (True, the default, as FSDP's ``reshard_after_forward``:
    one copy of a stage's weights at a time, one more all-gather per weight and micro-batch),
    or kept from the forward to the backward (False: Paddle's program as it is, a whole copy
    per micro-batch in flight).  ``docs/engine_usage.md`` tables both, measured.  No effect
    without stage 3."""
    pipeline = _pipeline_section(strategy)
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    set_options(pipeline, reshard_after_forward=enabled)


def check_memory_budget(pipeline_strategy, request: Optional[Request] = None) -> None:
    """A memory budget is given to a schedule that searches, with its measured step on, on a
    CPU build (the one measured through the engine's profiler).  ``request``: the section's,
    when the caller resolved it already."""
    options = options_of(pipeline_strategy)
    if options.memory_budget is None:
        return
    spec, searches = _schedule_of(pipeline_strategy, request)
    if not searches:
        raise ValueError(f"use_memory_budget: schedule_mode {spec.name!r} does not search; "
                         f"only {searching_schedules()} plan under a memory budget (the peak "
                         f"of {spec.name} is fixed by its order)")
    if options.measure_step is None:
        raise ValueError("use_memory_budget: the budget is priced in the measured training "
                         "step, and measure_costs(strategy, None) turned it off")
    if not measured_on_host():
        raise ValueError("use_memory_budget: the bytes are measured with Paddle's host "
                         "allocator, on CPU builds only in this version")


def measured_step(pipeline_strategy, request: Optional[Request] = None) -> Optional[int]:
    """The training step whose jobs are measured for a re-plan (None: no re-plan), from the
    user's options on the section (an engine's session keeps what its opening found).
    ``request``: the section's, when the caller resolved it already."""
    options = options_of(pipeline_strategy)
    if options.measure_step != DEFAULT_MEASURE:
        return options.measure_step
    searches = _schedule_of(pipeline_strategy, request)[1]
    costs_given = options.costs is not None or runtimes_given(pipeline_strategy)
    wanted = options.memory_budget is not None or (not costs_given and measured_on_host())
    return MEASURED_STEP if searches and wanted else None


def _schedule_of(pipeline_strategy, request: Optional[Request]) -> Tuple[ScheduleSpec, bool]:
    """(spec, whether it searches) of ``request``, else of the schedule the section names."""
    if request is not None:
        return request.spec, request.searches
    spec = requested_spec(pipeline_strategy)
    return spec, spec.searches


def _pipeline_section(strategy):
    pipeline = getattr(strategy, "pipeline", strategy)
    if not hasattr(pipeline, "schedule_mode"):
        raise TypeError(f"strategy must be a paddle.distributed.Strategy or its pipeline "
                        f"section, got {type(strategy).__name__}")
    return pipeline

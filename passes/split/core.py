"""The core every plan builder shares: the plan record, the schedule, the sub-program split.

Three builders sit on it, one per kind of input program (see docs/design.md, "Three programs the
passes accept"): :mod:`.pipeline` (the whole model, every rank emulated in one process),
:mod:`.per_rank` (the whole model, one rank's programs) and
:mod:`pipesplit.passes.engine.engine_rank` (one rank's program as Paddle's auto-parallel engine
partitioned it).  They take these pieces in one order, :class:`.builder.PlanBuilder`'s.  The
engine's builder imports neither of the others; :mod:`.pipeline` hands a config with
``pp_stage`` to :mod:`.per_rank`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

from pipesplit.job_list import Schedule
from pipesplit.job_list.opening import OpenedSchedule
from pipesplit.job_list.opening import open_schedule as open_job_list_schedule
from pipesplit.job_list.auto import split_stages_of
from pipesplit.job_list.request import PipelineConfig, RequestedSchedule, make_schedule
from pipesplit.job_list.simulate import SimResult, simulate

from pipesplit.passes._paddle import require_supported_paddle

paddle = require_supported_paddle()

from pipesplit.ir_utils import (complete_program, has_backward, split_program,  # noqa: E402
                                without_op_callstacks)
from pipesplit.ir_utils.split_backward import SplitReport, split_backward  # noqa: E402


@dataclass
class PipelinePlan:
    """Everything one application of the pass produced; ``plan`` goes to the executor."""

    config: PipelineConfig
    schedule: Schedule          # compute-only, per rank
    lowered: Schedule           # with send / recv jobs
    job_order: List[Tuple[str, int]]  # (Paddle job type, micro-batch), as the plan runs it
    split: object               # pipesplit.ir_utils.SplitProgram
    plan: object                # paddle core.Plan
    backward_split: Optional[SplitReport] = None
    rank_info: Optional[object] = None  # per-rank plans: pipesplit.passes.split.per_rank.RankInfo
    # the engine path: this rank's comm jobs (pipesplit.passes.transport.progress.CommProgress)
    comm_progress: Optional[object] = None
    # the latency model's times of ``schedule`` under the config's costs (steered the lowering)
    timing: Optional[SimResult] = None
    # the engine path: the engine's program the plan was built from (a re-plan builds again)
    source_program: Optional[object] = None
    # the engine path: persistable scope variables the plan's step jobs need (name -> PIR
    # type), created in the engine's scope before the first step
    scope_variables: Dict[str, object] = field(default_factory=dict)

    def simulate(self, costs=None) -> SimResult:
        """The schedule's simulated times: the plan's own for the config's costs (latency
        model), simulated afresh for other costs or the rendezvous model."""
        if costs is None and self.timing is not None and not self.timing.costs.rendezvous:
            return self.timing
        return simulate(self.schedule, costs or self.config.costs)

    def init_scope(self, scope, place=None):
        """Create and zero the gradient accumulators in ``scope`` (after running startup)."""
        self.split.init_scope(scope, place or paddle.CPUPlace())


def open_schedule(config: PipelineConfig, main_program,
                  requested: Optional[RequestedSchedule] = None) -> OpenedSchedule:
    """The one place every builder opens a plan's schedule: the one ``requested`` was resolved
    with (:func:`~pipesplit.job_list.request.request_schedule`: built once, the ``auto``
    search too), taken as it is when ``config`` is its request or that on one of its ranks;
    without one, built now (``config.build()``); then opened by
    :func:`pipesplit.job_list.opening.open_schedule` (validated, forward only for a program
    without backward, simulated and lowered once)."""
    if requested is None:
        schedule = config.build()
    elif config == requested.config or config in requested.ranks:
        schedule = requested.schedule
    else:
        raise ValueError(f"the request given ({requested.config.schedule}, "
                         f"pp={requested.config.pp_degree}, vpp={requested.config.vpp_degree}, "
                         f"m={requested.config.num_micro_batches}) is not this config's "
                         f"({config.schedule}, pp={config.pp_degree}, vpp={config.vpp_degree}, "
                         f"m={config.num_micro_batches})")
    return open_job_list_schedule(schedule, config.costs,
                                  forward_only=not has_backward(main_program))


def split_chunks_of(config: PipelineConfig, num_chunks: int,
                    schedule: Optional[Schedule] = None) -> FrozenSet[int]:
    """The chunks (of a program with ``num_chunks`` chunks) whose backward runs as B / W jobs.

    From the schedule's jobs: a stage with backward_b / backward_w jobs is split, one with
    backward jobs is not (``auto`` decides per stage).  Without a schedule: every chunk when
    the config splits (``config.splits_backward``), none otherwise; for a searched schedule
    (auto / autoV, which may leave stages unsplit) the search is run again (it is
    deterministic).  ``num_chunks`` is ``config.num_stages`` (chunk = global stage) or
    ``config.vpp_degree`` (chunk = this rank's local chunk, ``config.pp_stage``)."""
    if schedule is None and config.spec.searches:
        schedule = make_schedule(config)
    if schedule is None:
        return frozenset(range(num_chunks)) if config.splits_backward else frozenset()
    stages = split_stages_of(schedule)
    if num_chunks == config.num_stages:
        return stages
    if num_chunks == config.vpp_degree and config.pp_stage is not None:
        return frozenset(c for c in range(num_chunks)
                         if schedule.placement.stage(config.pp_stage, c) in stages)
    raise ValueError(f"num_chunks must be pp*vpp ({config.num_stages}) or, with pp_stage, vpp "
                     f"({config.vpp_degree}); got {num_chunks}")


def split_sub_programs(main_program, config: PipelineConfig, num_chunks: Optional[int] = None,
                       accumulate: Optional[str] = "config", prepare=None,
                       fetch_names=None, schedule: Optional[Schedule] = None):
    """(SplitProgram, SplitReport or None): one sub-program per (kind, chunk), with the backward
    split into B / W where the schedule runs I / W jobs (:func:`split_chunks_of`; pass the
    ``schedule`` the plan runs) and gradient accumulation added.

    Works on a clone; the op-creation call stacks Paddle would record are skipped (speed).
    ``num_chunks``: default every virtual stage.  ``accumulate``: default the config's mode;
    None adds none (the engine's gradient merge already accumulates).  ``prepare(work)``, if
    given, edits the clone before completion (the engine path turns p2p ops into handoffs)."""
    num_chunks = config.num_stages if num_chunks is None else num_chunks
    mode = config.grad_accumulation if accumulate == "config" else accumulate
    with without_op_callstacks():
        work = main_program.clone()
        if prepare is not None:
            prepare(work)
        complete_program(work)
        chunks = split_chunks_of(config, num_chunks, schedule)
        splits = bool(chunks) and has_backward(work)  # evaluation: nothing to split
        report = split_backward(work, chunks=chunks) if splits else None
        split = split_program(work, num_chunks, split_backward=chunks if splits else False,
                              accumulate=mode, completed=True, fetch_names=fetch_names,
                              num_micro_batches=config.num_micro_batches)
    return split, report

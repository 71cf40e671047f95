"""Paddle's ``Strategy().pipeline`` in pipesplit's terms: the :class:`PipelineConfig` it asks
for, the schedule the user named, and this process's pipeline (:class:`Pipe`) from the engine's
stage meshes.  Only translation: nothing here replaces a Paddle name."""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Optional

from pipesplit.job_list.costs import Costs
from pipesplit.job_list.pipe import Pipe, pipe_of
from pipesplit.job_list.placement import SizeError

from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes.engine.state import (DEFAULT_MEASURE, EngineState, options_of, set_options,
                           state_of)
from pipesplit.passes.measure.replan import MEASURED_STEP

#: a size as the schedules and the pass name it -> its field of ``strategy.pipeline``
_FIELD = {"vpp": "vpp_degree", "pp": "pp_degree", "m": "accumulate_steps",
          "vpp_degree": "vpp_degree", "pp_degree": "pp_degree",
          "num_micro_batches": "accumulate_steps"}


def _said_in_strategy_terms(error: SizeError) -> str:
    return error.said_as(f"strategy.pipeline.{_FIELD.get(error.field, error.field)}")


def record_pipe(dist_program, pipeline_strategy) -> Pipe:
    """This process's pipeline (:class:`~pipesplit.job_list.pipe.Pipe`) from the stage meshes of
    the engine's whole distributed program, kept beside the engine's strategy for its pipeline
    pass: stage meshes may have any shape (dp, mp, ... axes), and a peer is the process of the
    neighbouring stage at the same coordinate, never process +- 1.  (The engine-path hook
    keeps it in the engine's :class:`~.state.EngineState`.)"""
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program

    meshes = get_sub_process_mesh_by_program(dist_program)
    pp = int(pipeline_strategy.pp_degree)
    if len(meshes) != pp:
        raise ValueError(
            f"strategy.pipeline.pp_degree is {pp}, but the model's layers are placed on "
            f"{len(meshes)} stage mesh(es): " + ", ".join(
                f"{list(m.process_ids)} {list(m.dim_names)}" for m in meshes)
            + "; set pp_degree to the number of pipeline stage meshes")
    return pipe_of([m.process_ids for m in meshes], dist.get_rank(), [m.shape for m in meshes])


#: ``strategy.pipeline.pp_degree`` when the user leaves it alone (Paddle's default)
_DEFAULT_PP_DEGREE = 1


def stage_mesh_count(model) -> int:
    """How many pipeline stage meshes ``model``'s parameters sit on, by Paddle's own rule
    (``get_sub_process_mesh``: a mesh of every process, e.g. the global mesh, is no stage
    when smaller meshes exist); 0 for a model without distributed parameters."""
    from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh

    meshes = []
    for param in getattr(model, "parameters", lambda: [])():
        if param.is_dist() and param.process_mesh not in meshes:
            meshes.append(param.process_mesh)
    return len(get_sub_process_mesh(meshes)) if meshes else 0


def fill_in_what_paddle_derives(strategy, model) -> None:
    """The engine's copy of ``strategy`` with the pipeline fields Paddle works out itself and
    its tests therefore leave at their defaults (the user's own object is not touched:
    ``DistModel`` hands the engine a deep copy):

    * ``pipeline.pp_degree`` left at 1 while the layers sit on several stage meshes: the
      number of stage meshes (an explicit other value that disagrees is refused later,
      naming both, by :func:`record_pipe`);
    * ``gradient_merge.enable`` beside the pipeline (checked by
      :func:`~.strategy_checks.check_gradient_merge`): ``k_steps = accumulate_steps``, what
      Paddle's engine sets when it builds the training program, set before the engine sizes
      its data specs by it."""
    pipeline = strategy.pipeline
    if pipeline.pp_degree == _DEFAULT_PP_DEGREE:
        stages = stage_mesh_count(model)
        if stages > 1:
            pipeline.pp_degree = stages
    merge = getattr(strategy, "gradient_merge", None)
    if merge is not None and merge.enable:
        merge.k_steps = pipeline.accumulate_steps


def block_sizes(pipeline_strategy, model) -> Optional[list]:
    """How many blocks the user placed on each stage mesh, where they differ between stages
    (Paddle's VPP test: 7 layers on pp 2), else None: the schedule is then built and
    simulated with job costs in proportion to each virtual stage's blocks
    (:func:`sized_costs`), unless :func:`use_costs` gave costs."""
    from pipesplit.passes.engine.strategy_checks import blocks_per_stage_mesh

    per_rank = blocks_per_stage_mesh(pipeline_strategy, model)
    return per_rank if per_rank is not None and len(set(per_rank)) > 1 else None


def sized_costs(pipeline_strategy, blocks: Optional[list]) -> Optional[Costs]:
    """Unit job costs scaled per global virtual stage by its share of the ``blocks`` of each
    stage mesh (:func:`block_sizes`; dealt to its chunks on the schedule's placement:
    :meth:`~pipesplit.job_list.placement.Placement.deal_blocks`); None for even stages."""
    from pipesplit.job_list.placement import Placement
    from pipesplit.job_list.registry import get_spec

    if blocks is None:
        return None
    placement = Placement(get_spec(requested_schedule(pipeline_strategy)).placement,
                          int(pipeline_strategy.pp_degree), int(pipeline_strategy.vpp_degree))
    dealt = placement.deal_blocks(blocks)
    mean = sum(dealt) / len(dealt)
    scale = [n / mean for n in dealt]
    return Costs(forward=scale, backward_b=scale, backward_w=scale)


def pipe_from_strategy(pipeline_strategy) -> Pipe:
    """This process's pipeline: the one the engine's stage meshes gave (kept in the engine's
    state at chunk completion), else one process per stage."""
    import paddle.distributed as dist

    state = state_of(pipeline_strategy)
    if state is not None and state.pipe is not None:
        return state.pipe
    pp = int(pipeline_strategy.pp_degree)
    if dist.get_world_size() == pp:  # one process per stage
        return Pipe.single_process_per_stage(pp)
    raise ValueError("pipesplit did not see the engine's stage meshes (call "
                     "pipesplit.passes.strategy.enable_strategy() before dist.to_static)")


def _pp_stage(pipeline_strategy) -> Optional[int]:
    import paddle.distributed as dist

    pp = int(pipeline_strategy.pp_degree)
    if pp <= 1 or dist.get_world_size() <= 1:
        return None  # one process: emulate every rank
    state = state_of(pipeline_strategy)
    if state is None or state.pipe is None:
        # a whole-model program outside the engine: Paddle's rule (pp the outermost mesh axis)
        from paddle.distributed.auto_parallel.static.utils import get_pp_stage_by_pp_degree
        return get_pp_stage_by_pp_degree(pp)
    return state.pipe.rank_of(dist.get_rank())


def requested_schedule(pipeline_strategy) -> str:
    """The schedule the user asked for (the engine sees ``"VPP"`` while pipesplit serves)."""
    state = state_of(pipeline_strategy)
    return state.requested if state is not None else str(pipeline_strategy.schedule_mode)


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
        if _on_cuda():
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


def check_memory_budget(pipeline_strategy) -> None:
    """A memory budget is given to a schedule that searches, with its measured step on, on a
    CPU build (the one measured through the engine's profiler)."""
    from pipesplit.job_list.auto import AUTO_NAMES
    from pipesplit.job_list.registry import get_spec

    options = options_of(pipeline_strategy)
    if options.memory_budget is None:
        return
    name = get_spec(requested_schedule(pipeline_strategy)).name
    if name not in AUTO_NAMES:
        raise ValueError(f"use_memory_budget: schedule_mode {name!r} does not search; only "
                         f"{list(AUTO_NAMES)} plan under a memory budget (the peak of {name} is "
                         f"fixed by its order)")
    if options.measure_step is None:
        raise ValueError("use_memory_budget: the budget is priced in the measured training "
                         "step, and measure_costs(strategy, None) turned it off")
    if _on_cuda():
        raise ValueError("use_memory_budget: the bytes are measured with Paddle's host "
                         "allocator, on CPU builds only in this version")


def measured_step(pipeline_strategy) -> Optional[int]:
    """The training step whose jobs are measured for a re-plan (None: no re-plan)."""
    from pipesplit.job_list.auto import AUTO_NAMES
    from pipesplit.job_list.registry import get_spec

    state = state_of(pipeline_strategy)
    if state is not None:
        return state.measure_step
    options = options_of(pipeline_strategy)
    if options.measure_step != DEFAULT_MEASURE:
        return options.measure_step
    searched = get_spec(requested_schedule(pipeline_strategy)).name in AUTO_NAMES
    wanted = options.memory_budget is not None or (options.costs is None and not _on_cuda())
    return MEASURED_STEP if searched and wanted else None


def _on_cuda() -> bool:
    """Whether the engine runs on a GPU (the one device rule, as the pass's transport)."""
    from pipesplit.passes.transport.p2p import resolve_device

    return resolve_device("auto") == "gpu"


def _pipeline_section(strategy):
    pipeline = getattr(strategy, "pipeline", strategy)
    if not hasattr(pipeline, "schedule_mode"):
        raise TypeError(f"strategy must be a paddle.distributed.Strategy or its pipeline "
                        f"section, got {type(strategy).__name__}")
    return pipeline


def config_from_strategy(pipeline_strategy, pp_stage="auto",
                         blocks: Optional[list] = None) -> PipelineConfig:
    """The :class:`PipelineConfig` for Paddle's ``Strategy().pipeline`` section (with the
    costs :func:`use_costs` gave it, else, for ``blocks`` of uneven size per stage mesh,
    :func:`sized_costs`).  An engine's section gives its state's config (its ``blocks``)."""
    state = state_of(pipeline_strategy)
    if state is not None:
        stage = _pp_stage(pipeline_strategy) if pp_stage == "auto" else pp_stage
        return replace(state.config, pp_stage=stage)
    pp = int(pipeline_strategy.pp_degree)
    attrs = dict(num_micro_batches=int(pipeline_strategy.accumulate_steps),
                 pp_degree=pp, vpp_degree=int(pipeline_strategy.vpp_degree),
                 split_backward=bool(pipeline_strategy.split_backward),
                 pp_stage=_pp_stage(pipeline_strategy) if pp_stage == "auto" else pp_stage,
                 costs=options_of(pipeline_strategy).costs
                 or sized_costs(pipeline_strategy, blocks))
    try:
        return PipelineConfig.from_attrs(requested_schedule(pipeline_strategy), attrs)
    except SizeError as e:
        raise ValueError(_said_in_strategy_terms(e)) from None
    except ValueError as e:
        raise ValueError(f"strategy.pipeline: {e}") from None


def check_strategy(pipeline_strategy, blocks: Optional[list] = None) -> PipelineConfig:
    """Refuse a pipeline strategy pipesplit cannot serve, before the engine builds anything:
    an unknown schedule name, or pp / vpp / micro-batches the schedule cannot serve
    (``ValueError`` naming the strategy field and the constraint).  Returns the config (no
    rank); :func:`checked_request` also returns the schedule built for the check."""
    return checked_request(pipeline_strategy, blocks)[0]


def checked_request(pipeline_strategy, blocks: Optional[list] = None):
    """(config, schedule): :func:`check_strategy`'s config and the schedule it built."""
    config = config_from_strategy(pipeline_strategy, pp_stage=None, blocks=blocks)
    try:
        return config, config.build()
    except ValueError as e:
        said = _said_in_strategy_terms(e) if isinstance(e, SizeError) else str(e)
        raise ValueError(f"strategy.pipeline.schedule_mode={config.schedule!r} cannot serve "
                         f"this strategy: {said}") from None


def open_engine_state(engine) -> EngineState:
    """The engine-init hook's one reading of the engine's strategy: the checks (field types,
    the gradient merge, the world, the model, the schedule), with what Paddle derives filled
    in between the field types and the checks that read ``pp_degree``; the request resolved
    once into an :class:`~.state.EngineState` (not yet attached)."""
    import paddle
    import paddle.distributed as dist

    from pipesplit.passes.engine.strategy_checks import (check_fields, check_gradient_merge,
                                                         check_model, check_world)
    from pipesplit.passes.engine.surgery import placements_of

    pipeline = engine._strategy.pipeline
    check_fields(pipeline)
    check_gradient_merge(engine._strategy)
    fill_in_what_paddle_derives(engine._strategy, engine._model)
    check_world(pipeline, dist.get_world_size())
    check_model(pipeline, engine._model)
    check_memory_budget(pipeline)
    config, checked = checked_request(pipeline, block_sizes(pipeline, engine._model))
    return EngineState(requested=str(pipeline.schedule_mode), config=config, checked=checked,
                       options=options_of(pipeline), measure_step=measured_step(pipeline),
                       user_placements=placements_of(engine._model),
                       parameter_names=frozenset(p.name for p in engine._model.parameters()),
                       scope=paddle.static.global_scope())

"""Paddle's ``Strategy().pipeline`` in pipesplit's terms: the :class:`~.state.Request` it makes
(the schedule it names, its :class:`PipelineConfig`, placement and whether it searches), the
costs of stages of uneven size, and this process's pipeline (:class:`Pipe`) from the engine's
stage meshes.  Only translation: nothing here writes to the strategy (what Paddle derives is
filled in when the engine's state is opened: :mod:`.open_state`), and a field the schedule
cannot take is a ``ValueError`` in the strategy's words (the checks that the request serves,
before the engine builds anything, are :mod:`.strategy_checks`; the user's options are
:mod:`.user_options`).

An engine's request is resolved once, when its state is opened, and read from its
:class:`~.state.EngineState` afterwards; a strategy outside an engine is translated afresh at
each call."""
from __future__ import annotations

from typing import Optional

from pipesplit.job_list.costs import Costs
from pipesplit.job_list.pipe import Pipe, pipe_of
from pipesplit.job_list.placement import Placement, SizeError
from pipesplit.job_list.registry import ScheduleSpec, get_spec
from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes.engine.state import Request, options_of, state_of

#: a size as the schedules and the pass name it -> its field of ``strategy.pipeline``
_FIELD = {"vpp": "vpp_degree", "pp": "pp_degree", "m": "accumulate_steps",
          "vpp_degree": "vpp_degree", "pp_degree": "pp_degree",
          "num_micro_batches": "accumulate_steps"}


def said_in_strategy_terms(error: SizeError) -> str:
    return error.said_as(f"strategy.pipeline.{_FIELD.get(error.field, error.field)}")


def requested_spec(pipeline_strategy) -> ScheduleSpec:
    """The schedule ``strategy.pipeline.schedule_mode`` names: an engine's, resolved when its
    state was opened; else looked up now (``ValueError`` naming the field for an unknown name)."""
    state = state_of(pipeline_strategy)
    if state is not None:
        return state.request.spec
    return _spec_named(str(pipeline_strategy.schedule_mode))


def _spec_named(name: str) -> ScheduleSpec:
    try:
        return get_spec(name)
    except ValueError as e:
        raise ValueError(f"strategy.pipeline: {e}") from None


def resolve_request(pipeline_strategy, pp_stage: Optional[int] = None,
                    blocks: Optional[list] = None) -> Request:
    """The :class:`~.state.Request` of Paddle's ``Strategy().pipeline`` section, read from its
    fields: the schedule its name looks up (once), the config with the costs
    :func:`~.user_options.use_costs` gave it, else, for ``blocks`` of uneven size per stage
    mesh, :func:`sized_costs`.  A size or option the schedule cannot take is a ``ValueError``
    naming the strategy field."""
    name = str(pipeline_strategy.schedule_mode)
    spec = _spec_named(name)  # the one look-up of the name
    pp, vpp = int(pipeline_strategy.pp_degree), int(pipeline_strategy.vpp_degree)
    sized = None if blocks is None else Placement(spec.placement, pp, vpp)
    attrs = dict(num_micro_batches=int(pipeline_strategy.accumulate_steps),
                 pp_degree=pp, vpp_degree=vpp,
                 split_backward=bool(pipeline_strategy.split_backward), pp_stage=pp_stage,
                 costs=options_of(pipeline_strategy).costs or sized_costs(sized, blocks))
    try:
        config = PipelineConfig.from_attrs(spec, attrs)
    except SizeError as e:
        raise ValueError(said_in_strategy_terms(e)) from None
    except ValueError as e:
        raise ValueError(f"strategy.pipeline: {e}") from None
    return Request(name, spec, config, config.placement, spec.searches)


def _pp_of(pipeline_strategy) -> int:
    """``pp``: the engine's request's, else the section's field (a strategy outside an engine,
    whose schedule name is not needed)."""
    state = state_of(pipeline_strategy)
    return state.request.pp if state is not None else int(pipeline_strategy.pp_degree)


def record_pipe(dist_program, pipeline_strategy) -> Pipe:
    """This process's pipeline (:class:`~pipesplit.job_list.pipe.Pipe`) from the stage meshes of
    the engine's whole distributed program, kept beside the engine's strategy for its pipeline
    pass: stage meshes may have any shape (dp, mp, ... axes), and a peer is the process of the
    neighbouring stage at the same coordinate, never process +- 1.  (The engine-path hook
    keeps it in the engine's :class:`~.state.EngineState`.)"""
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program

    meshes = get_sub_process_mesh_by_program(dist_program)
    pp = _pp_of(pipeline_strategy)
    if len(meshes) != pp:
        raise ValueError(
            f"strategy.pipeline.pp_degree is {pp}, but the model's layers are placed on "
            f"{len(meshes)} stage mesh(es): " + ", ".join(
                f"{list(m.process_ids)} {list(m.dim_names)}" for m in meshes)
            + "; set pp_degree to the number of pipeline stage meshes")
    return pipe_of([m.process_ids for m in meshes], dist.get_rank(), [m.shape for m in meshes])


def sized_costs(placement: Optional[Placement], blocks: Optional[list]) -> Optional[Costs]:
    """Unit job costs scaled per global virtual stage by its share of the ``blocks`` of each
    stage mesh (:func:`~.strategy_checks.block_sizes`; dealt to its chunks on the schedule's
    ``placement``: :meth:`~pipesplit.job_list.placement.Placement.deal_blocks`); None for even
    stages."""
    if blocks is None:
        return None
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
    pp = _pp_of(pipeline_strategy)
    if dist.get_world_size() == pp:  # one process per stage
        return Pipe.single_process_per_stage(pp)
    raise ValueError("pipesplit did not see the engine's stage meshes (call "
                     "pipesplit.passes.strategy.enable_strategy() before dist.to_static)")


def _pp_stage(pipeline_strategy) -> Optional[int]:
    import paddle.distributed as dist

    pp = _pp_of(pipeline_strategy)
    if pp <= 1 or dist.get_world_size() <= 1:
        return None  # one process: emulate every rank
    state = state_of(pipeline_strategy)
    if state is None or state.pipe is None:
        # a whole-model program outside the engine: Paddle's rule (pp the outermost mesh axis)
        from paddle.distributed.auto_parallel.static.utils import get_pp_stage_by_pp_degree
        return get_pp_stage_by_pp_degree(pp)
    return state.pipe.rank_of(dist.get_rank())


def requested_schedule(pipeline_strategy) -> str:
    """The schedule name the user asked for (an engine's, as its state keeps it)."""
    state = state_of(pipeline_strategy)
    return state.requested if state is not None else str(pipeline_strategy.schedule_mode)


def config_from_strategy(pipeline_strategy, pp_stage="auto",
                         blocks: Optional[list] = None) -> PipelineConfig:
    """The :class:`PipelineConfig` for Paddle's ``Strategy().pipeline`` section
    (:func:`resolve_request`).  An engine's section gives its state's config (its
    ``blocks``) with this process's pipeline rank."""
    stage = _pp_stage(pipeline_strategy) if pp_stage == "auto" else pp_stage
    state = state_of(pipeline_strategy)
    if state is not None:
        return state.config.on_rank(stage)
    return resolve_request(pipeline_strategy, stage, blocks).config

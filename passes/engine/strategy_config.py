"""Paddle's ``Strategy().pipeline`` in pipesplit's terms: the :class:`~.state.Request` it makes
(the schedule it names, its :class:`PipelineConfig`, placement and whether it searches), the
costs of stages of uneven size, and this process's pipeline (:class:`Pipe`) and rank from the
stage meshes.  Only translation: nothing here writes to the strategy (what Paddle derives is
filled in when the engine's session is opened: :mod:`.open_state`), and a field the schedule
cannot take is a ``ValueError`` in the strategy's words (the checks that the request serves,
before the engine builds anything, are :mod:`.strategy_checks`; the user's options are
:mod:`.user_options`).

Nothing here looks for an engine's session: an engine's request is resolved once, when its
session is opened, and the session answers from it (:class:`~.session.EngineSession`:
``config_on``, ``pp_stage``; :func:`stage_pipe`, :func:`processes` and :func:`pipeline_rank`
take the request's ``pp``); a section outside an engine (the pass applied directly, a check)
is resolved once too, at its handle (:mod:`.section`).
"""
from __future__ import annotations

from typing import Optional

from pipesplit.job_list.costs import Costs
from pipesplit.job_list.pipe import Pipe, pipe_of
from pipesplit.job_list.placement import SizeError
from pipesplit.job_list.registry import ScheduleSpec, get_spec
from pipesplit.job_list.request import CannotServe, request_schedule
from pipesplit.passes.engine.knobs import (check_memory_limit_times, check_program_runtimes,
                                           memory_limit_times_given, runtimes_given)
from pipesplit.passes.engine.state import Request, options_of

#: a size as the schedules and the pass name it -> its field of ``strategy.pipeline``
_FIELD = {"vpp": "vpp_degree", "pp": "pp_degree", "m": "accumulate_steps",
          "vpp_degree": "vpp_degree", "pp_degree": "pp_degree",
          "num_micro_batches": "accumulate_steps"}


def said_in_strategy_terms(error: SizeError) -> str:
    return error.said_as(f"strategy.pipeline.{_FIELD.get(error.field, error.field)}")


def requested_spec(pipeline_strategy) -> ScheduleSpec:
    """The schedule ``strategy.pipeline.schedule_mode`` names, looked up now (``ValueError``
    naming the field for an unknown name)."""
    return _spec_named(str(pipeline_strategy.schedule_mode))


def _spec_named(name: str) -> ScheduleSpec:
    try:
        return get_spec(name)
    except ValueError as e:
        raise ValueError(f"strategy.pipeline: {e}") from None


def resolve_request(pipeline_strategy, pp_stage: Optional[int] = None,
                    blocks: Optional[list] = None) -> Request:
    """The :class:`~.state.Request` of Paddle's ``Strategy().pipeline`` section, read from its
    fields and resolved by job_list in one call (:func:`~pipesplit.job_list.request.
    request_schedule`: the name looked up once, the config checked, the schedule built, the
    config made on every rank): the costs :func:`~.user_options.use_costs` gave, else those of
    ``program_runtimes``, else, for ``blocks`` of uneven size per stage mesh, sized ones; the
    memory limit of ``memory_limit_times``.  A size or option the schedule cannot take is a
    ``ValueError`` naming the strategy field."""
    name = str(pipeline_strategy.schedule_mode)
    pp, vpp = int(pipeline_strategy.pp_degree), int(pipeline_strategy.vpp_degree)
    attrs = dict(num_micro_batches=int(pipeline_strategy.accumulate_steps), pp_degree=pp,
                 vpp_degree=vpp, split_backward=bool(pipeline_strategy.split_backward),
                 pp_stage=pp_stage, costs=options_of(pipeline_strategy).costs
                 or runtimes_costs(pipeline_strategy, pp * vpp))
    times = (check_memory_limit_times(pipeline_strategy.memory_limit_times)
             if memory_limit_times_given(pipeline_strategy) else None)
    try:
        requested = request_schedule(name, attrs, blocks=blocks, memory_limit_times=times)
    except CannotServe as e:
        said = said_in_strategy_terms(e.cause) if isinstance(e.cause, SizeError) else str(e.cause)
        raise ValueError(f"strategy.pipeline.schedule_mode={e.schedule!r} cannot serve this "
                         f"strategy: {said}") from None
    except SizeError as e:
        raise ValueError(said_in_strategy_terms(e)) from None
    except ValueError as e:
        raise ValueError(f"strategy.pipeline: {e}") from None
    return Request(name, requested, str(pipeline_strategy.vpp_seg_method))


def runtimes_costs(pipeline_strategy, stages: int) -> Optional[Costs]:
    """The job costs of ``strategy.pipeline.program_runtimes`` (Paddle's [forward, backward_b,
    backward_w, loss, communication], its zero-bubble pass's reading) when the user set it:
    the loss's time is the last stage's forward's more, the communication the latency of a
    transfer.  None while it holds Paddle's default."""
    if not runtimes_given(pipeline_strategy):
        return None
    forward, backward_b, backward_w, loss, comm = check_program_runtimes(
        pipeline_strategy.program_runtimes)
    return Costs(forward=[forward] * (stages - 1) + [forward + loss], backward_b=backward_b,
                 backward_w=backward_w, comm=comm)


def stage_pipe(dist_program, pp: int) -> Pipe:
    """This process's pipeline (:class:`~pipesplit.job_list.pipe.Pipe`) from the stage meshes of
    the engine's whole distributed program, for a request of ``pp`` stages: stage meshes may
    have any shape (dp, mp, ... axes), and a peer is the process of the neighbouring stage at
    the same coordinate, never process +- 1.  (The engine's session keeps it at chunk
    completion.)"""
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program

    meshes = get_sub_process_mesh_by_program(dist_program)
    if len(meshes) != pp:
        raise ValueError(
            f"strategy.pipeline.pp_degree is {pp}, but the model's layers are placed on "
            f"{len(meshes)} stage mesh(es): " + ", ".join(
                f"{list(m.process_ids)} {list(m.dim_names)}" for m in meshes)
            + "; set pp_degree to the number of pipeline stage meshes")
    return pipe_of([m.process_ids for m in meshes], dist.get_rank(), [m.shape for m in meshes])


def processes(pp: int, pipe: Optional[Pipe]) -> Pipe:
    """This process's pipeline: ``pipe`` (the one the engine's stage meshes gave), else, with
    no stage meshes seen, one process per stage."""
    import paddle.distributed as dist

    if pipe is not None:
        return pipe
    if dist.get_world_size() == pp:  # one process per stage
        return Pipe.single_process_per_stage(pp)
    raise ValueError("pipesplit did not see the engine's stage meshes (call "
                     "pipesplit.passes.strategy.enable_strategy() before dist.to_static)")


def pipeline_rank(pp: int, pipe: Optional[Pipe]) -> Optional[int]:
    """This process's pipeline rank among ``pp``: None in one process (every rank emulated);
    its place in ``pipe`` (the engine's stage meshes); without one (a whole-model program
    outside the engine), Paddle's rule (pp the outermost mesh axis)."""
    import paddle.distributed as dist

    if pp <= 1 or dist.get_world_size() <= 1:
        return None  # one process: emulate every rank
    if pipe is None:
        from paddle.distributed.auto_parallel.static.utils import get_pp_stage_by_pp_degree
        return get_pp_stage_by_pp_degree(pp)
    return pipe.rank_of(dist.get_rank())

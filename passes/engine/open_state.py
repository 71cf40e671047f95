"""Opening one engine's :class:`~.state.EngineState` (its session's data): the one reading of
the engine's strategy (:func:`open_engine_state`).  It checks the strategy, fills in the fields
Paddle derives itself on the engine's copy (:func:`fill_in_what_paddle_derives`: the one
place pipesplit writes a strategy field, with the value Paddle would give it) and resolves the
request once (:func:`~.strategy_config.resolve_request`); every later moment reads the
session."""
from __future__ import annotations

from pipesplit.passes.engine import knobs
from pipesplit.passes.engine.state import EngineState, options_of
from pipesplit.passes.engine.user_options import measured_step

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
      naming both, by :func:`~.strategy_config.stage_pipe`);
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


def check_and_fill_in(strategy, model, world_size: int) -> None:
    """The opening's checks of ``strategy`` (the whole ``paddle.distributed.Strategy``), in
    their order: the field types, the gradient merge, what Paddle derives filled in (the
    checks after it read ``pp_degree``), the world of ``world_size`` processes, the model."""
    from pipesplit.passes.engine.strategy_checks import (check_fields, check_gradient_merge,
                                                         check_model, check_world)

    pipeline = strategy.pipeline
    check_fields(pipeline)
    check_gradient_merge(strategy)
    fill_in_what_paddle_derives(strategy, model)
    check_world(pipeline, world_size)
    check_model(pipeline, model)


def open_engine_state(engine, make=EngineState) -> EngineState:
    """The engine's opening's one reading of the engine's strategy: the checks
    (:func:`check_and_fill_in`), then the request resolved once, its schedule built and its
    memory budget checked (:func:`~.strategy_checks.checked_request`), into an
    :class:`~.state.EngineState` made by ``make`` (the session's class:
    :meth:`~.session.EngineSession.open`), not yet attached."""
    import paddle
    import paddle.distributed as dist

    from pipesplit.passes.engine.strategy_checks import block_sizes, checked_request
    from pipesplit.passes.engine.surgery import placements_of
    from pipesplit.passes.transport.devices import transport_for

    strategy = engine._strategy
    pipeline = strategy.pipeline
    transport = transport_for("auto")
    check_and_fill_in(strategy, engine._model, dist.get_world_size())
    request = checked_request(pipeline, block_sizes(pipeline, engine._model))
    notices = said_of_the_knobs(strategy, transport.needs_cpu_support, request)
    serve_shared_weights_ourselves(pipeline)
    return make(request=request, options=options_of(pipeline),
                measure_step=measured_step(pipeline, request),
                user_placements=placements_of(engine._model),
                parameter_names=frozenset(p.name for p in engine._model.parameters()),
                scope=paddle.static.global_scope(),
                transport=transport.with_overlap(bool(pipeline.enable_send_recv_overlap)),
                notices=notices, asked_micro_batch_size=pipeline.micro_batch_size,
                return_numpy=bool(strategy.return_numpy),
                fused_passes=bool(getattr(strategy.fused_passes, "fused_passes_list", None)))


def opening_of(strategy, on_cpu: bool, request=None) -> knobs.Opening:
    """The :class:`~.knobs.Opening` of ``strategy`` (the whole ``dist.Strategy``), with its
    ``request`` once the opening resolved it.  Before that (``DistModel``'s hook, ahead of the
    engine's opening) it has none: the schedule is looked up once, at the opening, so what
    needs it (whether a measured step re-plans) is refused there."""
    pipeline = strategy.pipeline
    options = options_of(pipeline)
    return knobs.Opening(strategy=strategy, on_cpu=on_cpu,
                         spec=None if request is None else request.spec,
                         replans=request is not None and request.searches
                         and measured_step(pipeline, request) is not None,
                         costs_given=options.costs is not None,
                         budget_given=options.memory_budget is not None)


def serve_shared_weights_ourselves(pipeline) -> None:
    """``auto_parallel_sync_shared_params`` off on the engine's copy: a weight read on another
    stage is served by pipesplit's own exchange (:mod:`.shared_parameters`), not Paddle's sync
    pass, whose rewrite removes the transfer that exchange builds on (the line said:
    :mod:`.knobs`).  With :func:`fill_in_what_paddle_derives`, the places the opening writes
    the engine's copy."""
    pipeline.auto_parallel_sync_shared_params = False


def said_of_the_knobs(strategy, on_cpu: bool, request) -> tuple:
    """The knobs' refusals (:func:`~.knobs.refuse_what_cannot_work`), then their lines said
    once (:func:`~.knobs.notices_at_the_opening`), of the strategy as the user set it;
    ``request``: the section's, resolved at the opening."""
    opening = opening_of(strategy, on_cpu, request)
    knobs.refuse_what_cannot_work(opening)
    notices = knobs.notices_at_the_opening(opening)
    knobs.say(notices)
    return notices

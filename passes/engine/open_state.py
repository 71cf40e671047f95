"""Opening one engine's :class:`~.state.EngineState` (its session's data): the one reading of
the engine's strategy (:func:`open_engine_state`).  It checks the strategy, fills in the fields
Paddle derives itself on the engine's copy (:func:`fill_in_what_paddle_derives`: the one
place pipesplit writes a strategy field, with the value Paddle would give it) and resolves the
request once (:func:`~.strategy_config.resolve_request`); every later moment reads the
session."""
from __future__ import annotations

from pipesplit.passes.engine.state import EngineState, options_of
from pipesplit.passes.engine.strategy_config import resolve_request
from pipesplit.passes.engine.user_options import check_memory_budget, measured_step

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
      naming both, by :func:`~.strategy_config.record_pipe`);
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


def open_engine_state(engine, make=EngineState) -> EngineState:
    """The engine's opening's one reading of the engine's strategy: the checks (field types,
    the gradient merge, the world, the model, the schedule), with what Paddle derives filled
    in between the field types and the checks that read ``pp_degree``; the request resolved
    once into an :class:`~.state.EngineState` made by ``make`` (the session's class:
    :meth:`~.session.EngineSession.open`), not yet attached."""
    import paddle
    import paddle.distributed as dist

    from pipesplit.passes.engine.strategy_checks import (block_sizes, check_fields,
                                                         check_gradient_merge, check_model,
                                                         check_world, checked_schedule)
    from pipesplit.passes.engine.surgery import placements_of
    from pipesplit.passes.transport.devices import transport_for

    pipeline = engine._strategy.pipeline
    check_fields(pipeline)
    check_gradient_merge(engine._strategy)
    fill_in_what_paddle_derives(engine._strategy, engine._model)
    check_world(pipeline, dist.get_world_size())
    check_model(pipeline, engine._model)
    request = resolve_request(pipeline, None, block_sizes(pipeline, engine._model))
    check_memory_budget(pipeline, request)
    return make(request=request, checked=checked_schedule(request),
                options=options_of(pipeline),
                measure_step=measured_step(pipeline, request),
                user_placements=placements_of(engine._model),
                parameter_names=frozenset(p.name for p in engine._model.parameters()),
                scope=paddle.static.global_scope(), transport=transport_for("auto"))

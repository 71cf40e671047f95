"""What the engine hooks change in the engine's model and programs (the hooks themselves are
in :mod:`pipesplit.passes.engine.hooks`): the user's parameter placements, kept and given
back, and the fetched output of a prediction program."""
from __future__ import annotations

import copy


def placements_of(model) -> dict:
    """The user's (mesh, placements) of each distributed parameter of ``model``."""
    if model is None or not hasattr(model, "parameters"):
        return {}
    return {p.name: _placement_key(p) for p in model.parameters() if p.is_dist()}


def _placement_key(param):
    """A copy (the tensor's own mesh object changes when its data moves; in Paddle 3.0.0 so
    do the placement objects it hands out, and reading one kept from before a move crashes
    the process: each is copied)."""
    mesh = param.process_mesh
    return ((tuple(mesh.shape), tuple(mesh.process_ids), tuple(mesh.dim_names)),
            tuple(str(p) for p in param.placements),
            [copy.deepcopy(p) for p in param.placements])


def restore_user_placements(engine, user_placements: dict) -> None:
    """Give the dygraph parameters back the user's meshes and placements (without data);
    ``user_placements``: what :func:`placements_of` gave when the engine was made.

    Preparing the first mode moves a parameter whose block the schedule's placement puts on
    another mesh (its values live there now, in the scope); tracing the next mode
    (``eval()``, ``predict()``) with the moved parameters would contradict the model's own
    ``dist.reshard`` calls.  The next mode is traced as the user wrote it and placed again."""
    import numpy as np
    import paddle
    from paddle.distributed.auto_parallel.api import dtensor_from_local

    for param in engine._model.parameters():
        user = user_placements.get(param.name)
        if user is None or not param.is_dist() or _placement_key(param)[:2] == user[:2]:
            continue
        (shape, ids, names), _, placements = user
        mesh = paddle.distributed.ProcessMesh(np.array(ids).reshape(shape).tolist(), list(names))
        with paddle.base.dygraph.guard():
            local = list(param.shape)  # the holder's global shape must be the parameter's
            for axis, placement in enumerate(placements):
                if placement.is_shard():
                    local[placement.get_dim()] //= mesh.shape[axis]
            holder = dtensor_from_local(paddle.zeros(local, param.dtype), mesh, placements)
        param.get_tensor()._share_data_with(holder.get_tensor())
        param.get_tensor()._clear()


def name_an_output(program, value) -> str:
    """Make ``value`` of ``program`` a persistable value with a fresh name (one the engine can
    fetch); returns the name."""
    import paddle

    name = paddle.utils.unique_name.generate("prediction")
    with paddle.static.program_guard(program):
        paddle.pir.set_insertion_point_to_block_end(program.global_block())
        paddle._C_ops.set_persistable_value(value, name)
    return name

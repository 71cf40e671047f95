"""Sequence parallel, checked in the engine's distributed program before anything runs
(:func:`check_sequence_parallel`, called at chunk completion): refused, naming it, only where
pipesplit cannot serve it."""
from __future__ import annotations


def _reduce_scatter_axes(op) -> list:
    """The mesh axes over which a ``dist_op.reshard`` turns a partial value into a shard (how
    sequence parallel leaves a row-parallel layer); [] for any other."""
    src, dst = op.operand_source(0).dist_attr(), op.result(0).dist_attr()
    if src is None or dst is None:
        return []
    sharded = {axis for axis in dst.dims_mapping if axis >= 0}
    return sorted(set(src.partial_dims) & sharded)


def _spans_processes(op, axis: int) -> bool:
    """Whether mesh axis ``axis`` holds more than one process on both sides of the reshard:
    only then is partial -> shard a reduce-scatter.  Over an axis of one process the partial
    value is already the whole sum and its one shard the whole value (Paddle's CPU build runs
    it: no collective is needed)."""
    meshes = (op.operand_source(0).dist_attr().process_mesh,
              op.result(0).dist_attr().process_mesh)
    return all(axis < len(mesh.shape) and mesh.shape[axis] > 1 for mesh in meshes)


def check_sequence_parallel(dist_program, vpp_degree: int, cpu_build: bool) -> None:
    """``ValueError`` naming sequence parallel, before anything runs, where pipesplit cannot
    serve it: on a CPU build where it reduce-scatters over a mesh axis of more than one process
    (Paddle 3.3.1 has no CPU kernel for the reduce-scatter, which fails mid-step as
    ``Unimplemented cpu kernel for CReduceScatterOp``; over an axis of one process, mp = 1,
    there is none to run) and with ``vpp_degree`` > 1 whatever the axis (Paddle's chunk
    completion cannot place its reshards: an ``IndexError``, or ``The chunk_id of
    op[pd_op.transpose] is not set`` at mp = 1, and Paddle's own VPP fails on it too).
    Sequence parallel is found by what it does, from the dist attributes: a ``dist.reshard``
    of a partial value to a shard over the same mesh axis."""
    if not cpu_build and vpp_degree < 2:
        return
    for op in dist_program.global_block().ops:
        if op.name() != "dist_op.reshard":
            continue
        axes = _reduce_scatter_axes(op)
        scattered = [axis for axis in axes if _spans_processes(op, axis)]
        if not (cpu_build and scattered) and not (axes and vpp_degree >= 2):
            continue
        mesh = op.result(0).dist_attr().process_mesh
        name = mesh.dim_names[(scattered or axes)[0]]
        what = f"a dist.reshard of a partial value to a shard over mesh dim {name!r}" + \
            (": a reduce-scatter" if scattered else f" of size {mesh.shape[axes[0]]}")
        if cpu_build and scattered:
            why = "a CPU build of Paddle 3.3.1 has no reduce-scatter kernel"
            fix = f"train without sequence parallel (or with mesh dim {name!r} of size 1)"
        else:
            why = f"strategy.pipeline.vpp_degree={vpp_degree}: Paddle's chunk completion " \
                "cannot place its reshards across chunks"
            fix = "train without sequence parallel or with strategy.pipeline.vpp_degree = 1"
        raise ValueError(f"sequence parallel ({what}, on mesh {list(mesh.process_ids)}) cannot "
                         f"be served here: {why}; {fix}")

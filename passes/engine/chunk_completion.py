"""Chunk completion for vpp >= 2, done by the session: every op of the engine's whole
distributed program gets the chunk of the block it belongs to, from the schedule's placement.

Paddle's engine calls ``complete_chunk_id`` on the forward program once its ops have meshes.
After :func:`~.block_placement.assign_placement` the blocks already sit on the meshes of the
placement (looped or V), which is the case Paddle's own completion calls "custom meshes": it
keeps every mesh and only sets chunk ids, then fixes the reshards, partitions and folds.  This
module does the same work with the session's own facts (the request's ``vpp_seg_method`` and
placement, the stage meshes it holds), so nothing asks Paddle which stage a mesh is:

1. :func:`fold_reshards` (Paddle's fold: a reshard of a reshard becomes one);
2. :func:`set_chunk_ids`: the program cut at each block's first op; an op is in the chunk of
   the block whose stretch it is in (ops before the first block in the first block's; the
   chunks of the blocks: ``Placement.stages_of_blocks`` of the blocks each stage mesh holds,
   stage // pp: the counts Paddle deals round robin);
3. :func:`fix_reshards`: each reshard described on the meshes it now joins (:data:`RESHARD_FIXES`,
   one handler per kind of reshard Paddle would choose);
4. Paddle's partition pass, the parameters' dist attributes copied to the startup program,
   and a second fold.
"""
from __future__ import annotations

from typing import Callable, Dict, List


def complete_chunk_ids(dist_program, startup_program, seg_method: str, placement,
                       meshes: list) -> None:
    """Steps 1-4 of the module docstring, in place (``meshes``: the stage meshes, pipeline
    rank r's at index r)."""
    from paddle.distributed.auto_parallel.static.pir_pass import apply_partition_pass

    fold_reshards(dist_program)
    reshards = set_chunk_ids(dist_program, seg_method, block_chunks(
        dist_program.global_block().ops, seg_method, placement, meshes))
    fix_reshards(reshards)
    apply_partition_pass(dist_program)
    copy_parameter_attrs_to_startup(dist_program, startup_program)
    fold_reshards(dist_program)


def fold_reshards(dist_program) -> None:
    from paddle.distributed.auto_parallel.static.pir_pass import ReshardPasses

    ReshardPasses.fold_reshard_pass(dist_program)


def block_chunks(ops, seg_method: str, placement, meshes: list) -> List[int]:
    """The chunk of each block (``seg_method``'s struct names, model order): its virtual
    stage under ``placement`` (:func:`~.block_placement.block_stages`) // pp."""
    from pipesplit.passes.engine.block_placement import block_stages

    return [stage // placement.pp for stage in block_stages(ops, seg_method, placement, meshes)]


def block_starts(ops, seg_method: str) -> List[int]:
    """The index of each block's first op: the first op, after the previous block's start,
    with the next block's struct name (Paddle's cut)."""
    from paddle.distributed.auto_parallel.static.pir_pass import (_extract_seg_method,
                                                                  _get_seg_struct_names)
    names = _get_seg_struct_names(ops, seg_method)
    starts: List[int] = []
    for index, op in enumerate(ops):
        if len(starts) == len(names):
            break
        if _extract_seg_method(op, seg_method) == names[len(starts)]:
            starts.append(index)
    return starts


def set_chunk_ids(dist_program, seg_method: str, chunks: List[int]) -> list:
    """Give every op the chunk of the block whose stretch holds it (:func:`block_starts`;
    the first block's stretch begins at the top); meshes stay as they are.  A local region
    (``dtensor_to_local`` ... ``dtensor_from_local``) goes whole, the ops inside by their
    ``chunk_id`` attribute.  Returns the reshards, whose chunks their fix gives
    (:func:`fix_reshards`)."""
    from paddle.distributed.auto_parallel.static.pir_pass import _set_process_mesh_and_chunk_id

    ops = dist_program.global_block().ops
    starts = block_starts(ops, seg_method)
    if len(starts) != len(chunks):
        raise ValueError(f"strategy.pipeline.vpp_seg_method={seg_method!r}: {len(chunks)} "
                         f"blocks on the stage meshes, {len(starts)} found in program order")
    reshards, block, index = [], 0, 0
    while index < len(ops):
        while block + 1 < len(starts) and starts[block + 1] <= index:
            block += 1
        op, chunk = ops[index], chunks[block]
        index += 1
        if op.name() == "dist_op.reshard":
            reshards.append(op)
            continue
        _set_process_mesh_and_chunk_id(op, _mesh_of(op), chunk)
        if op.name() == "dist_op.dtensor_to_local":
            while ops[index].name() != "dist_op.dtensor_from_local":
                ops[index].set_int_attr("chunk_id", chunk)
                index += 1
            _set_process_mesh_and_chunk_id(ops[index], _mesh_of(ops[index]), chunk)
            index += 1
    return reshards


def _mesh_of(op):
    return op.dist_attr.process_mesh if op.dist_attr is not None else None


# ------------------------------------------------------------------------------ reshards
def _erase(op) -> None:
    """A reshard that changes nothing: its readers read its input."""
    op.result(0).replace_all_uses_with(op.operand_source(0))
    op.erase()


def _on_source_mesh(op, src, dst) -> None:
    """Within one mesh (an n-d mesh's placements): the op and both sides on the mesh its
    input is on now."""
    from paddle.distributed.auto_parallel.static.reshard_funcs.base_reshard_func import (
        copy_dist_attr_with_new_member as with_mesh, copy_op_attr_with_new_member as op_with)

    mesh = op.operand_source(0).dist_attr().process_mesh
    op.dist_attr = op_with(op.dist_attr, new_operands=[with_mesh(src, new_process_mesh=mesh)],
                           new_results=[with_mesh(dst, new_process_mesh=mesh)],
                           new_process_mesh=mesh)


def _onto_result_mesh(op, src, dst) -> None:
    """From a mesh of every stage onto one stage's: the result on the mesh it is on now."""
    from paddle.distributed.auto_parallel.static.reshard_funcs.base_reshard_func import (
        copy_dist_attr_with_new_member as with_mesh, copy_op_attr_with_new_member as op_with)

    mesh = op.result(0).dist_attr().process_mesh
    op.dist_attr = op_with(op.dist_attr, new_results=[with_mesh(dst, new_process_mesh=mesh)])


def _across_meshes(op, src, dst) -> None:
    """Between two stage meshes: each side on its mesh, the op on both meshes' processes."""
    from paddle.distributed.auto_parallel.static.reshard_funcs.base_reshard_func import (
        copy_dist_attr_with_new_member as with_mesh, copy_op_attr_with_new_member as op_with,
        copy_process_mesh_with_new_member)

    src_mesh = op.operand_source(0).dist_attr().process_mesh
    dst_mesh = op.result(0).dist_attr().process_mesh
    both = copy_process_mesh_with_new_member(
        op.dist_attr.process_mesh,
        new_process_ids=src_mesh.process_ids + dst_mesh.process_ids)
    op.dist_attr = op_with(op.dist_attr,
                           new_operands=[with_mesh(src, new_process_mesh=src_mesh)],
                           new_results=[with_mesh(dst, new_process_mesh=dst_mesh)],
                           new_process_mesh=both)


#: the kind of reshard Paddle would choose (its class name) -> how it is described; Paddle
#: 3.0 spells one class ``GlobaleToSubMeshFunction``
RESHARD_FIXES: Dict[str, Callable] = {
    "NdMeshReshardFunction": _on_source_mesh,
    "GlobalToSubMeshFunction": _onto_result_mesh,
    "GlobaleToSubMeshFunction": _onto_result_mesh,
    "NdMeshReshardFunctionCrossMesh": _across_meshes,
    "SameStatusReshardFunction": lambda op, src, dst: _erase(op),
}


def fix_reshards(reshards) -> None:
    """Each reshard described on the meshes it joins now (:data:`RESHARD_FIXES`); one whose
    two sides are equal is erased.  Another kind is a ``ValueError`` naming it."""
    from paddle.distributed.auto_parallel.static.reshard_funcs.base_reshard_func import (
        choose_reshard_func)

    for op in reshards:
        src = op.dist_attr.operand(0).as_tensor_dist_attr()
        dst = op.dist_attr.result(0).as_tensor_dist_attr()
        if src == dst:
            _erase(op)
            continue
        kind = type(choose_reshard_func(src, dst)).__name__
        if kind not in RESHARD_FIXES:
            raise ValueError(f"chunk completion: a reshard between chunks that pipesplit "
                             f"cannot place ({kind}): {op.dist_attr}")
        RESHARD_FIXES[kind](op, src, dst)


def copy_parameter_attrs_to_startup(dist_program, startup_program) -> None:
    """The startup program's parameters get the dist attributes their parameters have now."""
    for op in startup_program.global_block().ops:
        if op.name() == "builtin.set_parameter":
            param = dist_program.get_parameter_value_by_name(op.str_attr("parameter_name"))
            if param.dist_attr():
                op.operand_source(0).update_dist_attr(param.dist_attr())

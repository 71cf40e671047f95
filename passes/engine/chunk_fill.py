"""Chunk ids Paddle's chunk check cannot infer, taken from the data they read.

Paddle's ``check_chunk_id`` gives an op without a chunk id the chunk of its neighbours in
program order (``infer_chunk_id``: the op before and after it, or the two after it).  A
sharded gradient's reshard (sharding stage 2 / 3: ``transpose``, ``reduce_scatter``,
``transpose``) sits before the gradient merge's ``add_``, which has no chunk id yet either: the
second ``transpose`` has neighbours of chunk 0 and none, and the check stops with ``The
chunk_id of op[pd_op.transpose] is not set``.  :func:`fill_chunk_ids` runs Paddle's own rule
first, in Paddle's order, and where it finds nothing gives the op the chunk of the ops whose
results it reads (or, failing those, of the ops that read its results), when they agree.
"""
from __future__ import annotations

from typing import Optional

from pipesplit.ir_utils.regions import inputs_of

#: ops Paddle's check fills by rules of their own (left to it)
_PADDLE_FILLS = ("pd_op.data", "builtin.parameter", "pd_op.full", "pd_op.full_int_array",
                 "dist_op.dtensor_from_local", "dist_op.dtensor_to_local")


def _chunk(op) -> int:
    return -1 if op is None or op.dist_attr is None else op.dist_attr.chunk_id


def _agreed(chunks) -> Optional[int]:
    found = {c for c in chunks if c >= 0}
    return found.pop() if len(found) == 1 else None


def chunk_from_data(op) -> Optional[int]:
    """The one chunk of the ops ``op`` reads from, else of the ops reading it; None when
    they name none or several."""
    sources = [v.get_defining_op() for v in inputs_of(op)]  # captured values too
    chunk = _agreed(_chunk(s) for s in sources if s is not None)
    if chunk is None:
        chunk = _agreed(_chunk(user) for i in range(op.num_results())
                        for user in op.result(i).all_used_ops())
    return chunk


def fill_chunk_ids(dist_program) -> int:
    """Give chunk ids, in Paddle's order and by its rule, to the forward / backward ops that
    have none, falling back to :func:`chunk_from_data` where the rule finds none; returns how
    many ops only the fallback could fill."""
    from paddle.distributed.auto_parallel.static.pir_pass import (
        OpRole, copy_op_attr_with_new_member, dist_skip_op_list, infer_chunk_id)

    ops = dist_program.global_block().ops
    by_data = 0
    for index, op in enumerate(ops):
        if op.op_role not in (int(OpRole.Forward), int(OpRole.Backward)) \
                or op.name() in dist_skip_op_list or op.name() in _PADDLE_FILLS \
                or op.has_attr("chunk_id") or op.dist_attr is None or _chunk(op) != -1:
            continue
        chunk = infer_chunk_id(index, ops)
        if chunk == -1:
            chunk = chunk_from_data(op)
            if chunk is None:
                continue
            by_data += 1
        op.dist_attr = copy_op_attr_with_new_member(op.dist_attr, new_chunk_id=chunk)
    return by_data

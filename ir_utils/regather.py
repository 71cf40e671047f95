"""Sharding stage 3 (ZeRO-3): a weight gathered from its shards for the forward is gathered
again for the backward, instead of being kept from one to the other.

Paddle's stage-3 program gathers each sharded weight (``all_gather``, with ``transpose`` /
``split`` / ``concat`` around it for a shard along another axis) once, in the forward, and the
backward reads that gathered value.  In a pipeline the value then lives from a micro-batch's
forward job to its backward job: with k micro-batches in flight, k whole copies of the stage's
weights, more than stage 1 keeps.  :func:`regather_for_backward` clones each gather, with the
constants it reads, in front of its first backward reader (backward role and that reader's
chunk), and gives the backward readers the clone: the forward's copy dies with its job, as
FSDP's ``reshard_after_forward`` does, for one more all-gather per weight and micro-batch.
"""
from __future__ import annotations

from typing import List

import paddle

from .roles import ROLE_BACKWARD, ROLE_FORWARD
from .gathered import GATHER_OPS, is_gathered_param

#: constants a gather step reads beside the value (the axis of a split or a concat)
_CONSTANTS = ("pd_op.full", "pd_op.full_int_array")


def _gather_of_a_parameter(op) -> bool:
    """A forward all-gather whose input is a parameter (or its transpose)."""
    return op.name() == "pd_op.all_gather" and op.op_role == ROLE_FORWARD \
        and is_gathered_param(op.operand_source(0))


def _segment(gather) -> List:
    """The forward ops that make the whole weight from ``gather``: the gather, the steps before
    it from the parameter, the gather-only steps after it, and the constants they read; in
    program order (by position in the block)."""
    found = {gather.id(): gather}
    stack = [gather]
    value = gather.operand_source(0)
    while value.get_defining_op() is not None \
            and value.get_defining_op().name() in GATHER_OPS:  # (a transpose before it)
        before = value.get_defining_op()
        found[before.id()] = before
        value = before.operand_source(0)
    while stack:
        op = stack.pop()
        for result in op.results():
            for user in result.all_used_ops():
                if user.name() in GATHER_OPS and user.op_role == ROLE_FORWARD \
                        and user.id() not in found:
                    found[user.id()] = user
                    stack.append(user)
    for op in list(found.values()):
        for operand in op.operands_source():
            maker = operand.get_defining_op() if operand.initialized() else None
            if maker is not None and maker.name() in _CONSTANTS:
                found[maker.id()] = maker
    order = {op.id(): i for i, op in enumerate(gather.get_parent_block().ops)}
    return sorted(found.values(), key=lambda op: order[op.id()])


def regather_for_backward(program) -> int:
    """Clone every parameter gather of ``program`` (in place) for its backward readers (see
    the module docstring); returns how many gathers were cloned."""
    block = program.global_block()
    position = {op.id(): i for i, op in enumerate(block.ops)}
    cloned = 0
    for gather in [op for op in block.ops if _gather_of_a_parameter(op)]:
        segment = _segment(gather)
        outputs = [r for op in segment for r in op.results()]
        backward = {user.id(): user for value in outputs for user in value.all_used_ops()
                    if user.op_role == ROLE_BACKWARD}
        if not backward:
            continue
        first = min(backward.values(), key=lambda op: position[op.id()])
        mapping = paddle.pir.IrMapping()
        made = {r for op in segment for r in op.results()}
        for op in segment:  # what the segment reads from outside (the parameter) stays
            for operand in op.operands_source():
                if operand not in made:
                    mapping.add(operand, operand)
        paddle.pir.set_insertion_point(first)
        for op in segment:
            clone = op.clone(mapping, paddle.pir.CloneOptions(False, True, True))
            clone.op_role = ROLE_BACKWARD
            if first.has_attr("chunk_id"):
                clone.set_int_attr("chunk_id", first.chunk_id)
        readers = set(backward.values())
        for value in outputs:
            if any(user.op_role == ROLE_BACKWARD for user in value.all_used_ops()):
                value.replace_grad_users_with(mapping.look_up(value), readers)
        cloned += 1
    paddle.pir.set_insertion_point_to_block_end(block)
    return cloned

"""Weights as the backward split and the stage-3 regather see them: a parameter, or a whole
parameter gathered from its shards (sharding stage 3: an ``all_gather`` of the parameter's dp
shards, with ``transpose`` / ``split`` / ``concat`` around it for a shard along another axis)."""
from __future__ import annotations


def is_param(value) -> bool:
    """A parameter: made by ``builtin.parameter``, or persistable and trainable."""
    if not value.initialized():
        return False
    op = value.get_defining_op()
    if op is not None and op.name() == "builtin.parameter":
        return True
    # (every initialized value has both, results and block arguments alike)
    return bool(value.persistable) and not value.stop_gradient


#: the ops of a sharded parameter's all-gather (sharding stage 3: the whole weight gathered
#: from its dp shards before each use; a shard of another axis than 0 is gathered on axis 0,
#: split and concatenated back, or transposed around the gather)
GATHER_OPS = ("pd_op.all_gather", "pd_op.split_with_num", "builtin.split", "builtin.combine",
              "pd_op.concat", "pd_op.transpose")


def is_gathered_param(value) -> bool:
    """A parameter itself, or a whole parameter gathered from its shards (ZeRO-3): its
    gradient is a parameter gradient (it leaves through the gather's reduce-scatter)."""
    for _ in range(2 * len(GATHER_OPS)):
        if is_param(value):
            return True
        op = value.get_defining_op() if value.initialized() else None
        if op is None or op.name() not in GATHER_OPS or op.num_operands() == 0:
            return False
        value = op.operand_source(0)
    return False

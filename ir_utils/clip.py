"""Gradient clipping on the average of the micro-batch gradients, in an optimizer program that
receives their SUM.

Paddle's gradient-merge pass (which its auto-parallel engine turns on for pipelines) accumulates
the k micro-batch gradients into ``<param>@GRAD@MERGE`` and lets the optimizer clip that sum and
only then scale it by 1/k; the effective threshold is therefore k times too small, and changing
the number of micro-batches changes training.  Unsplit training clips the averaged gradient.
:func:`clip_the_average` makes the clip ops act on the average (scaled back by k, so the 1/k
that follows still gives the average):

* ``ClipGradByGlobalNorm(c)``: ``c / max(||S||, c)`` becomes ``kc / max(||S||, kc)``, which is
  ``c / max(||S / k||, c)``: the clip-norm constant is scaled by k;
* ``ClipGradByNorm`` (``pd_op.clip_by_norm``) and ``ClipGradByValue`` (``pd_op.clip``):
  ``op(S)`` becomes ``k * op(S / k)``.
"""
from __future__ import annotations

from typing import List

import paddle

_WRAPPED = ("pd_op.clip_by_norm", "pd_op.clip")


def _defining(value, name):
    op = value.get_defining_op() if value is not None and value.initialized() else None
    return op if op is not None and op.name() == name else None


def _scaled_after(op, value, factor: float):
    paddle.pir.set_insertion_point_after(op)
    out = paddle._C_ops.scale(value, float(factor), 0.0, True)
    new = out.get_defining_op()
    new.op_role = op.op_role
    return out


def _global_norm_constants(block) -> List[object]:
    """The ``pd_op.full`` clip-norm constants of ClipGradByGlobalNorm's
    ``divide(c, maximum(global_norm, c))``."""
    found = []
    for op in block.ops:
        if op.name() != "pd_op.divide":
            continue
        numerator = _defining(op.operand_source(0), "pd_op.full")
        maximum = _defining(op.operand_source(1), "pd_op.maximum")
        if numerator is None or maximum is None:
            continue
        bound = _defining(maximum.operand_source(1), "pd_op.full")
        if bound is None:
            continue
        found.append((op, maximum, numerator, bound))
    return found


def clip_the_average(program, k: int) -> int:
    """Rewrite (in place) the clip ops of ``program`` (an optimizer program fed with gradient
    SUMS over ``k`` micro-batches) to clip the average; returns how many were rewritten."""
    if k == 1:
        return 0
    block = program.global_block()
    count = 0
    for divide, maximum, numerator, bound in _global_norm_constants(block):
        scaled = {}
        for full in {numerator.id(): numerator, bound.id(): bound}.values():
            scaled[full.id()] = _scaled_after(full, full.result(0), k)
        divide.operand(0).set_source(scaled[numerator.id()])
        maximum.operand(1).set_source(scaled[bound.id()])
        count += 1
    for op in list(block.ops):
        if op.name() not in _WRAPPED:
            continue
        paddle.pir.set_insertion_point(op)
        x = op.operand_source(0)
        shrunk = paddle._C_ops.scale(x, 1.0 / k, 0.0, True)
        shrunk.get_defining_op().op_role = op.op_role
        op.operand(0).set_source(shrunk)
        y = op.result(0)
        grown = _scaled_after(op, y, k)
        y.replace_all_uses_with(grown)
        grown.get_defining_op().operand(0).set_source(y)
        count += 1
    paddle.pir.set_insertion_point_to_block_end(block)
    return count

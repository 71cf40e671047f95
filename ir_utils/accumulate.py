"""Gradient accumulation over micro-batches on a completed PIR program (modified in place).

For every gradient an optimizer-role op reads, a persistable accumulator (a block kwarg named
``{param}@PS_ACC``) is added to right after the grad's producer (same role, chunk and
``pipesplit_backward_w`` flag, so it lands in that backward / backward_w sub-program).  In
``avg`` mode with ``num_micro_batches`` given, the optimizer-role ops read each accumulator
scaled by ``1 / num_micro_batches`` (as Paddle's gradient-merge pass does: no op per
micro-batch beyond the ``add_``; a new value, not ``scale_``: an in-place scale would race with
the reset below, which depends only on the accumulator); without it a persistable counter per (chunk, backward_w)
group (``pipesplit_acc_count_{c}`` or ``..._{c}_w``) counts the contributions (one more op per
backward job), and the optimizer-role ops read ``acc / count``.  In ``sum`` mode they read
``acc``.  At the end of the optimizer section accumulators (and counters) are reset to zero.

The accumulators and counters must exist, zeroed, in the scope before the first step:
``AccumulationInfo.init_scope(scope, place)`` does that.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

import paddle

from .complete import OPTIMIZER_OP_RE
from .roles import ACC_SUFFIX, BACKWARD_W_ATTR, COUNT_PREFIX, ROLE_BACKWARD, ROLE_OPTIMIZE

MODES = ("avg", "sum")


@dataclass
class AccumulationInfo:
    mode: str
    # accumulator / counter name -> (shape, numpy dtype)
    buffers: Dict[str, Tuple[Tuple[int, ...], str]] = field(default_factory=dict)
    # gradient accumulator name -> counter name (avg mode)
    counter_of: Dict[str, str] = field(default_factory=dict)

    def init_scope(self, scope, place=None) -> None:
        """Create every accumulator / counter in ``scope`` filled with zeros."""
        if not isinstance(scope, paddle.base.core._Scope):
            raise TypeError(f"scope must be a paddle.static.Scope, got {type(scope).__name__}")
        place = place if place is not None else paddle.CPUPlace()
        for name, (shape, dtype) in self.buffers.items():
            scope.var(name).get_tensor().set(np.zeros(shape, dtype=dtype), place)


def _is_w(op) -> bool:
    return op.has_attr(BACKWARD_W_ATTR) and bool(op.attrs()[BACKWARD_W_ATTR])


def _tag(value, role, chunk, is_w=False, seen=None):
    """Tag the op defining ``value`` and its untagged operand producers (fresh ``full`` ops)."""
    op = value.get_defining_op()
    if op is None:
        return
    op.op_role = role
    if chunk is not None and chunk >= 0:
        op.set_int_attr("chunk_id", chunk)
    if is_w:
        op.set_bool_attr(BACKWARD_W_ATTR, True)
    for v in op.operands_source():
        d = v.get_defining_op()
        if d is not None and d.op_role < 0:
            _tag(v, role, chunk, is_w)


def _tagged(value, role, chunk, is_w=False):
    _tag(value, role, chunk, is_w)
    return value


class _OpStamps:
    """Makes the accumulation's many alike ops (one ``add_`` / ``scale`` / ``full_`` per
    gradient) by cloning the first one made for the same key with its operands remapped:
    ``Operation.clone`` takes ~2 us, building the op from Python (``paddle._C_ops``) 20-40 us.
    A key must fix everything the clone copies: op, attributes (role, chunk) and result type."""

    def __init__(self):
        self._first: Dict[tuple, Tuple[object, tuple]] = {}
        self._options = paddle.pir.CloneOptions(False, True, True)

    def make(self, key: tuple, operands: tuple, build):
        """The result of ``build(*operands)`` (at the insertion point), or of a clone of the op
        it built for ``key`` before, on ``operands``.  Operands of the first op that are not in
        ``operands`` (``scale``'s factor) are shared by the clones."""
        first = self._first.get(key)
        if first is None:
            out = build(*operands)
            self._first[key] = (out.get_defining_op(), operands)
            return out
        op, first_operands = first
        mapping = paddle.pir.IrMapping()
        for old, new in zip(first_operands, operands):
            mapping.add(old, new)
        for v in op.operands_source():
            if not mapping.has(v):
                mapping.add(v, v)
        return op.clone(mapping, self._options).result(0)


_DTYPES = {"paddle.float32": "float32", "paddle.float64": "float64",
           "paddle.float16": "float16", "paddle.bfloat16": "float32"}


def _place():
    return paddle.framework._current_expected_place()


def add_gradient_accumulation(program, mode: str = "avg",
                              num_micro_batches: Optional[int] = None) -> AccumulationInfo:
    """Insert gradient accumulation into a completed ``program`` (modified in place).
    ``num_micro_batches``: the contributions per step, for ``avg`` without counters."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if num_micro_batches is not None and (not isinstance(num_micro_batches, int)
                                          or isinstance(num_micro_batches, bool)
                                          or num_micro_batches < 1):
        raise ValueError(f"num_micro_batches must be an int >= 1, got {num_micro_batches!r}")
    block = program.global_block()
    opt_ops = [op for op in block.ops if op.op_role == ROLE_OPTIMIZE]
    info = AccumulationInfo(mode=mode)
    if not opt_ops:
        return info
    builder = _Accumulators(block, info, counted=mode == "avg" and num_micro_batches is None)
    for k, (g, producer) in enumerate(_gradients(opt_ops)):
        builder.add(k, g, producer)
    builder.read_before(opt_ops[0], num_micro_batches)
    builder.reset_at_end()
    return info


def _gradients(opt_ops) -> List[Tuple[object, object]]:
    """(gradient, its producer): the values backward ops produce and optimizer ops read, each
    once, in the order the optimizer reads them."""
    grads, seen = [], set()
    for op in opt_ops:
        for v in op.operands_source():
            d = v.get_defining_op()
            if d is None or d.op_role != ROLE_BACKWARD or v.id in seen:
                continue
            seen.add(v.id)
            grads.append((v, d))
    return grads


class _Accumulators:
    """The accumulators (and, counted ``avg``, the per-chunk micro-batch counters) being added
    to one program: added to after each gradient's producer, read by the optimizer, reset
    after it."""

    def __init__(self, block, info: AccumulationInfo, counted: bool):
        self.block, self.info, self.counted = block, info, counted
        self.place = paddle.base.libpaddle.Place()
        self.place.set_place(_place())
        self.counters: Dict[Tuple[int, bool], object] = {}
        self.acc_values = []  # (name, accumulator, gradient, its optimizer users, counter key)
        self.used_names = set()
        self.stamps = _OpStamps()

    def _persistable_kwarg(self, name: str, value_type):
        kwarg = self.block.add_kwarg(name, value_type)
        kwarg.persistable = True
        kwarg.place_attr = self.place
        return kwarg

    def add(self, k: int, g, producer) -> None:
        """Accumulator of gradient ``g`` (the ``k``-th), added to right after ``producer``."""
        param_name = _updated_param_name(g)
        name = f"{param_name}{ACC_SUFFIX}" if param_name else f"pipesplit_grad_{k}{ACC_SUFFIX}"
        if name in self.used_names:  # a shared weight: one accumulator per gradient contribution
            name = f"{name}_{k}"
        self.used_names.add(name)
        chunk = producer.chunk_id if producer.has_attr("chunk_id") else -1
        is_w = _is_w(producer)
        shape = tuple(int(s) for s in g.shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"gradient of {param_name or name} has a dynamic shape {shape}")
        dtype = _DTYPES.get(str(g.dtype), "float32")
        acc = self._persistable_kwarg(name, g.type())
        self.info.buffers[name] = (shape, dtype)
        paddle.pir.set_insertion_point_after(producer)
        out = self.stamps.make(("add_", str(g.type()), chunk, is_w), (acc, g), lambda a, b: _tagged(
            paddle._C_ops.add_(a, b), ROLE_BACKWARD, chunk, is_w))
        opt_users = [u for u in g.all_used_ops() if u.op_role == ROLE_OPTIMIZE]
        if self.counted:
            self._count(g, out.get_defining_op(), chunk, is_w, dtype)
            self.info.counter_of[name] = _counter_name(chunk, is_w)
        self.acc_values.append((name, acc, g, opt_users, (chunk, is_w)))

    def _count(self, g, after, chunk: int, is_w: bool, dtype: str) -> None:
        """The micro-batch counter of (chunk, is_w), added to once per micro-batch after the
        chunk's first accumulation."""
        key = (chunk, is_w)
        if key in self.counters:
            return
        cname = _counter_name(chunk, is_w)
        cnt = self._persistable_kwarg(cname, _scalar_type(g))
        self.info.buffers[cname] = ((1,), dtype)
        paddle.pir.set_insertion_point_after(after)
        one = paddle.full([1], 1.0, dtype=g.dtype)
        inc = paddle._C_ops.add_(cnt, one)
        _tag(inc, ROLE_BACKWARD, chunk, is_w)
        self.counters[key] = cnt

    def read_before(self, first_opt_op, num_micro_batches: Optional[int]) -> None:
        """The optimizer reads each accumulator (divided by its count, or by m, for avg)."""
        for _, acc, g, opt_users, key in self.acc_values:
            paddle.pir.set_insertion_point(first_opt_op)
            if self.counted:
                val = paddle._C_ops.divide(acc, self.counters[key])
                _tag(val, ROLE_OPTIMIZE, None)
            elif self.info.mode == "avg":
                val = self.stamps.make(("scale", str(acc.type())), (acc,), lambda a: _tagged(
                    paddle._C_ops.scale(a, 1.0 / num_micro_batches, 0.0, True), ROLE_OPTIMIZE,
                    None))
            else:
                val = acc
            g.replace_grad_users_with(val, set(opt_users))

    def reset_at_end(self) -> None:
        """After the last optimizer op every accumulator and counter is set back to zero."""
        paddle.pir.set_insertion_point_to_block_end(self.block)
        for name, acc, _, _, _ in self.acc_values:
            shape = list(self.info.buffers[name][0])
            self.stamps.make(("full_", str(acc.type())), (acc,), lambda a: _tagged(
                paddle._C_ops.full_(a, shape, 0.0, a.dtype, _place()), ROLE_OPTIMIZE, None))
        for cnt in self.counters.values():
            z = paddle._C_ops.full_(cnt, [1], 0.0, cnt.dtype, _place())
            _tag(z, ROLE_OPTIMIZE, None)


def _counter_name(chunk: int, is_w: bool) -> str:
    return f"{COUNT_PREFIX}{chunk}" + ("_w" if is_w else "")


def _updated_param_name(grad):
    """Name of the parameter whose update ``grad`` feeds most directly: breadth-first over the
    optimizer-role ops reading it (clipping, regularization, a shared weight's sum) to the first
    parameter update op.  None when there is none."""
    frontier, seen = [grad], {grad.id}
    while frontier:
        nxt = []
        for v in frontier:
            for op in v.all_used_ops():
                if op.op_role != ROLE_OPTIMIZE:
                    continue
                if OPTIMIZER_OP_RE.match(op.name()) and op.num_operands():
                    p = op.operand_source(0)
                    d = p.get_defining_op()
                    if d is not None and d.name() == "builtin.parameter" and p.has_name:
                        return p.name
                for r in op.results():
                    if r.id not in seen:
                        seen.add(r.id)
                        nxt.append(r)
        frontier = nxt
    return None


def _scalar_type(g):
    """A dense tensor type of shape [1] with ``g``'s dtype."""
    prog = paddle.pir.Program()
    with paddle.static.program_guard(prog):
        t = paddle.full([1], 0.0, dtype=g.dtype)
    return t.type()

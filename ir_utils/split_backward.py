"""Split the backward pass of a PIR training program into B (input grads) and W (weight grads).

Zero-bubble schedules run each chunk's backward in two parts: ``backward_b`` computes every
gradient that flows to an earlier chunk (so the previous stage can start its own backward as
early as possible) and ``backward_w`` computes what only leads to parameter gradients, which can
be delayed to fill pipeline bubbles.

``split_backward(program)`` works IN PLACE on a program whose ops already carry ``op_role``
(0 forward, 1 backward, 2 optimizer) and ``chunk_id`` (global virtual stage index); the caller
clones first (``complete_program`` in :mod:`pipesplit.ir_utils.complete` fills roles / chunks).
It does two things:

1. **Decomposition.**  Some grad ops compute an activation gradient and a parameter gradient in
   one kernel.  When one of their outputs is needed by B and another is not, the op is replaced
   by independent ops (same ``chunk_id``, ``op_role`` 1) so the parameter part can go to W:

   * ``pd_op.matmul_grad`` -> one ``pd_op.matmul`` for dX and one for dY, honouring
     ``transpose_x`` / ``transpose_y``.  Batched operands with identical batch dims use batched
     matmuls.  When one operand is a rank-2 matrix broadcast over the other's batch dims (the
     usual ``[-1, seq, hidden] @ [hidden, out]`` of a linear layer, also with a dynamic batch dim)
     its gradient is computed by folding the batch dims with ``reshape(..., [-1, K])`` (what the
     fused kernel does internally) or, when folding is impossible, by a batched matmul followed by
     ``sum`` over the batch dims.  Paddle's own ``_pir_split_matmul_grad_to_matmul`` multiplies
     ``shape[0] * shape[1]`` and therefore breaks on a ``-1`` batch dim; this module never does.
     Other broadcasting patterns (e.g. ``[B,1,M,K] @ [1,H,K,N]``) keep the fused op.
   * ``pd_op.add_grad`` (a bias add, or any add with a broadcast operand) -> the gradient of
     the operand whose shape equals dout is dout itself (no op); a broadcast operand's gradient
     is ``sum`` of dout over the broadcast dims (+ ``reshape`` for kept size-1 dims).
   * ``pd_op.layer_norm_grad`` is NOT decomposed and stays in B when x_grad is needed by B:
     its kernel derives x_grad from the same row statistics it needs for scale/bias grads, and
     Paddle 3.3.1 offers no op that computes only x_grad.  Moving scale/bias grads to W would
     mean recomputing ``x_hat = (x - mean) * rsqrt(var + eps)`` there, i.e. more work and more
     memory than the O(tokens * hidden) reductions it would delay.  Its FLOPs are negligible.
   * ``pd_op.embedding_grad`` only produces a parameter gradient and goes to W as a whole.

   With ``decompose="auto"`` (default) an op is decomposed only when that moves work to W
   (it is in B and at least one of its outputs is not needed by B); ``"all"`` decomposes every
   supported op with two or more used gradient outputs; ``"none"`` decomposes nothing.

2. **Classification.**  A backward op is in B if it is (transitively, inside its chunk)
   needed to compute a value that is consumed by any op outside its chunk (another chunk's
   backward op, a forward op, an op without a chunk, a fetch ...) except optimizer-role ops.
   All other backward ops (they only lead to parameter gradients, gradient accumulation or
   nothing) are W.  Backward ops with ``chunk_id < 0`` are always B (conservative).
   B is closed under same-chunk producers, so B never needs a value produced in W; W may
   need values from B and from forward (see ``SplitReport.b_to_w_values``).

**Marker.**  W ops get the bool attribute ``pipesplit_backward_w = True`` (``W_ATTR``), set with
``op.set_bool_attr``; it is readable via ``op.attrs()`` / ``is_backward_w(op)`` and it
survives ``program.clone()``.  B ops do not carry the attribute (a stale one is erased).

FLOPs: matmul-type ops only (2*M*N*K per matmul, times broadcast batch); a ``-1`` dim counts as
``batch_size``, and a ``-1`` produced by a reshape is resolved from the reshape input's size.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import paddle

from .complete import SINK_OPS
from .gathered import is_gathered_param, is_param
from .roles import BACKWARD_W_ATTR as W_ATTR, ROLE_BACKWARD, ROLE_OPTIMIZE

__all__ = [
    "W_ATTR",
    "SplitReport",
    "split_backward",
    "classify_backward",
    "is_backward_w",
    "op_flops",
]

_DECOMPOSABLE = ("pd_op.matmul_grad", "pd_op.add_grad")
_EMBEDDING_GRADS = ("pd_op.embedding_grad", "pd_op.sparse_weight_embedding_grad")


# --------------------------------------------------------------------------- report


@dataclass
class SplitReport:
    """What ``split_backward`` did.

    decomposed:      op name -> number of ops of that name that were decomposed.
    b_ops / w_ops:   chunk_id -> number of backward ops in B / in W (after decomposition).
    b_flops/w_flops: chunk_id -> matmul FLOPs of the B / W ops (see ``op_flops``).
    b_to_w_values:   chunk_id -> number of values produced by a B op and consumed by a W op of
                     the same chunk (these must be handed over from backward_b to backward_w).
    fwd_to_w_values: chunk_id -> number of non-parameter values produced outside backward
                     (forward / data ops) that W ops read.
    num_param_grads: parameter gradients found in the input program.
    batch_size:      the value a ``-1`` dim was taken as for FLOPs.
    """

    decomposed: Dict[str, int] = field(default_factory=dict)
    b_ops: Dict[int, int] = field(default_factory=dict)
    w_ops: Dict[int, int] = field(default_factory=dict)
    b_flops: Dict[int, int] = field(default_factory=dict)
    w_flops: Dict[int, int] = field(default_factory=dict)
    b_to_w_values: Dict[int, int] = field(default_factory=dict)
    fwd_to_w_values: Dict[int, int] = field(default_factory=dict)
    num_param_grads: int = 0
    batch_size: int = 1

    @property
    def total_backward_flops(self) -> int:
        return sum(self.b_flops.values()) + sum(self.w_flops.values())

    @property
    def w_flops_share(self) -> float:
        """Share of backward matmul FLOPs that are in W (0.0 when there are none)."""
        total = self.total_backward_flops
        return sum(self.w_flops.values()) / total if total else 0.0

    def w_flops_share_of_chunk(self, chunk: int) -> float:
        total = self.b_flops.get(chunk, 0) + self.w_flops.get(chunk, 0)
        return self.w_flops.get(chunk, 0) / total if total else 0.0

    def summary(self) -> str:
        chunks = sorted(set(self.b_ops) | set(self.w_ops))
        lines = [
            f"decomposed: {dict(sorted(self.decomposed.items())) or 'nothing'}",
            f"param grads: {self.num_param_grads}; W share of backward FLOPs: "
            f"{self.w_flops_share:.1%} (batch_size={self.batch_size})",
        ]
        for c in chunks:
            lines.append(
                f"chunk {c}: B {self.b_ops.get(c, 0)} ops / {self.b_flops.get(c, 0)} FLOPs, "
                f"W {self.w_ops.get(c, 0)} ops / {self.w_flops.get(c, 0)} FLOPs, "
                f"B->W values {self.b_to_w_values.get(c, 0)}, fwd->W values "
                f"{self.fwd_to_w_values.get(c, 0)}"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- small helpers


def is_backward_w(op) -> bool:
    """True if ``op`` carries the W mark set by :func:`split_backward`."""
    return bool(op.has_attr(W_ATTR) and op.attrs().get(W_ATTR))


def _vkey(value) -> str:
    # NB: never put pir.Value in a dict / set / ``==``: Value.__eq__ builds a pd_op.equal op,
    # and hash(Value) hashes the (short-lived) Python wrapper.  ``value.id`` is the address
    # of the underlying IR value, stable while the value exists.
    return value.id


def _used(value) -> bool:
    return value.initialized() and not value.use_empty()


def _shape(value) -> Optional[List[int]]:
    """The dims of a dense value; None for an uninitialized one, or a vector / non-dense type,
    whose shape Paddle refuses (``ValueError``: "we can only get shape for dense and select
    rows type")."""
    if not value.initialized():
        return None
    try:
        return list(value.shape)
    except ValueError:
        return None


def _same_dim(a: int, b: int) -> bool:
    return a == b  # -1 == -1 is taken as "the same dynamic dim"


def _dims_equal(a: List[int], b: List[int]) -> bool:
    return len(a) == len(b) and all(_same_dim(x, y) for x, y in zip(a, b))


def _resolved_shape(value, batch_size: int, _depth: int = 0) -> Optional[List[int]]:
    """Static shape with -1 replaced: by ``batch_size``, or, for a reshape output, by the size
    that makes its element count match the reshape's input."""
    shp = _shape(value)
    if shp is None:
        return None
    if -1 not in shp:
        return shp
    op = value.get_defining_op()
    if op is not None and op.name() == "pd_op.reshape" and shp.count(-1) == 1 and _depth < 8:
        src = _resolved_shape(op.operand_source(0), batch_size, _depth + 1)
        known = 1
        for d in shp:
            if d != -1:
                known *= d
        if src is not None and known > 0:
            n = 1
            for d in src:
                n *= d
            return [n // known if d == -1 else d for d in shp]
    return [batch_size if d == -1 else d for d in shp]


def _matmul_flops(xs, ys, tx: bool, ty: bool) -> int:
    if xs is None or ys is None or not xs or not ys:
        return 0
    xs, ys = list(xs), list(ys)
    if len(xs) == 1:
        xs = [1] + xs if not tx else xs + [1]
    if len(ys) == 1:
        ys = ys + [1] if not ty else [1] + ys
    m, k = (xs[-1], xs[-2]) if tx else (xs[-2], xs[-1])
    n = ys[-2] if ty else ys[-1]
    bx, by = xs[:-2], ys[:-2]
    r = max(len(bx), len(by))
    bx, by = [1] * (r - len(bx)) + bx, [1] * (r - len(by)) + by
    batch = 1
    for a, b in zip(bx, by):
        batch *= max(a, b)
    return 2 * batch * m * n * k


def op_flops(op, batch_size: int = 1) -> int:
    """Matmul FLOPs of one op (0 for ops without a matmul): ``matmul`` 2*M*N*K*batch,
    ``matmul_grad`` that per gradient output it actually produces."""
    name = op.name()
    if name not in ("pd_op.matmul", "pd_op.matmul_grad"):
        return 0
    attrs = op.attrs()
    tx, ty = bool(attrs.get("transpose_x", False)), bool(attrs.get("transpose_y", False))
    xs = _resolved_shape(op.operand_source(0), batch_size)
    ys = _resolved_shape(op.operand_source(1), batch_size)
    f = _matmul_flops(xs, ys, tx, ty)
    if name == "pd_op.matmul":
        return f
    return f * sum(1 for r in op.results() if r.initialized())


# --------------------------------------------------------------------------- classification


def _backward_ops(block):
    return [op for op in block.ops if op.op_role == ROLE_BACKWARD]


def classify_backward(program, chunks=None):
    """Return ``(is_b, needed)``: ``is_b`` maps each backward op to True (B) / False (W);
    ``needed`` is the set of ``value.id`` of backward results that B needs (or that leave
    the chunk).  ``chunks``: the chunk ids to split (None: all); the backward of any other
    chunk stays whole, all B.  Pure analysis, the program is not changed."""
    block = program.global_block()
    ops = list(block.ops)
    bwd = [op for op in ops if op.op_role == ROLE_BACKWARD]
    bwd_set = set(bwd)
    is_b = {}
    needed = set()
    for op in reversed(bwd):
        chunk = op.chunk_id
        b = chunk < 0 or (chunks is not None and chunk not in chunks)
        for res in op.results():
            if not _used(res):
                continue
            res_needed = False
            for user in res.all_used_ops():
                if user.name() in SINK_OPS:
                    res_needed = True  # written out by name (e.g. a handoff to another rank)
                elif user in bwd_set and user.chunk_id == chunk and chunk >= 0:
                    # same chunk backward op: needed iff that op is B (already decided,
                    # users come later in the topological order)
                    if is_b.get(user, True):
                        res_needed = True
                elif user.op_role == ROLE_OPTIMIZE:
                    continue
                else:
                    res_needed = True  # leaves the chunk / unknown consumer
            if res_needed:
                needed.add(_vkey(res))
                b = True
        is_b[op] = b
    return is_b, needed


# --------------------------------------------------------------------------- decomposition


class _Emitter:
    """Creates ops right after ``anchor`` (in order), tags them with role 1 and ``chunk``."""

    def __init__(self, block, anchor):
        self.block = block
        self.chunk = anchor.chunk_id
        self.anchor = anchor
        self.last = anchor

    def __call__(self, fn, *args):
        ops_before = list(self.block.ops)
        idx = ops_before.index(self.last)
        n0 = len(ops_before)
        paddle.pir.set_insertion_point_after(self.last)
        with paddle.base.framework.pir_op_role_guard(ROLE_BACKWARD), \
                paddle.base.framework.pir_chunk_id_guard(self.chunk):
            out = fn(*args)
        ops_after = list(self.block.ops)
        new_ops = ops_after[idx + 1: idx + 1 + len(ops_after) - n0]
        for op in new_ops:
            op.op_role = ROLE_BACKWARD
            op.set_int_attr("chunk_id", self.chunk)
        if new_ops:
            self.last = new_ops[-1]
        return out


def _matmul(emit, a, b, ta, tb):
    return emit(paddle._C_ops.matmul, a, b, ta, tb)


def _sum_to(emit, v, axes, keep_shape=None):
    out = emit(paddle._C_ops.sum, v, list(axes), None, False)
    if keep_shape is not None:
        out = emit(paddle._C_ops.reshape, out, list(keep_shape))
    return out


def _matmul_grad_plan(op):
    """Return a builder for (dx, dy) or None if the op cannot be decomposed."""
    x, y, dout = op.operand_source(0), op.operand_source(1), op.operand_source(2)
    attrs = op.attrs()
    tx, ty = bool(attrs.get("transpose_x", False)), bool(attrs.get("transpose_y", False))
    xs, ys, ds = _shape(x), _shape(y), _shape(dout)
    if xs is None or ys is None or ds is None or len(xs) < 2 or len(ys) < 2:
        return None
    bx, by = xs[:-2], ys[:-2]
    if _dims_equal(bx, by):
        mode = "same"
    elif len(ys) == 2:
        mode = "y_bcast"  # y is a matrix broadcast over x's batch dims
    elif len(xs) == 2:
        mode = "x_bcast"
    else:
        return None

    # the matmul_grad formulas per (transpose_x, transpose_y): (a, b, transpose a, transpose b)
    dx_terms = {(False, False): (dout, y, False, True), (False, True): (dout, y, False, False),
                (True, False): (y, dout, False, True), (True, True): (y, dout, True, True)}
    dy_terms = {(False, False): (x, dout, True, False), (False, True): (dout, x, True, False),
                (True, False): (x, dout, False, False), (True, True): (dout, x, True, True)}

    def dx_batched(emit):
        return _matmul(emit, *dx_terms[tx, ty])

    def dy_batched(emit):
        return _matmul(emit, *dy_terms[tx, ty])

    def build_dx(emit):
        v = dx_batched(emit)
        if mode == "x_bcast":
            v = _sum_to(emit, v, range(len(ys) - 2))
        return v

    def build_dy(emit):
        if mode != "y_bcast":
            return dy_batched(emit)
        # fold batch dims: sum_b x_b^T dout_b == fold(x)^T fold(dout) (as the fused kernel does)
        if not tx and xs[-1] != -1 and ds[-1] != -1:
            x2 = emit(paddle._C_ops.reshape, x, [-1, xs[-1]])
            d2 = emit(paddle._C_ops.reshape, dout, [-1, ds[-1]])
            if not ty:
                return _matmul(emit, x2, d2, True, False)
            return _matmul(emit, d2, x2, True, False)
        return _sum_to(emit, dy_batched(emit), range(len(xs) - 2))

    return {0: build_dx, 1: build_dy}


def _add_grad_reduce(operand_shape, dout_shape):
    """(axes, reshape_to) to reduce dout to the operand's shape, or None if ambiguous."""
    s, d = operand_shape, dout_shape
    if s is None or d is None or len(s) > len(d):
        return None
    lead = len(d) - len(s)
    axes = list(range(lead))
    kept_ones = False
    for i, sd in enumerate(s):
        dd = d[lead + i]
        if sd == dd:
            continue
        if sd == 1:
            axes.append(lead + i)
            kept_ones = True
            continue
        return None  # -1 vs static, or mismatching static dims: can't tell statically
    if kept_ones and s.count(-1) > 1:
        return None
    return axes, (s if kept_ones else None)


def _add_grad_plan(op):
    attrs = op.attrs()
    if attrs.get("axis", -1) != -1:
        return None
    dout = op.operand_source(2)
    ds = _shape(dout)
    plan = {}
    for i in (0, 1):
        red = _add_grad_reduce(_shape(op.operand_source(i)), ds)
        if red is None:
            return None
        axes, keep = red

        def build(emit, axes=axes, keep=keep):
            if not axes:
                return dout  # identity gradient: no op needed
            return _sum_to(emit, dout, axes, keep)

        plan[i] = build
    return plan


def _decompose(block, op) -> bool:
    name = op.name()
    plan = _matmul_grad_plan(op) if name == "pd_op.matmul_grad" else _add_grad_plan(op)
    if plan is None:
        return False
    emit = _Emitter(block, op)
    news = {}
    for i in sorted(plan):
        if _used(op.result(i)):
            news[i] = plan[i](emit)
    for i, v in news.items():
        op.result(i).replace_all_uses_with(v)
    op.erase()
    return True


def _decomposition_candidates(block, mode: str, is_b, needed, chunks=None) -> list:
    out = []
    for op in _backward_ops(block):
        if op.name() not in _DECOMPOSABLE or (chunks is not None and op.chunk_id not in chunks):
            continue
        used = [r for r in op.results() if _used(r)]
        if len(used) < 2:
            continue
        if mode == "all" or (is_b.get(op) and op.chunk_id >= 0
                             and any(_vkey(r) not in needed for r in used)):
            out.append(op)
    return out


# --------------------------------------------------------------------------- param grads


def _param_grads(block, bwd_ops) -> int:
    """Number of parameter-gradient values: results of backward ops read by optimizer ops, or
    the (used) grad-op result that corresponds to a parameter operand."""
    found = set()
    for op in bwd_ops:
        res = list(op.results())
        for r in res:
            if _used(r) and any(u.op_role == ROLE_OPTIMIZE for u in r.all_used_ops()):
                found.add(_vkey(r))
        if not op.name().endswith("_grad"):
            continue
        for i, src in enumerate(op.operands_source()):
            if not is_gathered_param(src):
                continue
            if op.name() in _EMBEDDING_GRADS:
                cand = res[0] if res else None
            else:
                cand = res[i] if i < len(res) else None
            if cand is not None and _used(cand) and _shape(cand) == _shape(src):
                found.add(_vkey(cand))
    return len(found)


# --------------------------------------------------------------------------- entry point


def split_backward(program, batch_size: int = 1, decompose: str = "auto",
                   chunks=None) -> SplitReport:
    """Decompose mixed grad ops and mark W ops of ``program`` (modified in place).

    Args:
        program: a PIR program whose ops carry op_role / chunk_id (clone it first).
        batch_size: value used for ``-1`` dims in the FLOPs estimate.
        decompose: ``"auto"`` (only where it moves work to W), ``"all"`` or ``"none"``.
        chunks: chunk ids whose backward is split (None: every chunk); the others keep their
            grad ops as they are, all in B (their backward runs as one job).

    Raises:
        ValueError: no backward ops (op_role 1), no parameter gradients, bad arguments.
    """
    chunks = _check_split_args(batch_size, decompose, chunks)
    block = program.global_block()
    n_pg = _param_grads(block, _require_backward_ops(block))
    if n_pg == 0:
        raise ValueError("split_backward: the program computes no parameter gradients; "
                         "there is nothing to move into backward_w")
    report = SplitReport(num_param_grads=n_pg, batch_size=batch_size)
    report.decomposed = _decompose_mixed_grads(program, decompose, chunks)
    is_b, _ = classify_backward(program, chunks)
    _mark_and_count(_backward_ops(block), is_b, batch_size, report)
    return report


def _check_split_args(batch_size, decompose, chunks):
    """``chunks`` as a frozenset (or None); a ValueError for a bad argument."""
    if decompose not in ("auto", "all", "none"):
        raise ValueError(f"decompose must be 'auto', 'all' or 'none', got {decompose!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if chunks is not None:
        chunks = frozenset(chunks)
        if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in chunks):
            raise ValueError(f"chunks must be chunk ids (ints >= 0), got {sorted(chunks, key=str)}")
    return chunks


def _require_backward_ops(block) -> list:
    bwd = _backward_ops(block)
    if not bwd:
        n_grad = sum(1 for op in block.ops if op.name().endswith("_grad"))
        hint = (f" ({n_grad} '*_grad' ops have another op_role: run complete_program first)"
                if n_grad else "")
        raise ValueError("split_backward: the program has no backward ops (op_role == 1)"
                         + hint)
    return bwd


def _decompose_mixed_grads(program, decompose: str, chunks) -> Dict[str, int]:
    """Decompose the candidate grad ops (at most four rounds: a decomposition can make new
    candidates); per op name, how many were decomposed."""
    block = program.global_block()
    decomposed = Counter()
    with paddle.static.program_guard(program):
        for _ in range(4):
            if decompose == "none":
                break
            is_b, needed = classify_backward(program, chunks)
            cands = _decomposition_candidates(block, decompose, is_b, needed, chunks)
            changed = False
            for op in cands:
                name = op.name()
                if _decompose(block, op):
                    decomposed[name] += 1
                    changed = True
            if not changed or decompose == "all":
                break
    return dict(decomposed)


def _mark_and_count(bwd, is_b, batch_size: int, report: SplitReport) -> None:
    """Set / clear the W marker on every backward op and fill ``report``'s per-chunk counts:
    ops, FLOPs, and the values W reads from B of its chunk and from the forward."""
    b_ops, w_ops = defaultdict(int), defaultdict(int)
    b_fl, w_fl = defaultdict(int), defaultdict(int)
    b_to_w, fwd_to_w = defaultdict(set), defaultdict(set)
    for op in bwd:
        c = op.chunk_id
        f = op_flops(op, batch_size)
        if is_b[op]:
            b_ops[c] += 1
            b_fl[c] += f
            if op.has_attr(W_ATTR):
                op.erase_attr(W_ATTR)
            continue
        w_ops[c] += 1
        w_fl[c] += f
        op.set_bool_attr(W_ATTR, True)
        for src in op.operands_source():
            prod = src.get_defining_op() if src.initialized() else None
            if prod is None:
                continue
            if prod.op_role == ROLE_BACKWARD:
                if is_b.get(prod) and prod.chunk_id == c:
                    b_to_w[c].add(_vkey(src))
            elif not is_param(src):
                fwd_to_w[c].add(_vkey(src))
    chunks = sorted(set(b_ops) | set(w_ops))
    report.b_ops = {c: b_ops[c] for c in chunks}
    report.w_ops = {c: w_ops[c] for c in chunks}
    report.b_flops = {c: b_fl[c] for c in chunks}
    report.w_flops = {c: w_fl[c] for c in chunks}
    report.b_to_w_values = {c: len(b_to_w[c]) for c in chunks}
    report.fwd_to_w_values = {c: len(fwd_to_w[c]) for c in chunks}

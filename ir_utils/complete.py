"""Complete op roles (0 forward, 1 backward, 2 optimize) and chunk ids on a PIR program.

``complete_program`` modifies the program it is given: callers pass a clone.
"""
from __future__ import annotations

import re
from typing import Dict, List

from .regions import inputs_of, pushing_op, reads_a_stack, users_in
from .roles import ROLE_BACKWARD, ROLE_FORWARD, ROLE_OPTIMIZE


OPTIMIZER_OP_RE = re.compile(
    r"^pd_op\.(sgd|adam|adamw|momentum|lamb|rmsprop|adagrad|adadelta|adamax|lars_momentum|"
    r"merged_adam|merged_momentum|fused_adam|nadam|radam|asgd|dgc_momentum)_?$")
GRAD_OP_RE = re.compile(r"^pd_op\.(\w+?)_grad_?$")
# ops that produce a value from nothing and have no side effect: they may be re-created in
# every sub-program that needs them instead of being handed over
SOURCE_OPS = frozenset({"builtin.parameter", "pd_op.data", "pd_op.full", "pd_op.full_int_array",
                        "builtin.constant", "pd_op.assign_value", "pd_op.assign_value_"})
SINK_OPS = frozenset({"builtin.shadow_output", "pd_op.fetch"})
# ops reading only the shape / dtype of their input (the backward's seed ``full_like(loss)``)
SHAPE_ONLY_USERS = frozenset({"pd_op.full_like"})
# ops that only unpack a multi-output grad op's result: they stay with their producer
UNPACK_OPS = frozenset({"builtin.split", "builtin.slice"})


def is_source_op(op) -> bool:
    return op.name() in SOURCE_OPS and op.num_operands() == 0


def is_grad_op(op) -> bool:
    """A grad op: ``*_grad``, or the backward of a control-flow op (it reads the forward's
    stack)."""
    return GRAD_OP_RE.match(op.name()) is not None or reads_a_stack(op)


def _users(op, idx):
    """The ops of the block (``idx``) that read ``op``'s results (a control-flow op for a use
    inside its regions)."""
    out = []
    for r in op.results():
        out.extend(users_in(r, idx))
    return out


def _producers(op):
    """The ops defining ``op``'s inputs (a control-flow op's captured values included)."""
    out = []
    for v in inputs_of(op):
        d = v.get_defining_op()
        if d is not None:
            out.append(d)
    return out


def _feeds_grad_op(ops, idx) -> List[bool]:
    """Per op: does some grad op (transitively) read what it produces?"""
    is_grad = [is_grad_op(op) for op in ops]
    feeds = [False] * len(ops)
    for i in range(len(ops) - 1, -1, -1):
        for u in _users(ops[i], idx):
            j = idx.get(u)
            if j is not None and (is_grad[j] or feeds[j]):
                feeds[i] = True
                break
    return feeds


def _describe(op) -> str:
    return f"{op.name()}(id={op.id()})"


def _complete_roles(ops, idx) -> None:
    role: Dict[int, int] = {}
    for i, op in enumerate(ops):
        r = op.op_role
        if r is not None and r >= 0:
            role[i] = r
    if len(role) == len(ops):
        return
    names = [op.name() for op in ops]  # read once: each name() call crosses into C++
    source = [n in SOURCE_OPS and op.num_operands() == 0 for op, n in zip(ops, names)]
    # 1. seed: optimizer updates and grad ops
    for i, name in enumerate(names):
        if i in role:
            continue
        if OPTIMIZER_OP_RE.match(name):
            role[i] = ROLE_OPTIMIZE
        elif is_grad_op(ops[i]):
            role[i] = ROLE_BACKWARD
    # 1b. everything before the backward section is forward: without this, a loss nothing
    #     fetches (no shadow_output) would be read only by grad ops, and step 3 would pull the
    #     whole forward into the backward
    #     (source ops keep the role of their users: they are re-created where used)
    for i in range(_backward_section_start(ops, role, idx)):
        if not source[i]:
            role.setdefault(i, ROLE_FORWARD)
    # 2. descendants of optimizer ops are optimizer.  A descendant of backward ops is backward
    # only while a grad op still depends on it; past the last grad op the values are the
    # parameter gradients, and what reads them (gradient clipping, regularization, the sum of
    # a shared weight's gradient contributions) is the optimizer's: it must run once, on the
    # gradients accumulated over all micro-batches, not inside every micro-batch's backward.
    feeds_grad = _feeds_grad_op(ops, idx)
    for i, op in enumerate(ops):
        if i in role or names[i] in SINK_OPS:
            continue
        prods = _producers(op)
        rs = {role.get(idx[p]) for p in prods}
        if ROLE_OPTIMIZE in rs:
            role[i] = ROLE_OPTIMIZE
        elif ROLE_BACKWARD in rs:
            unpacks_backward = names[i] in UNPACK_OPS and all(
                role.get(idx[p]) == ROLE_BACKWARD for p in prods)
            role[i] = ROLE_BACKWARD if feeds_grad[i] or unpacks_backward else ROLE_OPTIMIZE
    # 3. ops feeding only later roles take the earliest role of their users (reverse order)
    for i in range(len(ops) - 1, -1, -1):
        if i in role or names[i] in SINK_OPS:
            continue
        users = _users(ops[i], idx)
        if not users:
            continue
        if not source[i] and all(u.name() in SHAPE_ONLY_USERS for u in users):
            # e.g. the loss when nothing fetches it in the program: the grad seed
            # (full_like) reads its shape only, which does not make it backward work
            role[i] = ROLE_FORWARD
            continue
        urs = [role.get(idx[u]) for u in users]
        if any(r is None for r in urs):
            # a user is unplaced (only sinks can be); treat as forward consumer
            urs = [ROLE_FORWARD if r is None else r for r in urs]
        role[i] = min(urs)
    # 4. sinks and dead ops: role of their producer, else by position
    grad_pos = [i for i in range(len(ops)) if role.get(i) == ROLE_BACKWARD]
    opt_pos = [i for i in range(len(ops)) if role.get(i) == ROLE_OPTIMIZE]
    first_b = min(grad_pos) if grad_pos else len(ops)
    first_o = min(opt_pos) if opt_pos else len(ops)
    for i, op in enumerate(ops):
        if i in role:
            continue
        prods = [role[idx[p]] for p in _producers(op) if idx[p] in role]
        if prods:
            role[i] = max(prods) if names[i] not in SINK_OPS else prods[0]
        else:
            role[i] = ROLE_FORWARD if i < first_b else (ROLE_BACKWARD if i < first_o else ROLE_OPTIMIZE)
    for i, op in enumerate(ops):
        op.op_role = role[i]


# ops Paddle's append_backward creates before the first grad op: the seed gradient (ones)
BACKWARD_SEED_OPS = frozenset({"pd_op.full", "pd_op.full_like", "pd_op.fill_any_like",
                               "pd_op.full_with_tensor"})


def _backward_section_start(ops, role, idx) -> int:
    """Index of the first op of the backward section: the first grad op, or the seed-gradient
    ops right before it (read only by grad ops).  ``len(ops)`` without grad ops."""
    start = next((i for i, op in enumerate(ops) if role.get(i) == ROLE_BACKWARD), len(ops))
    while start > 0:
        op = ops[start - 1]
        users = _users(op, idx)
        if op.name() not in BACKWARD_SEED_OPS or not users or \
                any(role.get(idx.get(u)) != ROLE_BACKWARD for u in users):
            break
        start -= 1
    return start


def _match_forward_op(op, chunk, idx):
    """The forward op a grad op belongs to: a producer or user of a forward value the grad op
    reads, with the grad op's base name, sharing the most values with it; for the backward of
    a control-flow op, the forward one that pushed what it pops."""
    if reads_a_stack(op):
        return pushing_op(op, idx)
    m = GRAD_OP_RE.match(op.name())
    if not m:
        return None
    base = {f"pd_op.{m.group(1)}", f"pd_op.{m.group(1)}_"}
    operand_ids = set()
    cands = {}
    for v in op.operands_source():
        if v is None or not v.initialized():
            continue
        operand_ids.add(v.id)
        d = v.get_defining_op()
        if d is not None and d.op_role == ROLE_FORWARD:
            if d.name() in base:
                cands[idx[d]] = d
            for u in v.all_used_ops():
                if u.op_role == ROLE_FORWARD and u.name() in base:
                    cands[idx[u]] = u
    best, best_score = None, -1
    for _, c in sorted(cands.items()):
        if chunk.get(idx[c], -1) < 0:
            continue
        vals = [v.id for v in c.operands_source() if v is not None and v.initialized()]
        vals += [r.id for r in c.results()]
        score = sum(1 for v in vals if v in operand_ids)
        if score > best_score:
            best, best_score = c, score
    return best


def _complete_chunks(ops, idx) -> None:
    chunk: Dict[int, int] = {}
    for op in ops:
        c = op.chunk_id if op.has_attr("chunk_id") else -1
        if c is not None and c >= 0:
            chunk[idx[op]] = c
    roles = [op.op_role for op in ops]  # read once (set by _complete_roles)
    # grad ops take their forward op's chunk
    for i, op in enumerate(ops):
        if i in chunk or roles[i] != ROLE_BACKWARD:
            continue
        f = _match_forward_op(op, chunk, idx)
        if f is not None and idx[f] in chunk:  # (a control-flow op may be placed later)
            chunk[i] = chunk[idx[f]]
    # data-flow inference to a fixpoint over the ops still unplaced (forward and backward
    # sweeps); optimizer ops only copy their parameter's chunk, so they go once, at the end
    pending = [op for i, op in enumerate(ops) if i not in chunk and roles[i] != ROLE_OPTIMIZE]
    while pending:
        placed = False
        for op in pending + pending[::-1]:
            i = idx[op]
            if i in chunk:
                continue
            c = _infer_chunk(op, chunk, idx)
            if c is not None:
                chunk[i] = c
                placed = True
        if not placed:
            break
        pending = [op for op in pending if idx[op] not in chunk]
    for i, op in enumerate(ops):
        if i not in chunk and roles[i] == ROLE_OPTIMIZE:
            c = _infer_chunk(op, chunk, idx)
            if c is not None:
                chunk[i] = c
    missing = [op for i, op in enumerate(ops)
               if i not in chunk and roles[i] in (ROLE_FORWARD, ROLE_BACKWARD)]
    if missing:
        raise ValueError("cannot infer a chunk id for ops: "
                         + ", ".join(_describe(op) for op in missing[:50])
                         + (f" ... ({len(missing)} in all)" if len(missing) > 50 else ""))
    _keep_vectors_with_their_user(ops, idx, chunk)
    for i, op in enumerate(ops):
        if i in chunk:
            op.set_int_attr("chunk_id", chunk[i])


def _keep_vectors_with_their_user(ops, idx, chunk) -> None:
    """A ``builtin.combine`` makes a vector value, which cannot be handed over between
    sub-programs: it goes with the op that reads it (e.g. the ``add_n`` summing the gradient
    contributions of a value that two chunks on one rank read, the V placement's turn)."""
    for op in ops:
        if op.name() != "builtin.combine":
            continue
        users = [u for u in _users(op, idx) if idx.get(u) in chunk]
        if users:
            chunk[idx[op]] = chunk[idx[users[0]]]


def _infer_chunk(op, chunk, idx):
    role = op.op_role
    name = op.name()
    if role == ROLE_OPTIMIZE and name not in SINK_OPS:
        return _updated_param_chunk(op, chunk, idx)
    prods = [p for p in _producers(op) if idx.get(p) is not None]
    users = [u for u in _users(op, idx) if idx.get(u) is not None]

    def cs(lst, want_role=None):
        return [chunk[idx[o]] for o in lst
                if idx[o] in chunk and (want_role is None or o.op_role == want_role)
                and not is_source_op(o)]

    if name in SINK_OPS:
        pc = [chunk[idx[p]] for p in prods if idx[p] in chunk]
        return pc[0] if pc else None
    if role == ROLE_BACKWARD and reads_a_stack(op):
        # the backward of a control-flow op runs with its forward, once that is placed
        f = pushing_op(op, idx)
        if f is not None:
            return chunk.get(idx[f])
    if role == ROLE_FORWARD:
        pc = cs(prods, ROLE_FORWARD)
        if pc:
            return max(pc)
        uc = cs(users)
        return min(uc) if uc else None
    if role == ROLE_BACKWARD:
        pc = cs(prods, ROLE_BACKWARD)
        if pc:
            return min(pc)
        uc = cs(users, ROLE_BACKWARD)
        if uc:
            return max(uc)
        pc = cs(prods, ROLE_FORWARD)
        if pc:
            return max(pc)
        uc = cs(users)
        return max(uc) if uc else None
    return None


def _updated_param_chunk(op, chunk, idx):
    """An optimizer-role op's chunk: that of the parameter it reads, when that is known;
    otherwise none is needed."""
    for v in inputs_of(op):
        d = v.get_defining_op()
        if d is not None and d.name() == "builtin.parameter" and idx[d] in chunk:
            return chunk[idx[d]]
    return None


def has_backward(program) -> bool:
    """Does ``program`` train (grad ops or backward-role ops), or only evaluate?"""
    return any(is_grad_op(op) or op.op_role == ROLE_BACKWARD
               for op in program.global_block().ops)


def complete_program(program):
    """Give every op of ``program`` (modified in place: pass a clone) an op_role and, for
    forward / backward ops, a chunk id.  A control-flow op is one op: its role and chunk are
    those of the op as a whole (ops inside its regions run where it runs).  Raises
    ``ValueError`` for ops it cannot place."""
    block = program.global_block()
    ops = list(block.ops)
    if not ops:
        raise ValueError("program has no ops")
    idx = {op: i for i, op in enumerate(ops)}
    has_chunk = any(op.has_attr("chunk_id") and op.chunk_id >= 0 for op in ops)
    if not has_chunk:
        raise ValueError("program has no chunk ids: tag the layers with pir_chunk_id_guard")
    _complete_roles(ops, idx)
    _complete_chunks(ops, idx)
    return program


def check_program(program, num_chunks: int) -> None:
    """Raise ``ValueError`` unless every forward/backward op has a chunk id in
    ``[0, num_chunks)`` and every chunk is used."""
    if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1:
        raise ValueError(f"num_chunks must be an int >= 1, got {num_chunks!r}")
    ops = list(program.global_block().ops)
    if not ops:
        raise ValueError("program has no ops")
    roles = [op.op_role for op in ops]
    if all(r is None or r < 0 for r in roles):
        raise ValueError("program has no op roles (run complete_program first)")
    unroled = [op for op, r in zip(ops, roles) if r is None or r < 0]
    if unroled:
        raise ValueError("ops without op_role: " + ", ".join(_describe(o) for o in unroled[:20]))
    chunks = set()
    unchunked, outside = [], []
    for op, r in zip(ops, roles):
        if r in (ROLE_FORWARD, ROLE_BACKWARD):
            c = op.chunk_id if op.has_attr("chunk_id") else -1
            if c is None or c < 0:
                unchunked.append(op)
            else:
                chunks.add(c)
                if c >= num_chunks:
                    outside.append(op)
    if not chunks and not unchunked:
        raise ValueError("program has no chunk ids")
    if unchunked:
        raise ValueError(f"{len(unchunked)} forward / backward ops have no chunk id (run "
                         f"complete_program first): {_few(unchunked)}")
    if outside or chunks != set(range(num_chunks)):
        raise ValueError(f"num_chunks={num_chunks}, but the program's chunk ids are "
                         f"{sorted(chunks)}; they must be 0 .. {num_chunks - 1}, each used")


def _few(ops, limit: int = 5) -> str:
    shown = ", ".join(_describe(op) for op in ops[:limit])
    return shown + (f" ... ({len(ops)} in all)" if len(ops) > limit else "")

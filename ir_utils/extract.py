"""Split one completed PIR training program into per-(kind, chunk) sub-programs.

One pass over the ops: each op is cloned (``op.clone(ir_mapping)``) into the sub-program of its
job type, so the cost is linear in the program size.  Source ops (parameters, data, full ...)
are re-created in every sub-program that reads them.  Any other value read in a sub-program
other than its producer's becomes a named handoff: a ``builtin.shadow_output`` right after the
producer and a block kwarg of the same name in each consumer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import paddle

from .accumulate import BACKWARD_W_ATTR, AccumulationInfo, add_gradient_accumulation
from .checks import check_stage_flow
from .complete import BACKWARD, FORWARD, OPTIMIZE, SINK_OPS, SOURCE_OPS, check_program, \
    complete_program

COMM_KINDS = ("send_forward", "recv_forward", "send_backward", "recv_backward")
HANDOFF_PREFIX = "pipesplit_handoff_"


@dataclass
class Handoff:
    name: str
    producer: str            # job type that writes it
    consumers: Tuple[str, ...]  # job types that read it


@dataclass
class SplitProgram:
    programs: Dict[str, "paddle.pir.Program"]
    num_chunks: int
    split_backward: bool
    handoffs: Dict[str, Handoff] = field(default_factory=dict)
    # non-persistable variable names each job type reads or writes (for skip-gc)
    required_vars: Dict[str, FrozenSet[str]] = field(default_factory=dict)
    # fetch column -> (job type holding the fetch op, fetched name)
    fetches: List[Tuple[str, str]] = field(default_factory=list)
    accumulation: Optional[AccumulationInfo] = None

    @property
    def job_types(self) -> List[str]:
        return list(self.programs)

    def fetch_job(self, name: str) -> str:
        for job, n in self.fetches:
            if n == name:
                return job
        raise KeyError(name)

    def init_scope(self, scope, place=None) -> None:
        """Zero the gradient accumulators in ``scope`` (call once after the startup program)."""
        if self.accumulation is not None:
            self.accumulation.init_scope(scope, place)

    def handoff_names(self, job_type: str) -> FrozenSet[str]:
        return frozenset(h.name for h in self.handoffs.values()
                         if h.producer == job_type or job_type in h.consumers)


def split_chunks(num_chunks: int, split_backward) -> FrozenSet[int]:
    """The chunks whose backward is split: ``split_backward`` True (all), False (none) or the
    chunk ids themselves."""
    if isinstance(split_backward, bool):
        return frozenset(range(num_chunks)) if split_backward else frozenset()
    chunks = frozenset(split_backward)
    if any(not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < num_chunks
           for c in chunks):
        raise ValueError(f"split_backward must be a bool or chunk ids in [0, {num_chunks}), "
                         f"got {sorted(chunks, key=str)}")
    return chunks


def job_types_for(num_chunks: int, split_backward) -> List[str]:
    """Job types of the sub-programs; ``split_backward`` as :func:`split_chunks` takes it."""
    split = split_chunks(num_chunks, split_backward)
    types = []
    for c in range(num_chunks):
        kinds = ["forward"] + (["backward_b", "backward_w"] if c in split else ["backward"])
        types += [f"{k}{c}" for k in kinds + list(COMM_KINDS)]
    return types + ["optimizer"]


def _job_of(op, split_backward) -> str:
    """Job type of ``op``; ``split_backward``: the set of split chunks."""
    role = op.op_role
    if role == OPTIMIZE:
        return "optimizer"
    c = op.chunk_id
    if role == FORWARD:
        return f"forward{c}"
    if role == BACKWARD:
        if c not in split_backward:
            return f"backward{c}"
        w = op.has_attr(BACKWARD_W_ATTR) and bool(op.attrs()[BACKWARD_W_ATTR])
        return f"backward_w{c}" if w else f"backward_b{c}"
    raise ValueError(f"op {op.name()} has op_role {role}")


def _one_value_mapping(old, new):
    mapping = paddle.pir.IrMapping()
    mapping.add(old, new)
    return mapping


def _check_int(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def split_program(program, num_chunks: int, split_backward=False,
                  accumulate: Optional[str] = "avg",
                  fetch_names: Optional[Sequence[str]] = None,
                  completed: bool = False,
                  num_micro_batches: Optional[int] = None) -> SplitProgram:
    """Split ``program`` (never modified) into forward{c}, backward{c} (or backward_b{c} /
    backward_w{c}), empty send/recv{c} and optimizer sub-programs.

    split_backward: True (every chunk gets backward_b / backward_w), False (backward) or the
    set of chunk ids that are split (the others get one backward sub-program).

    accumulate: "avg" (default), "sum" or None (no gradient accumulation).
    fetch_names: names of forward values (``set_persistable_value`` / shadow_output names) to
    fetch per micro-batch; default: every shadow_output name written by a forward op.
    completed: ``program`` is the caller's private clone, already through ``complete_program``;
    it is used (and gets the accumulators) as it is, saving a second copy and completion.
    num_micro_batches: micro-batches per step; with it "avg" scales the accumulated gradients by
    1/num_micro_batches in the optimizer instead of counting contributions per micro-batch.
    """
    _check_int("num_chunks", num_chunks)
    split_chunks(num_chunks, split_backward)  # a bad value is refused before any work
    work = program if completed else program.clone()
    if not completed:
        complete_program(work)
    check_program(work, num_chunks)
    check_stage_flow(work)
    info = add_gradient_accumulation(work, accumulate, num_micro_batches) if accumulate else None
    split = _distribute(work, num_chunks, split_backward, fetch_names)
    split.accumulation = info
    return split


def _distribute(work, num_chunks, split_backward, fetch_names) -> SplitProgram:
    block = work.global_block()
    ops = list(block.ops)  # keeps the op wrappers alive: they key the dicts below
    names = [op.name() for op in ops]
    source_ops = {op for op, name in zip(ops, names)
                  if name in SOURCE_OPS and op.num_operands() == 0}  # as is_source_op
    data_ops = {op for op, name in zip(ops, names) if name == "pd_op.data"}
    types = job_types_for(num_chunks, split_backward)
    split_set = split_chunks(num_chunks, split_backward)
    programs = {t: paddle.pir.Program() for t in types}
    blocks = {t: p.global_block() for t, p in programs.items()}
    mappings = {t: paddle.pir.IrMapping() for t in types}
    kwarg_made: Dict[str, set] = {t: set() for t in types}
    place = paddle.base.libpaddle.Place()
    place.set_place(paddle.framework._current_expected_place())
    opts = paddle.pir.CloneOptions(False, True, True)

    # shadow_output names already present in the program, per value id
    shadow_name: Dict[int, str] = {}
    for op, op_name in zip(ops, names):
        if op_name == "builtin.shadow_output":
            shadow_name.setdefault(op.operand_source(0).id, op.str_attr("output_name"))

    producer_job: Dict[int, str] = {}   # value id -> job type of its producer
    producer_op: Dict[int, Tuple[object, int, int]] = {}  # value id -> (op, op index, result)
    handoffs: Dict[int, Handoff] = {}
    required: Dict[str, set] = {t: set() for t in types}
    persist_names = set()

    def ensure_operand(t, v):
        """Map ``v`` into job ``t``'s program; ops it needs go to the insertion point (the end
        of that program's block, where the reading op follows)."""
        if not v.initialized():
            return  # an absent optional operand
        m = mappings[t]
        if m.has(v):
            return
        d = v.get_defining_op()
        if d is None:  # a block argument / kwarg of the source program
            name = v.name
            if name not in kwarg_made[t]:
                kw = blocks[t].add_kwarg(name, v.type())
                kw.persistable = v.persistable
                kw.place_attr = place
                kwarg_made[t].add(name)
                if not v.persistable:
                    required[t].add(name)
                else:
                    persist_names.add(name)
                m.add(v, kw)
            return
        if d in source_ops:
            d.clone(m, opts)
            if d in data_ops and not v.persistable:
                required[t].add(v.name)
            return
        vid = v.id
        src = producer_job[vid]
        h = handoffs.get(vid)
        if h is None:
            name = shadow_name.get(vid)
            if name is None:
                _, oi, ri = producer_op[vid]
                name = f"{HANDOFF_PREFIX}{oi}_{ri}"
            h = handoffs[vid] = Handoff(name, src, ())
        if t not in h.consumers:
            h.consumers = h.consumers + (t,)
        kw = blocks[t].add_kwarg(h.name, v.type())
        kw.persistable = False
        kw.place_attr = place
        m.add(v, kw)
        required[t].add(h.name)
        required[src].add(h.name)

    for oi, (op, op_name) in enumerate(zip(ops, names)):
        if op in source_ops:
            continue  # re-created lazily in each consumer
        if op_name in SINK_OPS:
            v = op.operand_source(0)
            d = v.get_defining_op()
            if d is None or d in source_ops:
                t = _job_of(op, split_set)
            else:
                t = producer_job[v.id]
        else:
            t = _job_of(op, split_set)
        if t not in programs:
            raise ValueError(f"op {op.name()} belongs to job {t!r}, which is not one of the "
                             f"{num_chunks}-chunk job types")
        paddle.pir.set_insertion_point_to_block_end(blocks[t])
        for v in op.operands_source():
            ensure_operand(t, v)
        op.clone(mappings[t], opts)
        if op_name == "builtin.shadow_output":
            name = op.str_attr("output_name")
            if not op.operand_source(0).persistable:
                required[t].add(name)
        for ri, r in enumerate(op.results()):
            rid = r.id
            producer_job[rid] = t
            producer_op[rid] = (op, oi, ri)

    # producer side of the handoffs: shadow_output right after the producer's clone (all alike
    # but for the name: clones of the first, ~2 us each, instead of ~20 us from Python)
    first_handoff_write = None
    for vid, h in handoffs.items():
        op, oi, ri = producer_op[vid]
        v = op.result(ri)
        if vid in shadow_name:
            continue  # the program's own shadow_output (cloned with the producer) writes it
        m = mappings[h.producer]
        new_v = m.look_up(v)
        paddle.pir.set_insertion_point_after(new_v.get_defining_op())
        if first_handoff_write is None:
            paddle._C_ops.set_persistable_value(new_v, h.name)
            first_handoff_write = next(
                u for u in new_v.all_used_ops() if u.name() == "builtin.shadow_output"
                and u.str_attr("output_name") == h.name)
        else:
            first_handoff_write.clone(
                _one_value_mapping(first_handoff_write.operand_source(0), new_v), opts
            ).set_str_attr("output_name", h.name)

    # fetches
    fetches: List[Tuple[str, str]] = []
    if fetch_names is None:
        fetch_names = []
        for op, op_name in zip(ops, names):
            if op_name == "builtin.shadow_output" and op.op_role == FORWARD:
                fetch_names.append(op.str_attr("output_name"))
    by_name = {}
    for op, op_name in zip(ops, names):
        if op_name == "builtin.shadow_output":
            by_name[op.str_attr("output_name")] = op.operand_source(0)
    for col, name in enumerate(fetch_names):
        v = by_name.get(name)
        if v is None:
            raise ValueError(f"fetch name {name!r} is not written by a shadow_output op")
        t = producer_job.get(v.id)
        if t is None:
            raise ValueError(f"fetch name {name!r} has no producer job")
        prog = programs[t]
        new_v = mappings[t].look_up(v)
        paddle.pir.set_insertion_point_to_block_end(prog.global_block())
        out = paddle._pir_ops.fetch(new_v, name, col)
        out.persistable = True
        fetches.append((t, name))
    paddle.pir.set_insertion_point_to_block_end(paddle.static.default_main_program().global_block())

    return SplitProgram(
        programs=programs, num_chunks=num_chunks, split_backward=bool(split_set),
        handoffs={h.name: h for h in handoffs.values()},
        required_vars={t: frozenset(s) for t, s in required.items()},
        fetches=fetches)

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

from pipesplit.job_list.ir import (BACKWARD, BACKWARD_B, BACKWARD_W, COMM_KINDS, FORWARD,
                                   OPTIMIZER, job_type)

from .accumulate import AccumulationInfo, add_gradient_accumulation
from .checks import check_stage_flow
from .complete import SINK_OPS, SOURCE_OPS, check_program, complete_program
from .regions import STACK_CREATE, inputs_of, pushing_op_of_stack, variable_owner
from .roles import BACKWARD_W_ATTR, HANDOFF_PREFIX, ROLE_BACKWARD, ROLE_FORWARD, ROLE_OPTIMIZE


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
        kinds = [FORWARD] + ([BACKWARD_B, BACKWARD_W] if c in split else [BACKWARD])
        types += [job_type(kind, c) for kind in kinds + list(COMM_KINDS)]
    return types + [OPTIMIZER]


def _job_of(op, split_backward) -> str:
    """Job type of ``op``; ``split_backward``: the set of split chunks."""
    role = op.op_role
    if role == ROLE_OPTIMIZE:
        return OPTIMIZER
    c = op.chunk_id
    if role == ROLE_FORWARD:
        return job_type(FORWARD, c)
    if role == ROLE_BACKWARD:
        if c not in split_backward:
            return job_type(BACKWARD, c)
        w = op.has_attr(BACKWARD_W_ATTR) and bool(op.attrs()[BACKWARD_W_ATTR])
        return job_type(BACKWARD_W if w else BACKWARD_B, c)
    raise ValueError(f"op {op.name()} has op_role {role}")


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
    carry_lr_scheduler(work, split.programs)
    return split


def carry_lr_scheduler(source, programs: Dict[str, "paddle.pir.Program"]) -> None:
    """Give every program of ``programs`` that reads ``source``'s learning-rate parameter the
    LR scheduler of ``source`` (``lr_scheduler`` and ``lr_name``, as Paddle's optimizer sets
    them on the main program and ``Program.clone`` keeps them), so a plan made of them
    (:func:`pipesplit.ir_utils.make_plan`) knows its scheduler."""
    scheduler = getattr(source, "lr_scheduler", None)
    name = getattr(source, "lr_name", None)
    if scheduler is None or name is None:
        return
    for program in programs.values():
        if any(op.name() == "builtin.parameter" and op.attrs()["parameter_name"] == name
               for op in program.global_block().ops):
            program.lr_scheduler = scheduler
            program.lr_name = name


def _distribute(work, num_chunks, split_backward, fetch_names) -> SplitProgram:
    """Clone every op of ``work`` into the sub-program of its job, with handoffs between them
    and the fetches added."""
    ops = list(work.global_block().ops)  # keeps the op wrappers alive: they key sets below
    split_set = split_chunks(num_chunks, split_backward)
    out = _SubPrograms(job_types_for(num_chunks, split_backward), ops)
    for oi, (op, op_name) in enumerate(zip(ops, out.names)):
        if op in out.source_ops:
            continue  # re-created lazily in each consumer
        t = _job_of_clone(op, op_name, split_set, out)
        if t not in out.programs:
            raise ValueError(f"op {op.name()} belongs to job {t!r}, which is not one of the "
                             f"{num_chunks}-chunk job types")
        out.clone_op(t, op, oi)
    out.drop_replayed_pushes()
    out.write_handoffs()
    fetches = out.add_fetches(out.default_fetch_names() if fetch_names is None else fetch_names)
    paddle.pir.set_insertion_point_to_block_end(paddle.static.default_main_program().global_block())
    return SplitProgram(
        programs=out.programs, num_chunks=num_chunks, split_backward=bool(split_set),
        handoffs={h.name: h for h in out.handoffs.values()},
        required_vars={t: frozenset(names) for t, names in out.required.items()},
        fetches=fetches)


def _job_of_clone(op, op_name: str, split_set, out: "_SubPrograms") -> str:
    """The job an op goes to; a sink (shadow_output / fetch) goes with its operand's producer."""
    if op_name in SINK_OPS:
        d = op.operand_source(0).get_defining_op()
        if d is not None and d not in out.source_ops:
            return out.producer_job[op.operand_source(0).id]
    return _job_of(op, split_set)


def replayed_stacks(ops, names) -> Dict[object, object]:
    """The stacks a backward reads as a stack (``cf.has_elements``: a while loop's backward
    tests it each iteration) besides popping it through its outlet, each with the forward
    control-flow op that pushes onto it.  Paddle's executor binds one variable to one name
    and checks both types, so such a stack cannot be handed to another sub-program; the job
    that reads it runs the forward op again, onto a stack of its own."""
    index = {op: i for i, op in enumerate(ops)}
    stacks_of: Dict[object, list] = {}  # forward op -> every stack it pushes onto
    for op, name in zip(ops, names):
        if name == STACK_CREATE:
            forward_op = pushing_op_of_stack(op, index)
            if forward_op is not None:
                stacks_of.setdefault(forward_op, []).append(op)
    # a replayed op pushes onto all its stacks again (those of an `if` nested in a `while`
    # too): every one of them stays in the job that replays it
    return {stack: forward_op for forward_op, stacks in stacks_of.items()
            if any(not stack.result(0).use_empty() for stack in stacks)
            for stack in stacks}


def _handed_type(v):
    """The type of the block input that receives ``v``: a stack's outlet for any part of a
    stack (a pop checks its input is an outlet; the variable is the same)."""
    d = v.get_defining_op()
    if d is not None and d.name() == "cf.stack_create":
        return d.result(2).type()
    return v.type()


class _SubPrograms:
    """The sub-programs of one split under construction: one program per job type, the value
    mappings into them, and which values cross from one job to another (handoffs)."""

    def __init__(self, types: Sequence[str], ops):
        # op names and flags read once: each read from Python costs microseconds
        self.names = [op.name() for op in ops]
        self.source_ops = {op for op, name in zip(ops, self.names)
                           if name in SOURCE_OPS and op.num_operands() == 0}  # as is_source_op
        self.data_ops = {op for op, name in zip(ops, self.names) if name == "pd_op.data"}
        self.programs = {t: paddle.pir.Program() for t in types}
        self.blocks = {t: p.global_block() for t, p in self.programs.items()}
        self.mappings = {t: paddle.pir.IrMapping() for t in types}
        self.kwarg_made: Dict[str, set] = {t: set() for t in types}
        self.place = paddle.base.libpaddle.Place()
        self.place.set_place(paddle.framework._current_expected_place())
        self.opts = paddle.pir.CloneOptions(False, True, True)
        # a control-flow op is cloned whole, its regions with it (what they read from outer
        # blocks is made available first, as its operands are)
        self.opts_with_regions = paddle.pir.CloneOptions(True, True, True)
        self.ops = ops
        # shadow_output names already present in the program, per value id
        self.shadow_name: Dict[int, str] = {}
        for op, name in zip(ops, self.names):
            if name == "builtin.shadow_output":
                self.shadow_name.setdefault(op.operand_source(0).id, op.str_attr("output_name"))
        self.replayed = replayed_stacks(ops, self.names)
        self.replaying_ops = set(self.replayed.values())
        self.producer_job: Dict[int, str] = {}   # value id -> job type of its producer
        self.producer_op: Dict[int, Tuple[object, int, int]] = {}  # value id -> (op, index, result)
        self.handoffs: Dict[int, Handoff] = {}
        self.required: Dict[str, set] = {t: set() for t in types}

    def clone_op(self, t: str, op, oi: int) -> None:
        """Clone ``op`` (index ``oi``) into job ``t``'s program, its operands made available
        (re-created source ops go to the same insertion point, the block's end, before it)."""
        paddle.pir.set_insertion_point_to_block_end(self.blocks[t])
        for v in inputs_of(op):
            self.ensure_operand(t, v)
        if op in self.replaying_ops:
            self._clone_on_copies(t, op)
        else:
            op.clone(self.mappings[t], self.opts_with_regions if op.num_regions() else self.opts)
        if self.names[oi] == "builtin.shadow_output":
            name = op.str_attr("output_name")
            if not op.operand_source(0).persistable:
                self.required[t].add(name)
        for ri, r in enumerate(op.results()):
            rid = r.id
            self.producer_job[rid] = t
            self.producer_op[rid] = (op, oi, ri)

    def ensure_operand(self, t: str, v) -> None:
        """Make value ``v`` available in job ``t``'s program: a kwarg for a block argument, a
        re-created source op, or a handoff from the job that produced it."""
        if not v.initialized():
            return  # an absent optional operand
        if self.mappings[t].has(v):
            return
        d = v.get_defining_op()
        if d is None:  # a block argument / kwarg of the source program
            self._add_block_argument(t, v)
            return
        if d in self.source_ops:
            d.clone(self.mappings[t], self.opts)
            if d in self.data_ops and not v.persistable:
                self.required[t].add(v.name)
            return
        if d in self.replayed:
            self._replay(t, d)
            return
        self._add_handoff_input(t, v)

    def _replay(self, t: str, stack_create) -> None:
        """Run the forward control-flow op that fills ``stack_create``'s stack again in job
        ``t``, onto a stack of ``t``'s own (see ``replayed_stacks``)."""
        forward_op = self.replayed[stack_create]
        for stack in self.replayed:
            if self.replayed[stack] is forward_op:
                stack.clone(self.mappings[t], self.opts)
        for v in inputs_of(forward_op):
            self.ensure_operand(t, v)
        self._clone_on_copies(t, forward_op)

    def _clone_on_copies(self, t: str, op) -> None:
        """Clone a replayed control-flow op into job ``t``, its operands copied first: a
        ``while`` writes its condition and loop variables back into its operands' variables,
        and its replay must start from the values its first run started from."""
        paddle.pir.set_insertion_point_to_block_end(self.blocks[t])
        mapping = self.mappings[t]
        copies = [paddle._C_ops.assign(mapping.look_up(v)) if v.initialized() else None
                  for v in op.operands_source()]
        new_op = op.clone(mapping, self.opts_with_regions)
        for i, copy in enumerate(copies):
            if copy is not None:
                new_op.operand(i).set_source(copy)

    def drop_replayed_pushes(self) -> None:
        """The forward's own run of a replayed op pushes nothing: nobody pops its stack."""
        for stack_create in self.replayed:
            t = self.producer_job.get(stack_create.result(0).id)
            if t is None:
                continue
            inlet = self.mappings[t].look_up(stack_create.result(1))
            for push in list(inlet.all_used_ops()):
                push.erase()
            inlet.get_defining_op().erase()

    def _add_block_argument(self, t: str, v) -> None:
        name = v.name
        if name in self.kwarg_made[t]:
            return
        kw = self.blocks[t].add_kwarg(name, v.type())
        kw.persistable = v.persistable
        kw.place_attr = self.place
        self.kwarg_made[t].add(name)
        if not v.persistable:
            self.required[t].add(name)
        self.mappings[t].add(v, kw)

    def _add_handoff_input(self, t: str, v) -> None:
        # handed by the value that owns its variable: a stack's inlet / outlet by the stack's
        # one name (two names for one variable would be two renames of it)
        owner = variable_owner(v)
        src = self.producer_job[owner.id]
        h = self.handoffs.get(owner.id)
        if h is None:
            name = self.shadow_name.get(owner.id)
            if name is None:
                _, oi, ri = self.producer_op[owner.id]
                name = f"{HANDOFF_PREFIX}{oi}_{ri}"
            h = self.handoffs[owner.id] = Handoff(name, src, ())
        if t not in h.consumers:
            h.consumers = h.consumers + (t,)
        if h.name in self.kwarg_made[t]:  # another view of a variable already handed over
            self.mappings[t].add(v, self.blocks[t].kwargs()[h.name])
            return
        self.kwarg_made[t].add(h.name)
        kw = self.blocks[t].add_kwarg(h.name, _handed_type(v))
        kw.persistable = False
        kw.place_attr = self.place
        self.mappings[t].add(v, kw)
        self.required[t].add(h.name)
        self.required[src].add(h.name)

    def write_handoffs(self) -> None:
        """Producer side of the handoffs: shadow_output right after the producer's clone (all
        alike but for the name: clones of the first, ~2 us each, instead of ~20 us from
        Python)."""
        first_write = None
        for vid, h in self.handoffs.items():
            op, oi, ri = self.producer_op[vid]
            v = op.result(ri)
            if vid in self.shadow_name:
                continue  # the program's own shadow_output (cloned with the producer) writes it
            new_v = self.mappings[h.producer].look_up(v)
            paddle.pir.set_insertion_point_after(new_v.get_defining_op())
            if first_write is None:
                paddle._C_ops.set_persistable_value(new_v, h.name)
                first_write = next(
                    u for u in new_v.all_used_ops() if u.name() == "builtin.shadow_output"
                    and u.str_attr("output_name") == h.name)
            else:
                mapping = paddle.pir.IrMapping()
                mapping.add(first_write.operand_source(0), new_v)
                first_write.clone(mapping, self.opts).set_str_attr("output_name", h.name)

    def default_fetch_names(self) -> List[str]:
        """The names the forward hands over with ``shadow_output`` (the loss and what the user
        fetches)."""
        return [op.str_attr("output_name") for op, name in zip(self.ops, self.names)
                if name == "builtin.shadow_output" and op.op_role == ROLE_FORWARD]

    def add_fetches(self, fetch_names: Sequence[str]) -> List[Tuple[str, str]]:
        """A fetch op for each name, in the program of the job that writes it: (job, name)."""
        by_name = {}
        for op, op_name in zip(self.ops, self.names):
            if op_name == "builtin.shadow_output":
                by_name[op.str_attr("output_name")] = op.operand_source(0)
        fetches: List[Tuple[str, str]] = []
        for col, name in enumerate(fetch_names):
            v = by_name.get(name)
            if v is None:
                raise ValueError(f"fetch name {name!r} is not written by a shadow_output op")
            t = self.producer_job.get(v.id)
            if t is None:
                raise ValueError(f"fetch name {name!r} has no producer job")
            new_v = self.mappings[t].look_up(v)
            paddle.pir.set_insertion_point_to_block_end(self.programs[t].global_block())
            out = paddle._pir_ops.fetch(new_v, name, col)
            out.persistable = True
            fetches.append((t, name))
        return fetches

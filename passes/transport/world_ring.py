"""Group collectives on one world communicator: the CPU transport of hybrid meshes.

Paddle 3.3.1's CPU executor gives every collective of a process the comm context of the FIRST
ring it meets (the process-wide CPU device context has one slot, set once), whatever the op's
``ring_id``; CPU kernels of the ring-looking ``c_*`` ops do not exist.  A process can therefore
talk to one group only.  With data / tensor parallelism beside the pipeline it must talk to
several (its stage's mp group, its dp group, its pipeline neighbours), so on CPU every
collective becomes a *world* ``all_gather`` on ring 0 from which each process takes what its
group's collective would have given it:

* all-reduce (sum / max / min / prod) over group G: reduce the gathered rows of G's members;
* all-gather over G: concatenate the rows of G's members in G's order;
* reduce-scatter (sum) over G: sum the rows of G's members and keep this process's piece of
  the sum (its place in G, along the first axis: what sharding's gradient reshard needs);
* a transfer from process s to process d (a pipeline send / recv, or the optimizer's p2p):
  the receiver takes row s; every pipeline's corresponding transfer shares the gather.

Every process must issue the same gathers, with the same shapes, in the same order: a process
with nothing to contribute at a gather (another stage's collective) joins it with zeros of that
shape (a *bystander* gather).  A program's *signature* is the list of ``(shape, dtype)`` of its
gathers, in program order: what a bystander of it must issue.  Cost is no concern here (a CPU
test path); the job order is the GPU path's, with bystander jobs added.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import paddle

from pipesplit.passes.transport.p2p import CPU_RING_ID, Transfer

#: one world gather: (shape, dtype name)
Gather = Tuple[Tuple[int, ...], str]
GROUP_OPS = ("pd_op.all_reduce", "pd_op.all_reduce_", "pd_op.all_gather",
             "pd_op.reduce_scatter")
P2P_OPS = ("pd_op.send_v2", "pd_op.recv_v2")
#: paddle.distributed.ReduceOp values of ``reduce_type``
_REDUCE = {0: "sum", 1: "max", 2: "min", 3: "prod"}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("paddle.", "")


def gather_rows(x, world: int):
    """The world gather of ``x``: a list of ``world`` values, row p from process p."""
    gathered = paddle._C_ops.all_gather(x, CPU_RING_ID, world)
    return paddle.split(gathered, world, axis=0) if world > 1 else [gathered]


def _bystander_gather(shape, dtype, world: int) -> None:
    rows = gather_rows(paddle.full(list(shape), 0, dtype=dtype), world)
    del rows  # taken part in, dropped


def _reduce(rows, how: str):
    out = rows[0]
    for row in rows[1:]:
        out = {"sum": paddle.add, "max": paddle.maximum, "min": paddle.minimum,
               "prod": paddle.multiply}[how](out, row)
    return out


def _attr(op, name, default=None):
    return op.attrs()[name] if op.has_attr(name) else default


def _copy_role(new_ops, like) -> None:
    for op in new_ops:
        op.op_role = like.op_role
        if like.has_attr("chunk_id"):
            op.set_int_attr("chunk_id", like.chunk_id)


def _replace(block, op, build) -> Tuple[int, ...]:
    """Build the emulation of ``op`` in front of it (``build()`` returns its result or None),
    route ``op``'s result to it, erase ``op``; returns the gathered shape."""
    paddle.pir.set_insertion_point(op)
    before = len(block.ops)
    result = build()
    position = list(block.ops).index(op)
    _copy_role(list(block.ops)[position - (len(block.ops) - before): position], op)
    if result is not None and op.num_results():
        op.result(0).replace_all_uses_with(result)
    op.erase()


def emulate_group_collectives(program, process: int, world: int,
                              group_ranks: Callable[[int], Sequence[int]]) -> List[Gather]:
    """Rewrite (in place) every all-reduce / all-gather of ``program`` over a group as a world
    gather; returns the program's signature.  ``group_ranks(ring_id)``: the processes of a
    ring, in its order.  p2p ops are left alone (see :func:`emulate_with_bystanders`)."""
    block = program.global_block()
    signature: List[Gather] = []
    for op in list(block.ops):
        if op.name() not in GROUP_OPS:
            continue
        x = op.operand_source(0)
        members = list(group_ranks(int(_attr(op, "ring_id"))))
        if process not in members:
            raise ValueError(f"{op.name()} on ring {_attr(op, 'ring_id')} (processes {members}) "
                             f"runs on process {process}, which is not in it")
        shape, dtype = tuple(int(d) for d in x.shape), _dtype_name(x.dtype)
        if any(d < 0 for d in shape):
            raise ValueError(f"{op.name()} of a dynamic shape {list(shape)}: the CPU hybrid "
                             "transport needs static shapes: give dist.to_static a loader of "
                             "fixed-size batches (drop_last=True) and no -1 in the model's own "
                             "shapes")
        _emulate_one(block, op, world, members, process)
        signature.append((shape, dtype))
    paddle.pir.set_insertion_point_to_block_end(block)
    return signature


def collective_sequence(program, group_ranks) -> List[Tuple[str, Optional[int], Gather]]:
    """``program``'s collectives in order, as :func:`merge_sequences` takes them (peers as
    processes): ``("group", None, gather)`` for an all-reduce / all-gather, ``("send", peer,
    gather)`` / ``("recv", peer, gather)`` for a p2p op."""
    out = []
    for op in program.global_block().ops:
        name = op.name()
        if name in GROUP_OPS:
            x = op.operand_source(0)
            out.append(("group", None, (tuple(int(d) for d in x.shape), _dtype_name(x.dtype))))
        elif name in P2P_OPS:
            peer = list(group_ranks(int(_attr(op, "ring_id"))))[int(_attr(op, "peer"))]
            if name == "pd_op.send_v2":
                x = op.operand_source(0)
                gather = (tuple(int(d) for d in x.shape), _dtype_name(x.dtype))
            else:
                gather = (tuple(int(d) for d in _attr(op, "out_shape")),
                          _dtype_name(op.result(0).dtype))
            out.append(("send" if name == "pd_op.send_v2" else "recv", peer, gather))
    return out


def emulate_with_bystanders(program, process: int, world: int, group_ranks,
                            plan: Sequence[Tuple[str, Optional[Gather]]]) -> None:
    """Rewrite (in place) ``program``'s collectives AND p2p ops as world gathers, adding the
    bystander gathers of ``plan`` between them: ``plan`` lists, in the one order every process
    issues them, ``("own", None)`` for each of this program's collectives / p2p ops (in
    program order) and ``("bystander", gather)`` for another process's.  The optimizer's
    programs differ between stages, so their gathers interleave this way
    (:func:`merge_sequences` makes the plan)."""
    block = program.global_block()
    own_ops = [op for op in block.ops if op.name() in GROUP_OPS + P2P_OPS]
    if sum(1 for kind, _ in plan if kind == "own") != len(own_ops):
        raise ValueError("the plan's own collectives do not match the program's")
    pending: List[Gather] = []
    index = 0
    for kind, gather in plan:
        if kind == "bystander":
            pending.append(gather)
            continue
        op = own_ops[index]
        index += 1
        _bystand_before(block, op, pending, world)
        pending = []
        if op.name() in P2P_OPS:
            _emulate_p2p_op(block, op, world, group_ranks)
        else:
            _emulate_one(block, op, world, list(group_ranks(int(_attr(op, "ring_id")))),
                         process)
    if pending:
        paddle.pir.set_insertion_point_to_block_end(block)
        for shape, dtype in pending:
            _bystander_gather(shape, dtype, world)
    paddle.pir.set_insertion_point_to_block_end(block)


def _bystand_before(block, op, gathers, world) -> None:
    if not gathers:
        return
    paddle.pir.set_insertion_point(op)
    before = len(block.ops)
    for shape, dtype in gathers:
        _bystander_gather(shape, dtype, world)
    position = list(block.ops).index(op)
    _copy_role(list(block.ops)[position - (len(block.ops) - before): position], op)


def _emulate_one(block, op, world, members, process: int) -> None:
    """One all-reduce / all-gather / reduce-scatter over ``members`` as a world gather, on
    ``process``."""
    x = op.operand_source(0)
    if op.name() == "pd_op.all_gather":
        def build():
            rows = gather_rows(x, world)
            return paddle.concat([rows[p] for p in members], axis=0)
    elif op.name() == "pd_op.reduce_scatter":
        mine = members.index(process)

        def build():
            rows = gather_rows(x, world)
            return paddle.split(_reduce([rows[p] for p in members], "sum"), len(members),
                                axis=0)[mine]
    else:
        how = _REDUCE.get(int(_attr(op, "reduce_type", 0)))
        if how is None:
            raise ValueError(f"{op.name()} with reduce_type {_attr(op, 'reduce_type')}: the CPU "
                             "hybrid transport knows sum, max, min and prod")

        def build():
            rows = gather_rows(x, world)
            return _reduce([rows[p] for p in members], how)
    _replace(block, op, build)


def _emulate_p2p_op(block, op, world, group_ranks) -> None:
    peer = list(group_ranks(int(_attr(op, "ring_id"))))[int(_attr(op, "peer"))]
    if op.name() == "pd_op.send_v2":
        x = op.operand_source(0)
        _replace(block, op, lambda: (gather_rows(x, world), None)[1])
        return
    shape, dtype = list(_attr(op, "out_shape")), op.result(0).dtype
    _replace(block, op, lambda: gather_rows(paddle.full(shape, 0, dtype=dtype), world)[peer])


def merge_sequences(sequences: Dict[int, Sequence[Tuple[str, Optional[int], Gather]]]
                    ) -> List[Tuple[int, Optional[int], Gather]]:
    """One order of every pipeline rank's collectives (the optimizer's), all ranks issuing it:
    ``sequences[r]`` lists rank r's as ``(kind, peer rank, gather)`` with kind ``"group"``
    (within r's own stage: needs nobody else), ``"send"`` / ``"recv"`` (a p2p with the peer
    rank: one gather for both ends).  Returns ``(rank, peer or None, gather)`` slots: the
    lowest rank that can go goes first; a send and its recv go together.  ``ValueError`` if
    the sequences cannot be matched (a send without its recv, or a cycle)."""
    heads = {r: 0 for r in sequences}
    out: List[Tuple[int, Optional[int], Gather]] = []
    remaining = sum(len(s) for s in sequences.values())
    while remaining:
        progressed = False
        for r in sorted(sequences):
            seq = sequences[r]
            if heads[r] >= len(seq):
                continue
            kind, peer, gather = seq[heads[r]]
            if kind == "group":
                out.append((r, None, gather))
                heads[r] += 1
                remaining -= 1
                progressed = True
                break
            if kind == "send":
                other = sequences.get(peer, ())
                if heads.get(peer, 0) < len(other) and other[heads[peer]][:2] == ("recv", r):
                    if tuple(other[heads[peer]][2][0]) != tuple(gather[0]):
                        raise ValueError(f"rank {r} sends {list(gather[0])} to rank {peer}, "
                                         f"which receives {list(other[heads[peer]][2][0])}")
                    out.append((r, peer, gather))
                    heads[r] += 1
                    heads[peer] += 1
                    remaining -= 2
                    progressed = True
                    break
        if not progressed:
            stuck = {r: sequences[r][heads[r]][:2] for r in sequences
                     if heads[r] < len(sequences[r])}
            raise ValueError(f"the ranks' collectives cannot be put in one order: each waits "
                             f"on another {stuck}")
    return out


def world_comm_program(transfers: Sequence[Transfer], process: int, world: int
                       ) -> Tuple["paddle.pir.Program", List[Gather]]:
    """A send or recv job's program on the world ring: one gather per transfer; the sender
    contributes the handoff, the receiver zeros and keeps the sender's row (every pipeline's
    corresponding transfer shares the gather).  Returns (program, signature)."""
    program = paddle.pir.Program()
    block = program.global_block()
    place = paddle.base.libpaddle.Place()
    place.set_place(paddle.framework._current_expected_place())
    signature: List[Gather] = []
    with paddle.static.program_guard(program):
        for t in transfers:
            if t.is_dynamic:
                raise ValueError(f"handoff {t.name} has a dynamic shape {list(t.shape)}: the CPU "
                                 "hybrid transport needs static shapes")
            if t.src == process:
                x = block.add_kwarg(t.name, t.value_type)
                x.persistable = False
                x.place_attr = place
                gather_rows(x, world)
            elif t.dst == process:
                rows = gather_rows(paddle.full(list(t.shape), 0, dtype=t.dtype), world)
                paddle._C_ops.set_persistable_value(rows[t.src], t.name)
            else:
                raise ValueError(f"transfer {t.name} ({t.src} -> {t.dst}) does not involve "
                                 f"process {process}")
            signature.append((t.shape, _dtype_name(t.dtype)))
    paddle.pir.set_insertion_point_to_block_end(
        paddle.static.default_main_program().global_block())
    return program, signature


def bystander_program(signature: Sequence[Gather], world: int) -> "paddle.pir.Program":
    """The program of a process taking part in another stage's job: zeros gathered in the
    job's signature, dropped."""
    program = paddle.pir.Program()
    with paddle.static.program_guard(program):
        for shape, dtype in signature:
            _bystander_gather(shape, dtype, world)
    paddle.pir.set_insertion_point_to_block_end(
        paddle.static.default_main_program().global_block())
    return program

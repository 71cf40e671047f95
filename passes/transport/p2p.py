"""Point-to-point handoffs between pipeline ranks as PIR sub-programs.

A *transfer* is one named handoff value (``pipesplit_handoff_*``) that one rank's sub-program
writes and a sub-program on another rank reads.  :func:`build_comm_program` builds the send or
recv sub-program of one comm job from the transfers it carries:

* ``backend="gloo"`` (CPU): Paddle 3.3.1's CPU ``send_v2`` / ``recv_v2`` kernels are stubs that
  raise, but ``broadcast`` works over gloo.  A send / recv pair is a ``pd_op.broadcast_``
  rooted at the sender on ring 0; the receiver broadcasts into a buffer (``pd_op.full``) of the
  handoff's shape.  A handoff with a dynamic dimension (the batch dimension ``-1``) first
  broadcasts its shape (an int64 vector) and the receiver builds the buffer from it
  (``pd_op.full_with_tensor``), so no micro-batch size needs to be known when the programs are
  built.  Only one communicator per process works on CPU (the executor uses the comm context of
  the first ring it meets for every collective), so ring 0 is the world ring and every rank
  takes part in every broadcast: the *world-ring transport* (:func:`world_ring_comm`).  Every
  rank issues all exchanges of a step in the one global order of
  :func:`pipesplit.job_list.lower.global_order`; a rank that is neither end of an exchange runs a
  *bystander* program (:func:`build_bystander_program`) that broadcasts into scratch buffers of
  the same shapes and drops them.  With two ranks there are no bystanders.
* ``backend="nccl"`` (GPU): ``pd_op.send_v2`` / ``pd_op.recv_v2`` on a two-rank p2p ring per
  rank pair, on their own execution streams (``send_stream_{ring}`` / ``recv_stream``, as
  Paddle's ``_pir_overlap_send_recv`` sets them), ``dynamic_shape`` only where the handoff has a
  dynamic dimension.  Cross-program event dependencies (producer op -> send, recv -> first
  consumer op) are added with :func:`add_event_dependency`, the attributes Paddle's
  ``PipelinePassBase._add_dependency`` sets.

Every comm program can also bump a persistable progress counter once its transfers are done
(``progress``): a watchdog reads it to name the comm job a rank is stuck in.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import paddle

from pipesplit.job_list.ir import bystander_type
from pipesplit.passes.transport import BACKENDS
CPU_RING_ID = 0
PROGRESS_VAR = "pipesplit_comm_progress"


@dataclass(frozen=True)
class Transfer:
    """One handoff value crossing from rank ``src`` to rank ``dst``."""

    name: str
    value_type: object      # the PIR type of the handoff (shape + dtype)
    src: int
    dst: int
    src_stage: int
    dst_stage: int
    #: nccl: (ring id, ranks of the ring) to use instead of the pair's ring (the engine path
    #: keeps the rings Paddle's reshard made, one per direction)
    ring: Optional[Tuple[int, Tuple[int, ...]]] = None

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(int(s) for s in self.value_type.shape)

    @property
    def dtype(self):
        return self.value_type.dtype

    @property
    def is_dynamic(self) -> bool:
        return any(s < 0 for s in self.shape)


def handoff_type(shape: Sequence[int], dtype):
    """The PIR type of a handoff of ``shape`` (-1 for a dimension known at run time) and
    ``dtype``: rebuilds a :class:`Transfer` from a description another rank published (the
    world-ring transport needs every exchange's transfers on every rank)."""
    prog = paddle.pir.Program()
    with paddle.static.program_guard(prog):
        return paddle.static.data("pipesplit_handoff_type", [int(s) for s in shape],
                                  dtype).type()


def ring_pair(a: int, b: int) -> Tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _place_attr():
    place = paddle.base.libpaddle.Place()
    place.set_place(paddle.framework._current_expected_place())
    return place


def add_event_dependency(recorder_op, waiter_op, name: str) -> None:
    """``waiter_op`` (in another sub-program) waits for the event ``recorder_op`` records, as
    Paddle's ``PipelinePassBase._add_dependency`` does for its send_v2 / recv_v2 ops."""
    if not recorder_op.has_attr("force_record_event"):
        recorder_op.set_bool_attr("force_record_event", True)
    if recorder_op.has_attr("event_to_record"):
        name = recorder_op.attrs()["event_to_record"]  # one event per op: share it
    else:
        recorder_op.set_str_attr("event_to_record", name)
    waits = list(waiter_op.attrs().get("events_to_wait", [])) if waiter_op.has_attr(
        "events_to_wait") else []
    if name not in waits:
        waiter_op.set_str_array_attr("events_to_wait", waits + [name])


def first_user(program, name: str):
    """First op of ``program`` reading its block kwarg ``name`` (None if none)."""
    blk = program.global_block()
    kw = blk.kwargs().get(name)
    if kw is None:
        return None
    for op in blk.ops:
        if any(v.id == kw.id for v in op.operands_source() if v is not None and v.initialized()):
            return op
    return None


def producer_of(program, name: str):
    """The op computing the value ``program`` writes as ``name`` (the operand of its
    ``builtin.shadow_output``), or None."""
    for op in program.global_block().ops:
        if op.name() == "builtin.shadow_output" and op.attrs()["output_name"] == name:
            return op.operand_source(0).get_defining_op()
    return None


def _bump_progress(block, after_value, place):
    """``progress += 1`` once ``after_value`` exists (data-dependent, so it runs after the comm)."""
    if PROGRESS_VAR in block.kwargs():
        cnt = block.kwargs()[PROGRESS_VAR]
    else:
        cnt = block.add_kwarg(PROGRESS_VAR, _progress_type())
        cnt.persistable = True
        cnt.place_attr = place
    # 1, read from the value (so after it), in three ops: each op made from Python records
    # the caller's traceback (~0.2 ms inside the engine), and this runs once per comm job
    one = paddle.full_like(paddle.numel(after_value), 1.0, dtype="float32")
    paddle._C_ops.add_(cnt, one)


@functools.lru_cache(maxsize=None)
def _progress_type():
    """The PIR type of the progress counter (made once)."""
    prog = paddle.pir.Program()
    with paddle.static.program_guard(prog):
        return paddle.full([1], 0.0, dtype="float32").type()


def build_comm_program(transfers: Sequence[Transfer], rank: int, backend: str, *,
                       ring_ids: Optional[Dict[Tuple[int, int], int]] = None,
                       progress: bool = False,
                       own_streams: bool = True) -> Tuple["paddle.pir.Program", List[object]]:
    """The send / recv sub-program of one comm job on ``rank``: every transfer of
    ``transfers`` with ``src == rank`` is sent, every one with ``dst == rank`` is received, in
    the given order (both ends must use the same order).  Returns (program, comm ops), the comm
    ops in transfer order (``pd_op.broadcast_`` or ``pd_op.send_v2`` / ``pd_op.recv_v2``).

    ``ring_ids`` (nccl): ring id of each rank pair ``(low, high)``.  ``own_streams`` (nccl):
    the send / recv ops run on streams of their own (else on the compute stream).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    program = paddle.pir.Program()
    block = program.global_block()
    place = _place_attr()
    comm_ops = []
    last = None  # the last transfer's result: the progress counter follows it
    with paddle.static.program_guard(program):
        for t in transfers:
            if rank not in (t.src, t.dst) or t.src == t.dst:
                raise ValueError(f"transfer {t.name} ({t.src} -> {t.dst}) does not involve "
                                 f"rank {rank} and another rank")
            sending = t.src == rank
            if backend == "gloo":
                out = _gloo_transfer(block, t, "send" if sending else "recv", place, comm_ops)
            elif t.ring is not None:
                out = _nccl_transfer(block, t, sending, place, t.ring, comm_ops, own_streams)
            else:
                pair = ring_pair(t.src, t.dst)
                if ring_ids is None or pair not in ring_ids:
                    raise ValueError(f"no ring id for rank pair {pair}")
                out = _nccl_transfer(block, t, sending, place, (ring_ids[pair], pair), comm_ops,
                                     own_streams)
            last = out if out is not None else last
        if progress and last is not None:  # once per comm job: the watchdog counts jobs
            _bump_progress(block, last, place)
    paddle.pir.set_insertion_point_to_block_end(
        paddle.static.default_main_program().global_block())
    return program, comm_ops


def _kwarg(block, t: Transfer, place):
    kw = block.add_kwarg(t.name, t.value_type)
    kw.persistable = False
    kw.place_attr = place
    return kw


def build_bystander_program(transfers: Sequence[Transfer], *, progress: bool = False
                            ) -> Tuple["paddle.pir.Program", List[object]]:
    """World-ring transport (gloo): the comm program of a rank that is neither end of the
    exchange ``transfers`` (the transfers of one send / recv pair, in the order both ends use).
    It takes part in each of the exchange's broadcasts on ring 0 (the shape broadcast of a
    dynamic handoff too) into a scratch buffer of the transfer's shape and drops the data.
    Returns (program, broadcast ops), as :func:`build_comm_program`."""
    if not transfers:
        raise ValueError("build_bystander_program needs at least one transfer")
    program = paddle.pir.Program()
    block = program.global_block()
    place = _place_attr()
    comm_ops = []
    with paddle.static.program_guard(program):
        out = None
        for t in transfers:
            out = _gloo_transfer(block, t, "bystander", place, comm_ops)
        if progress:
            _bump_progress(block, out, place)
    paddle.pir.set_insertion_point_to_block_end(
        paddle.static.default_main_program().global_block())
    return program, comm_ops


def bystander_job_type(transfers: Sequence[Transfer]) -> str:
    """Job type of the bystander program of an exchange: ``bystander_{src stage}_{dst stage}``
    (one exchange per pair of adjacent stages and direction carries the same transfers)."""
    first = transfers[0]
    return bystander_type(first.src_stage, str(first.dst_stage))


def world_ring_comm(exchanges: Sequence[Sequence[Transfer]], rank: int, *,
                    progress: bool = False
                    ) -> Tuple[Dict[str, "paddle.pir.Program"], List[Optional[str]]]:
    """The world-ring transport (gloo, any number of ranks) of ``rank`` for one step.

    ``exchanges``: every send / recv pair of the step in the one global order all ranks issue
    them (:func:`pipesplit.job_list.lower.global_order`: a send directly followed by its recv),
    each as the transfers it carries, in the order both ends use.  Each transfer is a
    ``pd_op.broadcast_`` on ring 0 rooted at its sender in which every rank takes part: the two
    ends run their send / recv programs (:func:`build_comm_program`), every other rank the
    exchange's bystander program at the same point of the order, so the collectives of all
    ranks match one for one.  Returns (bystander programs by job type, and per exchange the
    bystander job type ``rank`` runs for it, None where ``rank`` is an end or the exchange
    carries nothing)."""
    programs: Dict[str, "paddle.pir.Program"] = {}
    roles: List[Optional[str]] = []
    for transfers in exchanges:
        transfers = list(transfers)
        ends = {(t.src, t.dst) for t in transfers}
        if len(ends) > 1:
            raise ValueError(f"an exchange is one send / recv pair; got transfers between "
                             f"{sorted(ends)}")
        if not transfers or rank in next(iter(ends)):
            roles.append(None)
            continue
        job_type = bystander_job_type(transfers)
        if job_type not in programs:
            programs[job_type] = build_bystander_program(transfers, progress=progress)[0]
        roles.append(job_type)
    return programs, roles


def _gloo_transfer(block, t: Transfer, role: str, place, comm_ops):
    """One broadcast rooted at ``t.src``; ``role``: "send", "recv" (the result becomes the
    persistable handoff) or "bystander" (the result is dropped)."""
    root = t.src
    if role == "send":
        x = _kwarg(block, t, place)
        if t.is_dynamic:
            shape = paddle.cast(paddle.shape(x), "int64")
            paddle._C_ops.broadcast_(shape, CPU_RING_ID, root)
        out = paddle._C_ops.broadcast_(x, CPU_RING_ID, root)
        comm_ops.append(out.get_defining_op())
        return out
    if t.is_dynamic:
        shape = paddle.full([len(t.shape)], 0, dtype="int64")
        shape = paddle._C_ops.broadcast_(shape, CPU_RING_ID, root)
        buf = paddle.full(shape, 0.0, dtype=t.dtype)
    else:
        buf = paddle.full(list(t.shape), 0.0, dtype=t.dtype)
    out = paddle._C_ops.broadcast_(buf, CPU_RING_ID, root)
    comm_ops.append(out.get_defining_op())
    if role == "recv":
        paddle._C_ops.set_persistable_value(out, t.name)
    return out


def _nccl_transfer(block, t: Transfer, sending: bool, place, ring, comm_ops, own_streams):
    ring_id, ring_ranks = ring
    peer = t.dst if sending else t.src
    local_peer = list(ring_ranks).index(peer)  # send_v2 / recv_v2 take the peer's ring rank
    if sending:
        x = _kwarg(block, t, place)
        paddle._C_ops.send_v2(x, ring_id, local_peer, True, t.is_dynamic)
        op = block.ops[-1]
        if own_streams:
            op.set_execution_stream(f"send_stream_{ring_id}")
            op.set_scheduling_priority(0)
        op.set_int_attr("pipesplit_peer", peer)
        comm_ops.append(op)
        return None
    shape = [s if s >= 0 else 1 for s in t.shape] if t.is_dynamic else list(t.shape)
    out = paddle._C_ops.recv_v2(shape, t.dtype, local_peer, ring_id, True, t.is_dynamic)
    out.set_type(t.value_type)
    op = out.get_defining_op()
    if own_streams:
        op.set_execution_stream("recv_stream")
        op.set_scheduling_priority(0)
    op.set_int_attr("pipesplit_peer", peer)
    comm_ops.append(op)
    paddle._C_ops.set_persistable_value(out, t.name)
    return out


def comm_peers(program) -> List[Tuple[str, int, Optional[int]]]:
    """(op name, ring id, global peer) of each p2p / broadcast op of a comm sub-program; the
    global peer is the ``pipesplit_peer`` attribute (nccl) or the broadcast root (gloo)."""
    out = []
    for op in program.global_block().ops:
        name = op.name()
        if name in ("pd_op.send_v2", "pd_op.recv_v2"):
            attrs = op.attrs()
            out.append((name, int(attrs["ring_id"]), int(attrs["pipesplit_peer"])))
        elif name == "pd_op.broadcast_":
            attrs = op.attrs()
            out.append((name, int(attrs["ring_id"]), int(attrs["root"])))
    return out


def drop_event_dependencies(program) -> None:
    """Clear the cross-program stream events (``force_record_event`` / ``events_to_wait``)
    of every op: the CPU transport runs one stream per rank, in job order."""
    for op in program.global_block().ops:
        attrs = op.attrs()
        if attrs.get("events_to_wait"):
            op.set_str_array_attr("events_to_wait", [])
        if attrs.get("force_record_event"):
            op.set_bool_attr("force_record_event", False)


def p2p_to_gloo_broadcasts(program, rank: int, ring_ranks) -> int:
    """Rewrite (in place) every ``send_v2`` / ``recv_v2`` of ``program`` as a
    ``pd_op.broadcast_`` on ring 0 rooted at the sender, as the CPU transport needs (two
    ranks).  ``ring_ranks(ring_id)`` gives the global ranks of a ring (``peer`` indexes it).
    Both ends must then issue their transfers in the same order.  Returns the count."""
    block = program.global_block()
    count = 0
    for op in list(block.ops):
        if op.name() not in ("pd_op.send_v2", "pd_op.recv_v2"):
            continue
        attrs = op.attrs()
        peer = list(ring_ranks(int(attrs["ring_id"])))[int(attrs["peer"])]
        paddle.pir.set_insertion_point(op)
        n_before = len(block.ops)
        if op.name() == "pd_op.send_v2":
            paddle._C_ops.broadcast_(op.operand_source(0), CPU_RING_ID, rank)
        else:
            buf = paddle.full(list(attrs["out_shape"]), 0.0, dtype=attrs["dtype"])
            out = paddle._C_ops.broadcast_(buf, CPU_RING_ID, peer)
            op.result(0).replace_all_uses_with(out)
        position = list(block.ops).index(op)
        made = list(block.ops)[position - (len(block.ops) - n_before): position]
        for new in made:
            new.op_role = op.op_role
            if op.has_attr("chunk_id"):
                new.set_int_attr("chunk_id", op.chunk_id)
        op.erase()
        count += 1
    paddle.pir.set_insertion_point_to_block_end(block)
    return count


def all_reduce_sum(x, backend: str, ring_id: Optional[int] = None):
    """``pd_op.all_reduce`` (sum) of the PIR value ``x`` over a ring: ring 0 on CPU (gloo: the
    one usable communicator per process), ``ring_id`` (a ring of every pipeline rank) on GPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and ring_id is None:
        raise ValueError("ring_id is needed for an NCCL all-reduce")
    ring = CPU_RING_ID if backend == "gloo" else ring_id
    return paddle._C_ops.all_reduce(x, ring, paddle.distributed.ReduceOp.SUM)

"""Step-level exchanges: values sent once per step between scope variables of two processes.

A micro-batch's handoff lives in that micro-batch's scope; a value the whole step shares (a
parameter another stage reads, the sum of its gradients there) lives in the scope itself, in a
persistable variable of a fixed name, and moves in a job that runs once per step.  A
:class:`StepTransfer` sends ``src_name`` of process ``src`` into ``dst_name`` of process ``dst``
(overwritten in place).  :func:`step_program` builds one process's program for a list of them
in the one order every process uses, for each way of a transport
(:attr:`pipesplit.passes.transport.base.Transport.way`, which calls it):

* broadcast / world ring (gloo, CPU): one ``broadcast_`` on ring 0 per transfer, rooted at the
  sender, every process taking part (a process at neither end broadcasts scratch zeros);
* lockstep (gloo, hybrid meshes): one world gather per transfer, the sender's row kept by the
  receiver; every pipeline's corresponding transfer shares the gather;
* NCCL: ``send_v2`` / ``recv_v2`` on the engine's ring of the pair; processes at neither end
  run nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np
import paddle

from pipesplit.passes.transport import (BROADCAST, LOCKSTEP, NCCL, NCCL_ON_COMPUTE_STREAM, WAYS,
                                       WORLD_RING)
from pipesplit.passes.transport.p2p import CPU_RING_ID
from pipesplit.passes.transport.world_ring import gather_rows


@dataclass(frozen=True)
class StepTransfer:
    """``src_name`` on process ``src`` -> ``dst_name`` on process ``dst``, once per step."""

    src: int
    dst: int
    src_name: str
    dst_name: str
    shape: Tuple[int, ...]
    dtype: str                    # "float32", ...
    value_type: object = None     # the PIR type of both variables (known at the two ends)
    ring: Optional[Tuple[int, Tuple[int, ...]]] = None  # NCCL: the engine's ring of the pair

    def variable(self, block, name: str):
        if self.value_type is None:
            raise ValueError(f"step transfer {self.src_name} -> {self.dst_name}: an end "
                             "needs the variable's type")
        return scope_variable(block, name, self.value_type)


def _place():
    place = paddle.base.libpaddle.Place()
    place.set_place(paddle.framework._current_expected_place())
    return place


def scope_variable(block, name: str, value_type):
    """The persistable variable ``name`` of the scope, as a block input of ``block``."""
    existing = block.kwargs().get(name)
    if existing is not None:
        return existing
    kw = block.add_kwarg(name, value_type)
    kw.persistable = True
    kw.place_attr = _place()
    return kw


def step_program(transfers: Sequence[StepTransfer], process: int, way: str, world: int,
                 zeroed: Iterable[Tuple[str, object]] = (), place=None
                 ) -> Optional["paddle.pir.Program"]:
    """``process``'s program for ``transfers`` (in the order every process uses) on the
    transport's ``way``; ``zeroed``: (name, type) of scope variables it sets to zero afterwards,
    on ``place`` (the transport's device).  None where it has nothing to do (NCCL: a process at
    neither end)."""
    if way not in WAYS:
        raise ValueError(f"way must be one of {WAYS}, got {way!r}")
    zeroed = list(zeroed)
    if zeroed and place is None:
        raise ValueError("step_program: zeroing scope variables needs the device's place")
    mine = [t for t in transfers if process in (t.src, t.dst)]
    if not zeroed and not (mine if way in (NCCL, NCCL_ON_COMPUTE_STREAM) else transfers):
        return None
    program = paddle.pir.Program()
    block = program.global_block()
    with paddle.static.program_guard(program):
        for t in transfers:
            if t.src == t.dst:
                raise ValueError(f"step transfer {t.src_name} -> {t.dst_name} stays on process "
                                 f"{t.src}")
            if way in (BROADCAST, WORLD_RING):
                _broadcast(block, t, process)
            elif way == LOCKSTEP:
                _gather(block, t, process, world)
            elif process in (t.src, t.dst):
                _send_or_recv(block, t, process)
        for name, value_type in zeroed:
            shape = [int(s) for s in value_type.shape]
            paddle._C_ops.full_(scope_variable(block, name, value_type), shape, 0.0,
                                value_type.dtype, place)
    paddle.pir.set_insertion_point_to_block_end(
        paddle.static.default_main_program().global_block())
    return program


def _broadcast(block, t: StepTransfer, process: int) -> None:
    if process == t.src:
        x = t.variable(block, t.src_name)
    elif process == t.dst:
        x = t.variable(block, t.dst_name)
    else:
        x = paddle.full(list(t.shape), 0.0, dtype=t.dtype)
    paddle._C_ops.broadcast_(x, CPU_RING_ID, t.src)


def _gather(block, t: StepTransfer, process: int, world: int) -> None:
    x = t.variable(block, t.src_name) if process == t.src \
        else paddle.full(list(t.shape), 0.0, dtype=t.dtype)
    rows = gather_rows(x, world)
    if process == t.dst:
        paddle._C_ops.assign_out_(rows[t.src], t.variable(block, t.dst_name))


def _send_or_recv(block, t: StepTransfer, process: int) -> None:
    if t.ring is None:
        raise ValueError(f"step transfer {t.src_name} -> {t.dst_name} has no NCCL ring")
    ring_id, ring_ranks = t.ring
    if process == t.src:
        x = t.variable(block, t.src_name)
        paddle._C_ops.send_v2(x, ring_id, list(ring_ranks).index(t.dst), True, False)
        return
    out = paddle._C_ops.recv_v2(list(t.shape), t.value_type.dtype, list(ring_ranks).index(t.src),
                                ring_id, True, False)
    out.set_type(t.value_type)
    paddle._C_ops.assign_out_(out, t.variable(block, t.dst_name))


def create_scope_variables(scope, variables: Iterable[Tuple[str, object]], place) -> None:
    """Create (or zero) each persistable (name, type) of ``variables`` in ``scope``, on
    ``place`` (the transport's :meth:`~pipesplit.passes.transport.base.Transport.device_place`):
    the step programs read and write them in place, so they must hold a tensor of their shape
    before the first step."""
    for name, value_type in variables:
        dtype = str(value_type.dtype).replace("paddle.", "")
        # (Paddle stores bfloat16 from numpy's uint16)
        array = np.zeros([int(s) for s in value_type.shape],
                         dtype=np.uint16 if dtype == "bfloat16" else dtype)
        scope.var(name).get_tensor().set(array, place)

"""The CUDA build's transport: NCCL ``send_v2`` / ``recv_v2`` on the engine's rings.

A per-rank plan makes one p2p ring per pair of pipeline ranks holding adjacent stages and one
ring of every pipeline rank for the optimizer's all-reduces; the engine's plan keeps the rings
Paddle's reshard made.  Sends and recvs run on their own streams, ordered against their
producers and consumers by events (:func:`~.rank_comm.own_jobs_on_streams`), or, without
``enable_send_recv_overlap``, on the compute stream in job order (:func:`~.rank_comm.own_jobs`).  The loss is handed on
through the launcher's TCP store (the engine need not have a world ring).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Iterable, Optional, Tuple

import paddle

from pipesplit.passes.transport import NCCL, NCCL_ON_COMPUTE_STREAM
from pipesplit.passes.transport.base import Transport
from pipesplit.passes.transport.loss_carriers import StoredLoss
from pipesplit.passes.transport.p2p import ring_pair
from pipesplit.passes.transport.rank_comm import own_jobs, own_jobs_on_streams


@dataclass(frozen=True)
class NcclTransport(Transport):
    """NCCL p2p and all-reduces on process groups' rings (see the module docstring)."""

    device = "gpu"
    backend = NCCL
    program_style = NCCL
    #: on streams of their own, tied to their producers and consumers by events (overlap), or
    #: on the compute stream, in job order (``enable_send_recv_overlap = False``)
    RANK_COMM = MappingProxyType({NCCL: own_jobs_on_streams, NCCL_ON_COMPUTE_STREAM: own_jobs})

    @classmethod
    def holds(cls, place) -> bool:
        return isinstance(place, paddle.CUDAPlace)

    @classmethod
    def present(cls) -> bool:
        return paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0

    def device_place(self):
        """This process's GPU (the engine's place: the expected place may be undefined in the
        middle of the engine's build); a CPU build only describes NCCL plans (their structure
        tests) and keeps the values on CPU."""
        if paddle.is_compiled_with_cuda():
            return paddle.CUDAPlace(paddle.distributed.ParallelEnv().device_id)
        return paddle.CPUPlace()

    def rank_place(self, rings: Iterable[int]):
        from paddle.distributed.auto_parallel.static.process_group import get_process_group

        for ring_id in sorted(set(rings)):
            get_process_group(ring_id).instantiate()
        return self.device_place()

    def pick(self, world: int, pp: int, optimizer_exchanges: bool) -> str:
        return NCCL if self.overlap else NCCL_ON_COMPUTE_STREAM

    def p2p_rings(self, schedule) -> Dict[Tuple[int, int], int]:
        """One NCCL p2p ring per pair of ranks holding adjacent stages, created in the same
        order on every rank (Paddle's auto-parallel ``new_process_group``, so ``instantiate()``
        makes the comm contexts the executor looks up by ring id)."""
        from paddle.distributed.auto_parallel.static.process_group import new_process_group

        placement = schedule.placement
        ids = {}
        for s in range(schedule.num_stages - 1):
            a, b = placement.rank_of(s), placement.rank_of(s + 1)
            if a == b:
                continue
            pair = ring_pair(a, b)
            if pair not in ids:
                ids[pair] = new_process_group(list(pair), group_type="p2p").id
        return ids

    def reduce_ring(self, pp: int) -> Optional[int]:
        from paddle.distributed.auto_parallel.static.process_group import new_process_group

        return new_process_group(list(range(pp))).id

    def loss_carrier(self, world: int, capacity: int):
        return StoredLoss()

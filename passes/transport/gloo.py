"""The CPU build's transport: gloo, where one process can use one communicator (ring 0).

Paddle 3.3.1's CPU ``send_v2`` / ``recv_v2`` kernels are stubs, and its CPU executor gives every
collective of a process the comm context of the first ring it meets, so every transfer is a
broadcast (or a world gather) on ring 0.  Its three ways (:meth:`GlooTransport.pick`):

* :data:`~pipesplit.passes.transport.BROADCAST` - two pipeline ranks: a transfer is a broadcast
  rooted at its sender (:mod:`.p2p`);
* :data:`~pipesplit.passes.transport.WORLD_RING` - more than two: every process takes part in
  every broadcast, a bystander job for an exchange between two others (:mod:`.ring_order`);
* :data:`~pipesplit.passes.transport.LOCKSTEP` - dp / mp beside the pipeline, or an optimizer
  exchanging values between more than two pipeline ranks: every collective of every job a world
  gather, all processes in one global order (:mod:`.lockstep`, :mod:`.world_ring`).

The collectives the engine itself needs and the CPU build lacks are pipesplit's stand-ins
(:mod:`pipesplit.passes.cpu_support`: :attr:`GlooTransport.needs_cpu_support`).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import paddle

from pipesplit.job_list.costs import RENDEZVOUS
from pipesplit.passes.transport import BROADCAST, GLOO, LOCKSTEP, WORLD_RING
from pipesplit.passes.transport.base import Transport
from pipesplit.passes.transport.lockstep import lockstep_jobs, ring_ranks
from pipesplit.passes.transport.loss_carriers import GatheredLoss
from pipesplit.passes.transport.p2p import p2p_to_gloo_broadcasts
from pipesplit.passes.transport.rank_comm import own_jobs
from pipesplit.passes.transport.ring_order import world_ring_jobs


@dataclass(frozen=True)
class GlooTransport(Transport):
    """gloo broadcasts and world gathers on ring 0 (see the module docstring)."""

    device = "cpu"
    backend = GLOO
    program_style = GLOO
    comm_mode = RENDEZVOUS        # a gloo transfer blocks both ends until both are there
    counts_progress = True
    needs_cpu_support = True
    measured_on_host = True
    RANK_COMM = MappingProxyType({BROADCAST: own_jobs, WORLD_RING: world_ring_jobs,
                                  LOCKSTEP: lockstep_jobs})

    @classmethod
    def holds(cls, place) -> bool:
        return isinstance(place, paddle.CPUPlace)

    @classmethod
    def present(cls) -> bool:
        return True

    def device_place(self):
        return paddle.CPUPlace()

    def pick(self, world: int, pp: int, optimizer_exchanges: bool) -> str:
        """One process can use one communicator: dp / mp beside the pipeline
        (``world > pp``), or an optimizer exchanging values between more than two pipeline
        ranks, need the lockstep; otherwise more than two ranks take the world ring and two
        the plain broadcast."""
        if world > pp or (pp > 2 and optimizer_exchanges):
            return LOCKSTEP
        return WORLD_RING if pp > 2 else BROADCAST

    def prepare_optimizer(self, optimizer, process: int) -> None:
        """The optimizer runs last on every rank: its exchanges (two ranks; more take the
        lockstep) match as broadcasts on ring 0."""
        p2p_to_gloo_broadcasts(optimizer, process, ring_ranks)

    def loss_carrier(self, world: int, capacity: int):
        return GatheredLoss(world, capacity)

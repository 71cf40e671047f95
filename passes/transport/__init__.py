"""How a plan's sub-programs reach each other across processes, and which way a plan takes.

* :mod:`.p2p` - the comm programs: transfers between stages as NCCL send / recv, or, on CPU,
  as gloo broadcasts (one communicator per process: ring 0);
* :mod:`.ring_order` - the CPU world ring beyond two pipeline ranks (every process takes part
  in every exchange, at its place in the plan opening's global order);
* :mod:`.world_ring`, :mod:`.lockstep` - the CPU lockstep of hybrid meshes (dp / mp beside
  pp): every collective a world gather, every process in one global order of every job;
* :mod:`.progress` - the comm progress a failed or stuck step is named by;
* :mod:`.launch_store` - the launcher's TCP store the processes exchange shapes and costs
  through, and the round of each exchange.

:func:`pick_transport` is the one rule that picks among them for a plan.
"""
from __future__ import annotations

#: NCCL send / recv on the engine's rings (a CUDA build)
NCCL = "nccl"
#: gloo broadcasts on ring 0 between the two pipeline ranks
BROADCAST = "broadcast"
#: gloo broadcasts on ring 0, every process taking part in every exchange (pp > 2)
WORLD_RING = "world_ring"
#: every collective of every job a world gather, all processes in one global order
LOCKSTEP = "lockstep"
TRANSPORTS = (NCCL, BROADCAST, WORLD_RING, LOCKSTEP)


def pick_transport(backend: str, world_size: int, pp: int,
                   optimizer_exchanges: bool = False) -> str:
    """The transport of a plan for ``pp`` pipeline ranks among ``world_size`` processes.

    ``backend`` "nccl" is :data:`NCCL`.  On CPU ("gloo") one process can use one communicator:
    dp / mp beside the pipeline (``world_size > pp``), or an optimizer exchanging values between
    more than two pipeline ranks (``optimizer_exchanges``: the global norm of
    ``ClipGradByGlobalNorm``), need the :data:`LOCKSTEP`; otherwise more than two ranks take
    the :data:`WORLD_RING` and two the plain :data:`BROADCAST`."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":
        return NCCL
    if world_size > pp or (pp > 2 and optimizer_exchanges):
        return LOCKSTEP
    return WORLD_RING if pp > 2 else BROADCAST

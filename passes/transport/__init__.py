"""Between processes: everything that moves from one process of a launch to another.

One :class:`~.base.Transport` per device type owns it (:mod:`.devices` holds the registry,
device type -> class, and the one rule that names the device a process runs on):

* :mod:`.base` - the :class:`~.base.Transport` base class: what every device type answers;
* :mod:`.gloo` - :class:`~.gloo.GlooTransport` (CPU builds): its ways :data:`BROADCAST`,
  :data:`WORLD_RING` and :data:`LOCKSTEP`, and the CPU build's missing collectives;
* :mod:`.nccl` - :class:`~.nccl.NcclTransport` (CUDA builds): the engine's NCCL rings;
* :mod:`.p2p` - the comm programs: transfers between stages as NCCL send / recv, or, on CPU,
  as gloo broadcasts (one communicator per process: ring 0);
* :mod:`.ring_order` - the CPU world ring beyond two pipeline ranks (every process takes part
  in every exchange, at its place in the plan opening's global order);
* :mod:`.world_ring`, :mod:`.lockstep` - the CPU lockstep of hybrid meshes (dp / mp beside
  pp): every collective a world gather, every process in one global order of every job;
* :mod:`.step_exchange` - values sent once per step (a parameter another stage reads);
* :mod:`.loss_carriers` - the step's loss handed from one process to another;
* :mod:`.progress` - the comm progress a failed or stuck step is named by;
* :mod:`.launch_store`, :mod:`.rendezvous` - the launcher's TCP store the processes exchange
  shapes and costs through, the round of each exchange, and the bounded rendezvous.

This module holds the names only (it imports nothing, so every module of the package can
import it).  Outside this package no code names a backend by its string: Paddle's APIs that
want one get :data:`GLOO` / :data:`NCCL`, and everything else asks the transport.
"""
from __future__ import annotations

#: Paddle's name of the CPU collective backend (``PADDLE_DISTRI_BACKEND``, ``new_group``)
GLOO = "gloo"
#: Paddle's name of the CUDA collective backend; also the NCCL transport's one way: send /
#: recv on the engine's rings
NCCL = "nccl"
#: the collective backends pipesplit builds for (tests/test_architecture.py reads this line:
#: no other package names them)
BACKENDS = (GLOO, NCCL)

# The ways a plan's processes reach each other (``Transport.way``, chosen per plan by
# ``Transport.for_plan``):
#: gloo broadcasts on ring 0 between the two pipeline ranks
BROADCAST = "broadcast"
#: gloo broadcasts on ring 0, every process taking part in every exchange (pp > 2)
WORLD_RING = "world_ring"
#: every collective of every job a world gather, all processes in one global order
LOCKSTEP = "lockstep"
#: NCCL send / recv on the compute stream, in job order (``enable_send_recv_overlap`` False)
NCCL_ON_COMPUTE_STREAM = "nccl_on_compute_stream"
WAYS = (NCCL, NCCL_ON_COMPUTE_STREAM, BROADCAST, WORLD_RING, LOCKSTEP)

"""The :class:`Transport`: what moves between the processes of a launch, for one device type.

A transport is chosen once per engine (and once per plan a per-rank builder makes) from the
device the process runs on (:func:`pipesplit.passes.transport.devices.transport_for`, the
registry), and refined per plan by the plan's shape (:meth:`Transport.for_plan`: world size,
pipeline ranks, whether the optimizer exchanges values between them).  The plan builders
(:mod:`pipesplit.passes.split.per_rank`, :mod:`pipesplit.passes.engine.engine_rank`) and the
engine's hooks (:class:`~pipesplit.passes.engine.state.EngineState`'s ``transport``) ask it, and
nothing outside this package names a backend:

* one rank's comm jobs, built by the handler of the plan's way
  (:meth:`~Transport.rank_comm`, :attr:`~Transport.RANK_COMM`: :mod:`.rank_comm`), from the
  comm programs (:meth:`~Transport.comm_program`, :meth:`~Transport.p2p_rings`,
  :attr:`~Transport.counts_progress`);
* the optimizer's collectives: :meth:`~Transport.reduce_ring`,
  :meth:`~Transport.all_reduce_sum`, :meth:`~Transport.prepare_optimizer`;
* the step exchanges (:meth:`~Transport.step_program`) and the loss hand-off
  (:meth:`~Transport.loss_carrier`);
* the collectives the build lacks (:attr:`~Transport.needs_cpu_support`: the stand-ins of
  :mod:`pipesplit.passes.cpu_support`);
* the rendezvous of all processes and the exchange of values between them
  (:meth:`~Transport.rendezvous`, :meth:`~Transport.share`) and how a measured transfer is
  simulated (:attr:`~Transport.comm_mode`);
* the device's place (:meth:`~Transport.device_place`, :meth:`~Transport.rank_place`).

A subclass per device type answers these; :mod:`.devices` registers it under its device type.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, ClassVar, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from pipesplit.job_list.costs import LATENCY
from pipesplit.passes.transport import WAYS, p2p
from pipesplit.passes.transport import rendezvous as meeting
from pipesplit.passes.transport import step_exchange


@dataclass(frozen=True)
class Transport:
    """The transport of one device type; with :attr:`way` set (:meth:`for_plan`), of one plan.

    Subclasses set the class attributes and override what their device does differently."""

    #: the plan's way (one of :data:`~pipesplit.passes.transport.WAYS`); None before
    #: :meth:`for_plan` (the engine's transport, before a plan is built)
    way: Optional[str] = None
    #: the processes of the launch, as :meth:`for_plan` was given them
    world: Optional[int] = None
    #: transfers on streams of their own, overlapping compute, where the device has such
    #: streams (``strategy.pipeline.enable_send_recv_overlap``; a per-rank plan's default)
    overlap: bool = True

    #: the device type this class serves (:func:`~.devices.resolve_device`'s answer): its key
    #: in the registry
    device: ClassVar[str] = ""
    #: Paddle's name of the collective backend (what its process groups take)
    backend: ClassVar[str] = ""
    #: the comm programs :mod:`.p2p` builds for it (its ``backend`` argument): GLOO's
    #: broadcasts on ring 0 or NCCL's send / recv and all-reduces on process groups' rings
    program_style: ClassVar[str] = ""
    #: how the simulator prices a measured transfer (``job_list.costs.COMM_MODES``)
    comm_mode: ClassVar[str] = LATENCY
    #: the comm programs bump the progress counter a failed or stuck step is named by
    counts_progress: ClassVar[bool] = False
    #: the plan's way -> what builds one rank's comm jobs on it, ``handler(transport,
    #: rank_programs) -> RankComm`` (:mod:`.rank_comm`); the ways :meth:`pick` gives
    RANK_COMM: ClassVar[Mapping[str, Callable]] = MappingProxyType({})
    #: the engine needs pipesplit's stand-ins for the collectives the build lacks
    #: (:mod:`pipesplit.passes.cpu_support`) before it can start a pipeline
    needs_cpu_support: ClassVar[bool] = False
    #: a job's host time is its cost and the host allocator's bytes its memory (a CPU
    #: build): what the engine's measured step and a memory budget read
    #: (:mod:`pipesplit.passes.engine.user_options`)
    measured_on_host: ClassVar[bool] = False

    # ----------------------------------------------------------------- the device

    @classmethod
    def holds(cls, place) -> bool:
        """Whether Paddle's expected ``place`` is this device's."""
        return False

    @classmethod
    def present(cls) -> bool:
        """Whether this build and machine have the device (asked when the place says neither
        device)."""
        return False

    def device_place(self):
        """The place of the tensors this process keeps (the step exchanges' scope variables)."""
        raise NotImplementedError

    def rank_place(self, rings: Iterable[int]):
        """The place a per-rank plan runs on, once the comm contexts of ``rings`` (its p2p and
        all-reduce rings, made in the same order on every rank) exist."""
        return self.device_place()

    # ----------------------------------------------------------------- the plan's way

    def pick(self, world: int, pp: int, optimizer_exchanges: bool) -> str:
        """The way ``pp`` pipeline ranks among ``world`` processes reach each other;
        ``optimizer_exchanges``: the optimizer exchanges values between pipeline ranks (the
        global norm of ``ClipGradByGlobalNorm``)."""
        raise NotImplementedError

    def for_plan(self, world: int, pp: int, optimizer_exchanges: bool = False) -> "Transport":
        """This transport with the way of one plan chosen (:meth:`pick`)."""
        way = self.pick(world, pp, optimizer_exchanges)
        if way not in WAYS:
            raise ValueError(f"{type(self).__name__}.pick gave {way!r}, not one of {WAYS}")
        if way not in self.RANK_COMM:
            raise ValueError(f"{type(self).__name__}.pick gave {way!r}, which its RANK_COMM "
                             f"has no handler for (it has {sorted(self.RANK_COMM)})")
        return replace(self, way=way, world=world)

    def with_overlap(self, overlap: bool) -> "Transport":
        """This transport with transfers overlapping compute (:attr:`overlap`) or not."""
        return replace(self, overlap=overlap)

    def _planned(self) -> str:
        if self.way is None:
            raise ValueError(f"{type(self).__name__}: no plan's way chosen yet (for_plan)")
        return self.way

    # ----------------------------------------------------------------- comm programs

    def p2p_rings(self, schedule) -> Dict[Tuple[int, int], int]:
        """The p2p ring of each pair of pipeline ranks holding adjacent stages of a per-rank
        plan (none where the transport needs no ring per pair)."""
        return {}

    def rank_comm(self, rank_programs):
        """One rank's comm programs (into ``rank_programs.programs``), job order and comm jobs
        (a :class:`~.rank_comm.RankComm`), as this plan's way builds them
        (:attr:`RANK_COMM`); ``rank_programs``: the builder's
        :class:`~.rank_comm.RankPrograms`."""
        return self.RANK_COMM[self._planned()](self, rank_programs)

    def comm_program(self, transfers, rank: int, *,
                     ring_ids: Optional[Dict[Tuple[int, int], int]] = None,
                     progress: bool = False):
        """(program, comm ops) of one comm job (:func:`~.p2p.build_comm_program`); ``progress``:
        the plan counts progress (where the transport does)."""
        return p2p.build_comm_program(transfers, rank, self.program_style, ring_ids=ring_ids,
                                      progress=progress and self.counts_progress,
                                      own_streams=self.overlap)

    def prepare_optimizer(self, optimizer, process: int) -> None:
        """Make the engine's optimizer program's own exchanges (clipping's norms) runnable on
        this transport, in place."""

    def reduce_ring(self, pp: int) -> Optional[int]:
        """The ring of every pipeline rank an optimizer's all-reduce uses (made on first use);
        None where the transport has one communicator."""
        return None

    def all_reduce_sum(self, x, ring_id: Optional[int]):
        """The all-reduced (sum) PIR value ``x`` over ``ring_id``
        (:func:`~.p2p.all_reduce_sum`)."""
        return p2p.all_reduce_sum(x, self.program_style, ring_id)

    # ----------------------------------------------------------------- step exchanges, loss

    def step_program(self, transfers: Sequence, process: int, zeroed: Iterable = ()):
        """``process``'s program of the step exchanges ``transfers`` on this plan's way
        (:func:`~.step_exchange.step_program`), or None."""
        zeroed = list(zeroed)
        return step_exchange.step_program(transfers, process, self._planned(), self.world,
                                          zeroed, place=self.device_place() if zeroed else None)

    def loss_carrier(self, world: int, capacity: int):
        """What hands a step's loss from one process to another
        (:mod:`~.loss_carriers`); ``capacity``: the values it must hold."""
        raise NotImplementedError

    # ----------------------------------------------------------------- all processes at once

    def share(self, value: dict, key: str, store=None) -> list:
        """Every process's ``value``, on every process (:func:`~.rendezvous.share`)."""
        return meeting.share(value, key, store)

    def rendezvous(self, key: str, phase: str, rank: int, world: int, store=None) -> float:
        """All processes at ``key`` (:func:`~.rendezvous.rendezvous`): the seconds waited."""
        return meeting.rendezvous(key, phase, rank, world, store)

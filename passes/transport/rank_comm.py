"""One rank's comm jobs, for both rank builders: what turns a rank's compute programs and its
lowered list into comm programs, a job order and the order of its comm jobs.

A builder (:mod:`pipesplit.passes.split.per_rank`, the whole model split per rank;
:mod:`pipesplit.passes.engine.engine_rank`, the engine's per-rank program) describes its rank
as :class:`RankPrograms`: its programs, the transfers of each send / recv job, and where the
values a transfer carries are produced and read (:class:`EventSites`).  The plan's transport
answers it (:meth:`~pipesplit.passes.transport.base.Transport.rank_comm`) with a
:class:`RankComm`, through its table from the plan's way to the handler that builds it
(``Transport.RANK_COMM``, as DeepSpeed's pipeline engine maps an instruction to its
handler):

* :func:`own_jobs` - a comm program per kind and chunk, the rank's lowered order with every
  comm job's peer checked against its program's (gloo's broadcast);
* :func:`own_jobs_on_streams` - the same, each send / recv tied to its producer / consumers by
  stream events (NCCL);
* ``ring_order.world_ring_jobs`` - the same, with a bystander job for every exchange between
  two other ranks (gloo's world ring);
* ``lockstep.lockstep_jobs`` - every collective a world gather, in one global order (gloo's
  lockstep).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from pipesplit.job_list import OPTIMIZER
from pipesplit.job_list.ir import COMM_KINDS, SEND_BACKWARD, SEND_FORWARD, job_type
from pipesplit.job_list.lower import peer_of
from pipesplit.job_list.opening import OpenedSchedule
from pipesplit.job_list.pipe import Pipe
from pipesplit.passes.transport.p2p import Transfer, add_event_dependency
from pipesplit.passes.transport.progress import CommProgress


class EventSites:
    """Where a transfer's value is made and read, as a builder knows its programs: the ops a
    stream event ties a send / recv to, each with the event's name.  Asked only by a transport
    that orders its comm ops by events."""

    def before_send(self, kind: str, chunk: int, transfer: Transfer
                    ) -> Iterable[Tuple[object, str]]:
        """(producer op, event) pairs: the send of ``transfer`` waits for each event."""
        raise NotImplementedError

    def after_recv(self, kind: str, chunk: int, transfer: Transfer
                   ) -> Iterable[Tuple[object, str]]:
        """(consumer op, event) pairs: each consumer waits for the recv's event."""
        raise NotImplementedError


@dataclass
class RankPrograms:
    """What a rank builder hands its plan's transport."""

    rank: int                            # the pipeline rank
    pipe: Pipe                           # which process runs each pipeline rank
    opened: OpenedSchedule               # the plan's schedule, lowered, and its global order
    num_chunks: int                      # the rank's local chunks
    # the rank's compute programs by local job type; the comm (and bystander) programs are
    # added here.  An optimizer already among them is the engine's: its own exchanges
    # (clipping's norms) are made runnable on the transport (Transport.prepare_optimizer)
    programs: Dict[str, object]
    transfers_of: Callable[[str, int], List[Transfer]]   # (kind, local chunk) -> its transfers
    # every cross-rank transfer of the step, on every rank (asked by the CPU world ring only)
    step_transfers: Callable[[], List[Transfer]]
    event_sites: EventSites
    ring_ids: Optional[Dict[Tuple[int, int], int]] = None   # per-rank plans' p2p rings
    progress: bool = True                # the comm programs count progress (where it is counted)

    @property
    def process(self) -> int:
        return self.pipe.process_of(self.rank)


@dataclass
class CommJobInfo:
    """What one comm job type of this rank carries."""

    job_type: str
    peer: Optional[int]                  # the process at the other end (None: no transfer)
    transfers: List[Transfer]


@dataclass
class RankComm:
    """A transport's answer: the rank's job order (without the optimizer) and its comm jobs."""

    job_order: List[Tuple[str, int]]
    # (job type, micro-batch, peer pipeline rank); a bystander job's peer is its exchange's
    # sender
    comm_sequence: List[Tuple[str, int, Optional[int]]] = field(default_factory=list)
    # the CPU world ring: bystander job type -> (sender, receiver) pipeline ranks
    bystanders: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    comm: Dict[str, CommJobInfo] = field(default_factory=dict)
    counted: bool = False                # the comm programs bump the progress counter

    def comm_progress(self, pipe: Pipe) -> CommProgress:
        """The comm jobs a failed or stuck step is named by, in processes (as the user's
        launcher names them); none where the comm programs count no progress."""
        if not self.counted:
            return CommProgress()
        process_of = pipe.process_of
        return CommProgress(
            [(t, mb, None if peer is None else process_of(peer))
             for t, mb, peer in self.comm_sequence],
            {t: (process_of(a), process_of(b)) for t, (a, b) in self.bystanders.items()})


def own_jobs(transport, rank: RankPrograms) -> RankComm:
    """A comm program per comm kind and local chunk (into ``rank.programs``) and the rank's own
    lowered order; ``transport``: the plan's."""
    return _own_jobs(transport, rank, tie=None)


def own_jobs_on_streams(transport, rank: RankPrograms) -> RankComm:
    """:func:`own_jobs`, each send waiting for its value's producer and each received value's
    consumers waiting for its recv, by stream events (sends and recvs run on streams of their
    own)."""
    return _own_jobs(transport, rank, tie=_add_stream_events)


def _own_jobs(transport, rank: RankPrograms, tie) -> RankComm:
    optimizer = rank.programs.get(OPTIMIZER)
    if optimizer is not None:
        transport.prepare_optimizer(optimizer, rank.process)
    comm = _comm_programs(transport, rank, tie)
    job_order, comm_sequence = _own_order(rank, comm)
    return RankComm(job_order, comm_sequence, comm=comm, counted=transport.counts_progress)


def _comm_programs(transport, rank: RankPrograms, tie) -> Dict[str, CommJobInfo]:
    """A send / recv program for every comm kind of every local chunk, into ``rank.programs``;
    returns what each one exchanges with whom."""
    process = rank.process
    comm: Dict[str, CommJobInfo] = {}
    for chunk in range(rank.num_chunks):
        for kind in COMM_KINDS:
            t = job_type(kind, chunk)
            sel = rank.transfers_of(kind, chunk)
            rank.programs[t], comm_ops = transport.comm_program(
                sel, process, ring_ids=rank.ring_ids, progress=rank.progress and bool(sel))
            comm[t] = CommJobInfo(t, _other_end(sel[0], process) if sel else None, sel)
            if tie is not None:
                tie(rank.event_sites, kind, chunk, sel, comm_ops)
    return comm


def _other_end(transfer: Transfer, process: int) -> int:
    return transfer.dst if transfer.src == process else transfer.src


def _own_order(rank: RankPrograms, comm: Dict[str, CommJobInfo]):
    """(job order without the optimizer, comm sequence) of the rank's lowered list; every comm
    job's peer in the lowering must be its program's."""
    schedule = rank.opened.schedule
    job_order, comm_sequence = [], []
    for job in rank.opened.lowered.ranks[rank.rank]:
        if job.kind == OPTIMIZER:
            continue
        job_order.append((job.type, job.micro_batch))
        if job.is_comm:
            peer = peer_of(schedule, rank.rank, job)
            transfers = comm[job.type].transfers
            peers = {_other_end(t, rank.process) for t in transfers}
            if transfers and peers != {rank.pipe.process_of(peer)}:
                raise AssertionError(f"{job.type}: program peers {peers} != lowering's "
                                     f"{rank.pipe.process_of(peer)}")
            comm_sequence.append((job.type, job.micro_batch, peer))
    return job_order, comm_sequence


def _add_stream_events(sites: EventSites, kind: str, chunk: int, transfers, comm_ops) -> None:
    """Producer op -> send op, and recv op -> every consumer op, as event dependencies."""
    sending = kind in (SEND_FORWARD, SEND_BACKWARD)
    for t, comm_op in zip(transfers, comm_ops):
        if sending:
            for producer, event in sites.before_send(kind, chunk, t):
                add_event_dependency(producer, comm_op, event)
        else:
            for consumer, event in sites.after_recv(kind, chunk, t):
                add_event_dependency(comm_op, consumer, event)

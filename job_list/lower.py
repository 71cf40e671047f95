"""Comm lowering: insert send / recv jobs into a compute-only schedule.

Every dependency between compute jobs on different ranks becomes one send on the producer's rank
and one matching recv on the consumer's rank.  Adjacent stages on one rank (the V placement's
turn at rank pp-1) need nothing.

The order must be deadlock-free even under *rendezvous* semantics (a send blocks until the peer
posts the matching recv, as with blocking gloo p2p).  So all ranks are merged into one global
order of the compute jobs (a topological order that follows the simulated start times, ties by
rank then position), and each send / recv pair is one atomic event placed at a simulated time
(before compute jobs starting at that same time).  Every rank's list is then a subsequence of
one sequential execution, so running it can never block.

When a pair is due: at the producer's end, or *later where both ranks have slack* -- up to the
consumer's start and the producer rank's next compute start, whichever comes first
(:func:`_pair_time`).  Waiting there delays no simulated job, and the receiver allocates the
buffer after the compute jobs it runs meanwhile instead of holding it through them: at pp 2,
1F1B's last stage received micro-batch 1's input before its first backward, one activation more
at its peak than Paddle's own 1F1B, which receives after it (issue 58).  The sender holds its
buffer no longer while computing: it runs nothing between the producer and the pair.

Why not just before the consumer: with blocking pairs, a send placed late sits behind the
producer's next jobs and the consumer waits for all of them; placed early, at worst the producer
waits for the consumer's current job.  Timing the lowered lists with rendezvous pairs over the
classic schedules (pp 2-8, vpp 1-4, comm 0 and 0.3) gave 1.18x the simulated makespan at the
producer's end against 1.42x just before the consumer.  The slack rule keeps every rendezvous
makespan of those schedules at comm 0; with comm > 0 a deferred pair no longer overlaps the
receiver's job (of 918 configurations with comm 0.1-0.5: 78 slower, by up to 3.5 %, 56 faster),
so under rendezvous costs the lowering at the producer's end is a candidate too
(:func:`lower_with_order`).

``chunk`` of a comm job is the chunk *on its own rank* the data belongs to: send_forward(c) ships
chunk c's output, recv_forward(c) brings chunk c's input, send_backward(c) ships chunk c's input
gradient, recv_backward(c) brings chunk c's output gradient.
"""
from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Tuple

from .deps import DependencyGraph
from .ir import (FORWARD, OPTIMIZER, RECV_BACKWARD, RECV_FORWARD, SEND_BACKWARD, SEND_FORWARD,
                 Job, Schedule, other_end)
from .costs import Costs
from .events import execute
from .latency import SimResult, key_costs, simulate_latency
from .validate import ScheduleError, validate

RankJob = Tuple[int, Job]
#: where a compute job sits: (rank, index in that rank's compute list); generators' ``Slot`` is
#: (chunk, micro-batch), a different thing
Position = Tuple[int, int]


def comm_kinds(producer: Job) -> Tuple[str, str]:
    """(send kind, recv kind) carrying ``producer``'s output across ranks: a forward feeds the
    next stage's forward, a B / I feeds the previous stage's B / I."""
    return (SEND_FORWARD, RECV_FORWARD) if producer.kind == FORWARD else (SEND_BACKWARD, RECV_BACKWARD)


def peer_of(schedule: Schedule, rank: int, job: Job) -> int:
    """The rank at the other end of the send / recv ``job`` on ``rank``."""
    if not job.is_comm:
        raise ValueError(f"peer_of needs a send / recv job, got {job} on rank {rank}")
    peer_stage, _ = other_end(job.kind, schedule.placement.stage(rank, job.chunk))
    if not 0 <= peer_stage < schedule.num_stages:
        raise ValueError(f"{schedule.to_action(rank, job)} on rank {rank} has no peer: stage "
                         f"{peer_stage} is outside [0, {schedule.num_stages})")
    return schedule.placement.rank_of(peer_stage)


def lower_comm(schedule: Schedule, costs: Optional[Costs] = None, *,
               timing: Optional[SimResult] = None, defer: Optional[bool] = None) -> Schedule:
    """A lowered copy of ``schedule`` with send / recv jobs for every cross-rank dependency.

    ``costs`` only steer where the pairs go (through the times the latency model simulates,
    whatever ``costs.comm_mode``); any costs give a deadlock-free result.  ``timing``, a
    ``simulate(schedule, costs)`` result the caller already has, saves simulating again.
    ``defer``: pairs due in both ranks' slack after their producer (True) or at its end
    (False); None: deferred, or under rendezvous costs whichever is faster
    (:func:`lower_with_order`).  A lowered input is re-lowered from its compute jobs.
    """
    return lower_with_order(schedule, costs, timing=timing, defer=defer)[0]


def lower_with_order(schedule: Schedule, costs: Optional[Costs] = None, *,
                     timing: Optional[SimResult] = None, defer: Optional[bool] = None
                     ) -> Tuple[Schedule, List[RankJob]]:
    """:func:`lower_comm` and, from the same lowering, :func:`global_order`'s sequence (a plan
    opening needs both; neither is worked out twice).

    Under blocking transfers (``costs.comm_mode == "rendezvous"``) the lowering steered by the
    costs' own times is timed against the one steered by equal times (:data:`EQUAL_STEERING`),
    with blocking pairs, and the faster is kept: measured times with extremes (a first stage's
    input gradient of 0.01 ms beside its 67 ms W) steer a send behind a compute job its peer
    waits for, and the same compute order ran 4 % slower in the rendezvous model (542.6
    against 520.4 ms, ZBH1's order at pp 2, m = 4, with the costs ``auto`` measured).  Unless
    ``defer`` says which, each steering is lowered twice, pairs deferred into the slack and at
    the producer's end (:func:`_pair_time`), and the fastest of the four is kept, the deferred
    one on a tie (it holds fewer received buffers)."""
    if defer is not None and not isinstance(defer, bool):
        raise TypeError(f"defer must be None or a bool, got {defer!r}")
    ways = [(steering, deferred) for steering in (costs, EQUAL_STEERING)
            for deferred in (True, False) if defer is None or deferred == defer]
    ranks, sequence = _lower(schedule, costs, timing, ways[0][1])
    if costs is not None and costs.rendezvous:
        best = _rendezvous_span(schedule, ranks, costs)
        for steering, deferred in ways[1:]:
            other_ranks, other_sequence = _lower(schedule, steering,
                                                 timing if steering is costs else None, deferred)
            span = _rendezvous_span(schedule, other_ranks, costs)
            if span < best:
                best, ranks, sequence = span, other_ranks, other_sequence
    return schedule.with_ranks(ranks, lowered=True), sequence


#: the other steering a lowering under blocking transfers is timed against: equal job times
EQUAL_STEERING = Costs()


def _rendezvous_span(schedule: Schedule, ranks: List[List[Job]], costs: Costs) -> float:
    """The makespan of ``ranks`` (lowered lists of ``schedule``) with blocking send / recv
    pairs under ``costs`` (the rendezvous simulation's walk)."""
    lowered = schedule.with_ranks(ranks, lowered=True)
    graph = DependencyGraph(lowered)
    execution = execute(lowered, graph, cost=key_costs(costs, graph.keys),
                        comm=float(costs.comm))
    if not execution.state.finished:  # (a lowering never blocks: it is one sequential run)
        raise ScheduleError(f"a lowering of {schedule.name} blocks under rendezvous transfers")
    return max(execution.state.clock)


def global_order(schedule: Schedule, costs: Optional[Costs] = None) -> List[RankJob]:
    """One sequential execution of all ranks' lowered jobs (a send is directly followed by its
    recv), e.g. to run every rank in one process.

    A compute-only schedule is lowered first (as :func:`lower_comm` with ``costs``); a lowered
    one is replayed as given, raising :class:`~.validate.ScheduleError` if it cannot finish.
    """
    if any(job.is_comm for jobs in schedule.ranks for job in jobs):
        return _replay(schedule)
    return _lower(schedule, costs)[1]


# --------------------------------------------------------------------------- pieces

def _lower(schedule: Schedule, costs: Optional[Costs], timing: Optional[SimResult] = None,
           defer: bool = True) -> Tuple[List[List[Job]], List[RankJob]]:
    """(per-rank lowered lists, merged global sequence); ``defer``: pairs due in the slack
    after their producer (:func:`_pair_time`), else at its end."""
    compute = schedule.with_ranks([[j for j in jobs if j.is_compute] for jobs in schedule.ranks],
                                  lowered=False)
    graph = DependencyGraph(compute)
    # the times of the latency model steer (the rendezvous simulation itself lowers first)
    if (timing is None or timing.schedule.ranks != compute.ranks
            or timing.costs.rendezvous):
        timing = simulate_latency(compute, costs)  # raises ScheduleError if the compute order deadlocks
    starts: List[List[float]] = [[0.0] * len(jobs) for jobs in compute.ranks]
    ends: List[List[float]] = [[0.0] * len(jobs) for jobs in compute.ranks]
    for row in timing.timeline:
        for t in row:
            starts[t.rank][t.index], ends[t.rank][t.index] = t.start, t.end
    events = _comm_pairs(compute, graph, starts if defer else None, ends)
    # Per position (rank, index): its comm pairs not yet emitted, and the ids of the pairs it feeds.
    pending = [[0] * len(jobs) for jobs in compute.ranks]
    by_producer: List[List[Optional[List[int]]]] = [[None] * len(jobs) for jobs in compute.ranks]
    for ident, (_, (dep_rank, dep_index), (rank, index)) in enumerate(events):
        pending[rank][index] += 1
        fed = by_producer[dep_rank][dep_index]
        if fed is None:
            fed = by_producer[dep_rank][dep_index] = []
        fed.append(ident)
    comm_job = _job_maker()

    # Kahn's algorithm over compute jobs and comm pairs, smallest key first: a plain sort by time
    # could put a zero-cost producer after its consumer on a lower rank.  A rank's head job is
    # queued once, when it has no comm pair left to wait for; it leaves the heap as it runs.
    head = [0] * compute.pp
    queued = [-1] * compute.pp  # index of the job of each rank now in the heap
    ready: List[tuple] = []

    def offer(rank: int) -> None:
        index = head[rank]
        if (index < len(compute.ranks[rank]) and not pending[rank][index]
                and queued[rank] != index):
            queued[rank] = index
            heapq.heappush(ready, (starts[rank][index], 1, rank, index, -1))

    for rank in range(compute.pp):
        offer(rank)
    ranks: List[List[Job]] = [[] for _ in range(compute.pp)]
    sequence: List[RankJob] = []
    while ready:
        _, _, rank, index, ident = heapq.heappop(ready)
        if ident >= 0:  # a comm pair, atomically: send on the producer, recv on the consumer
            _, (dep_rank, dep_index), _ = events[ident]
            dep = compute.ranks[dep_rank][dep_index]
            job = compute.ranks[rank][index]
            send_kind, recv_kind = comm_kinds(dep)
            for who, comm in ((dep_rank, comm_job(send_kind, dep.chunk, dep.micro_batch)),
                              (rank, comm_job(recv_kind, job.chunk, job.micro_batch))):
                ranks[who].append(comm)
                sequence.append((who, comm))
            pending[rank][index] -= 1
            offer(rank)
            continue
        job = compute.ranks[rank][index]
        ranks[rank].append(job)
        sequence.append((rank, job))
        head[rank] += 1
        offer(rank)
        for ident in by_producer[rank][index] or ():
            heapq.heappush(ready, events[ident][0])
    if sum(head) != sum(len(jobs) for jobs in compute.ranks):  # simulate() would have raised
        raise AssertionError("comm lowering left compute jobs unplaced")
    # The optimizer (neither compute nor comm) stays last on its rank.
    for rank, jobs in enumerate(schedule.ranks):
        for job in jobs:
            if job.kind == OPTIMIZER:
                ranks[rank].append(job)
                sequence.append((rank, job))
    return ranks, sequence


def _job_maker():
    """``make(kind, chunk, micro_batch)``: a Job, one shared instance per distinct job (Jobs are
    frozen; building one runs its argument checks, and lowering makes two per pair)."""
    made: Dict[Tuple[str, int, int], Job] = {}

    def make(kind: str, chunk: int, micro_batch: int) -> Job:
        job = made.get((kind, chunk, micro_batch))
        if job is None:
            job = made[(kind, chunk, micro_batch)] = Job(kind, chunk, micro_batch)
        return job

    return make


def _comm_pairs(compute: Schedule, graph: DependencyGraph, starts: Optional[List[List[float]]],
                ends: List[List[float]]) -> List[Tuple[tuple, Position, Position]]:
    """One (heap key, producer, consumer) per cross-rank dependency, as (rank, index) positions.

    The key is the latest time the pair delays no simulated job (:func:`_pair_time`; without
    ``starts``, the producer's end), and the pair goes before compute jobs starting at that
    same time (0 < 1 in the key's second field).
    The producer is the last job with the dependency's key (there is one unless the schedule
    repeats a job).
    """
    where: List[Position] = [(-1, -1)] * len(graph.keys)  # key id -> its last position
    for rank, ids in enumerate(graph.key_ids):
        for index, kid in enumerate(ids):
            where[kid] = (rank, index)
    events = []
    for rank, deps_row in enumerate(graph.dependency_table()):
        for index, deps in enumerate(deps_row):
            for dep, dep_rank in deps:
                if dep >= 0 and dep_rank != rank:
                    producer = where[dep]
                    due = (ends[producer[0]][producer[1]] if starts is None else
                           _pair_time(compute, starts, ends, producer, (rank, index)))
                    key = (due, 0, rank, index, len(events))
                    events.append((key, producer, (rank, index)))
    return events


def _pair_time(compute: Schedule, starts: List[List[float]], ends: List[List[float]],
               producer: Position, consumer: Position) -> float:
    """When a pair is due: the producer's end, or later where both ranks have slack then -- up
    to the consumer's start and the producer rank's next compute start, whichever is first
    (the module doc says why)."""
    (p_rank, p_index), (c_rank, c_index) = producer, consumer
    due = ends[p_rank][p_index]
    latest = starts[c_rank][c_index]
    if p_index + 1 < len(compute.ranks[p_rank]):
        latest = min(latest, starts[p_rank][p_index + 1])
    return max(due, latest)


def _replay(schedule: Schedule) -> List[RankJob]:
    """Run a lowered schedule sequentially under rendezvous semantics, lowest rank first."""
    validate(schedule)  # names the deadlock, if any; below cannot then get stuck
    sequence: List[RankJob] = []
    if not execute(schedule, record=sequence.append).state.finished:
        raise ScheduleError("lowered schedule cannot finish (validate passed; inconsistent input)")
    return sequence

"""The one dependency / event engine: every rank runs its list in order; a job starts when its
rank is free and every job it needs is done (plus the latency ``comm`` when that job ran on
another rank).  :func:`simulate.simulate`, :meth:`SearchContext.simulate`, the validator's
symbolic execution and the comm lowering's replay are all :func:`walk` on integer tables;
:func:`execute` runs a whole schedule (compute-only or lowered, with rendezvous send / recv
pairs) through it.

Tables: ``orders[rank]`` lists the ids a rank runs (-1: an entry that is no compute job, e.g.
a send / recv / optimizer, handed to the ``other`` hook); ``needs[id]`` is a tuple of
(id, rank of that job) it waits for; ``cost[id]`` its duration (zeros for an execution order
without times).  An id can stand for something other than a job, e.g. "the data of job d has
arrived on rank r" in a lowered schedule: the ``other`` hook of a recv marks it done.

Also the memory walks over an executed order (:func:`serial_memory`, :func:`rank_peaks`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .deps import DependencyGraph, JobKey
from .ir import COMM_KINDS, OPTIMIZER, RECV_BACKWARD, RECV_FORWARD, Job, Schedule, parse_job_type

#: needs of one id: (id it waits for, that job's rank) pairs
Needs = Sequence[Tuple[int, int]]
#: ``other(state, rank, index)``: run the non-compute entry at the head of ``rank``; True if
#: the rank may go past it (the hook may move other ranks' heads, e.g. the recv of a send)
OtherHook = Callable[["WalkState", int, int], bool]
#: ``on_run(rank, index, start, end)``: called for every compute job as it runs
RunHook = Callable[[int, int, float, float], None]


@dataclass
class WalkState:
    """Where the walk stands: per rank the next list index and the clock, per id its end
    (-1.0: not done), the running memory level per rank and the highest level it reached."""

    orders: Sequence[Sequence[int]]
    head: List[int]
    clock: List[float]
    end: List[float]
    level: List[float]
    peaks: List[float]

    @property
    def peak(self) -> float:
        """The highest level any rank reached."""
        return max(self.peaks, default=0.0)

    @property
    def finished(self) -> bool:
        return all(h >= len(order) for h, order in zip(self.head, self.orders))

    def blocked(self) -> List[Tuple[int, int]]:
        """(rank, index) of every head that did not run: the heads a deadlock stopped."""
        return [(rank, h) for rank, (h, order) in enumerate(zip(self.head, self.orders))
                if h < len(order)]


def walk(orders: Sequence[Sequence[int]], needs: Sequence[Needs], cost: Sequence[float],
         num_ids: int, *, comm: float = 0.0, delta: Optional[Sequence[float]] = None,
         starts: Optional[List[float]] = None, other: Optional[OtherHook] = None,
         on_run: Optional[RunHook] = None) -> WalkState:
    """Run every rank as far as it goes; the returned state says whether all finished and, if
    not, which heads are blocked (a deadlock).

    ``delta[id]``: the live-memory change at the end of a job, in list order per rank (the
    state's ``peaks``); ``starts`` (``num_ids`` floats) receives each job's start; ``other``
    runs the entries with id -1 (default: they take no time and never wait; a hook may move
    the clocks of its rank and of others, e.g. for a blocking transfer).  The state it
    reaches does not depend on the order the ranks are tried in (running a job never stops
    another), so the deadlock, if any, does not either.
    """
    pp = len(orders)
    state = WalkState(orders, [0] * pp, [0.0] * pp, [-1.0] * num_ids, [0.0] * pp, [0.0] * pp)
    end, head, clock, level, peaks = state.end, state.head, state.clock, state.level, state.peaks
    track_memory, record_starts = delta is not None, starts is not None
    progressed = True
    while progressed:
        progressed = False
        for r, order in enumerate(orders):
            h, t, lv, peak = head[r], clock[r], level[r], peaks[r]
            n = len(order)
            while h < n:
                j = order[h]
                if j < 0:
                    if other is not None:
                        if h != head[r]:  # the jobs run so far count even if the hook waits
                            progressed = True
                        head[r], clock[r], level[r], peaks[r] = h, t, lv, peak
                        if not other(state, r, h):
                            break
                        t = clock[r]  # the hook may have kept the rank busy (a transfer)
                        progressed = True
                    h += 1
                    continue
                st = t
                for d, dr in needs[j]:
                    e = end[d]
                    if e < 0:
                        break
                    if dr != r:
                        e += comm
                    if e > st:
                        st = e
                else:
                    if record_starts:
                        starts[j] = st
                    t = st + cost[j]
                    end[j] = t
                    if track_memory:
                        lv += delta[j]
                        if lv > peak:
                            peak = lv
                    if on_run is not None:
                        on_run(r, h, st, t)
                    h += 1
                    continue
                break
            if h != head[r]:
                head[r], clock[r], level[r], peaks[r] = h, t, lv, peak
                progressed = True
    return state


# --------------------------------------------------------------------------- schedules
#
# execute runs a schedule on the integer tables of its DependencyGraph; a send / recv /
# optimizer at a rank's head goes through the ``other`` hook.

# What a send / recv / optimizer job at the head of a rank needs before it can run.
_SEND_STEP, _RECV_STEP, _OTHER_STEP, _NO_PEER_STEP = range(4)


def _comm_steps(schedule: Schedule, graph: DependencyGraph) -> List[List[Optional[tuple]]]:
    """Per rank, per job: None for a compute job (the dependency table covers it), else a tuple
    starting with a step code.

    send: (code, peer rank, peer job token, key id of the data sent or -1); recv: (code,);
    optimizer: (code,); a send / recv without a peer stage: (code, job) — comm_partner raises
    when it is reached.  Tokens are (kind, chunk, micro-batch) tuples, compared instead of Jobs.
    """
    steps = []
    for rank, jobs in enumerate(schedule.ranks):
        row: List[Optional[tuple]] = []
        for kid, job in zip(graph.key_ids[rank], jobs):
            if kid >= 0:
                row.append(None)
            elif job.kind not in COMM_KINDS:
                row.append((_OTHER_STEP,))
            else:
                try:
                    peer = graph.comm_peer(rank, job)
                except ValueError:  # a chunk the placement lacks: raise it only if reached
                    peer = None
                if peer is None:
                    row.append((_NO_PEER_STEP, job))
                elif job.kind in (RECV_FORWARD, RECV_BACKWARD):
                    row.append((_RECV_STEP,))
                else:
                    peer_rank, peer_kind, peer_chunk = peer
                    source = graph.resolve_id(graph.comm_source(rank, job))
                    row.append((_SEND_STEP, peer_rank, (peer_kind, peer_chunk, job.micro_batch),
                                source))
        steps.append(row)
    return steps


@dataclass
class Execution:
    """The end state of :func:`execute`: the walk, and per (rank, key id of a remote producer)
    the id that stands for "its data arrived on that rank" (lowered schedules)."""

    state: WalkState
    graph: DependencyGraph
    arrivals: Dict[Tuple[int, int], int]

    def done(self) -> Set[JobKey]:
        end = self.state.end
        return {key for kid, key in enumerate(self.graph.keys) if end[kid] >= 0}

    def received(self) -> Set[Tuple[int, JobKey]]:
        end, keys = self.state.end, self.graph.keys
        return {(rank, keys[dep]) for (rank, dep), aid in self.arrivals.items() if end[aid] >= 0}


def _needs(graph: DependencyGraph, lowered: bool, never: int, arrivals: Dict[Tuple[int, int], int]
           ) -> List[Tuple[Tuple[int, int], ...]]:
    """The walk's table: a producer no rank runs becomes ``never`` (an id nothing marks done);
    in a lowered schedule a remote producer becomes the id of its data's arrival."""
    by_id = graph.dependency_by_id()
    if not lowered and all(dep >= 0 for refs in by_id for dep, _ in refs):
        return by_id  # the common case: every producer runs, nothing travels through recvs
    needs = []
    for kid, refs in enumerate(by_id):
        rank = graph.rank_of_id(kid)
        row = []
        for dep, dep_rank in refs:
            if dep < 0:
                row.append((never, rank))
            elif lowered and dep_rank != rank:
                aid = arrivals.setdefault((rank, dep), never + 1 + len(arrivals))
                row.append((aid, rank))
            else:
                row.append((dep, dep_rank))
        needs.append(tuple(row))
    return needs


def execute(schedule: Schedule, graph: Optional[DependencyGraph] = None,
            record: Optional[Callable[[Tuple[int, Job]], None]] = None, *,
            cost: Optional[Sequence[float]] = None, comm: float = 0.0,
            on_run: Optional[RunHook] = None) -> Execution:
    """Run every rank as far as it goes (:func:`events.walk`); ``record`` gets each (rank, job)
    as it runs, a send directly followed by its recv.

    A compute job needs each producer done — or, in a lowered schedule when the producer is on
    another rank, its data received by a recv earlier on this rank.  A send completes together
    with its recv when the data it sends exists and the peer's head is that recv (rendezvous).

    Durations (the rendezvous simulation): ``cost[key id]`` per compute job (default: none);
    a send / recv pair starts at the latest of both ranks' clocks and the data's end and keeps
    both ranks busy for ``comm``.  ``on_run`` gets every compute job as :func:`events.walk`'s.
    """
    graph = graph or DependencyGraph(schedule)
    lowered = any(job.is_comm for jobs in schedule.ranks for job in jobs)
    never = len(graph.keys)
    arrivals: Dict[Tuple[int, int], int] = {}
    needs = _needs(graph, lowered, never, arrivals)
    has_other = any(kid < 0 for row in graph.key_ids for kid in row)
    steps = _comm_steps(schedule, graph) if has_other else []
    tokens = [[(job.kind, job.chunk, job.micro_batch) for job in jobs] for jobs in schedule.ranks] \
        if lowered else []
    ranks = schedule.ranks

    def other(state: WalkState, rank: int, index: int) -> bool:
        step = steps[rank][index]
        code = step[0]
        if code == _SEND_STEP:
            _, peer, peer_token, source = step
            if source < 0 or state.end[source] < 0:
                return False
            peer_head = state.head[peer]
            if peer_head >= len(ranks[peer]) or tokens[peer][peer_head] != peer_token:
                return False
            # both ranks wait at the pair (rendezvous), then both are busy for the transfer
            done = max(state.clock[rank], state.clock[peer], state.end[source]) + comm
            state.clock[rank] = state.clock[peer] = done
            aid = arrivals.get((peer, source))
            if aid is not None:
                state.end[aid] = done
            state.head[peer] = peer_head + 1  # the pair completes: the peer's recv runs too
            if record is not None:
                record((rank, ranks[rank][index]))
                record((peer, ranks[peer][peer_head]))
            return True
        if code == _RECV_STEP:
            return False  # completes together with its send, from the sender's side
        if code == _NO_PEER_STEP:
            graph.comm_partner(rank, step[1])  # raises its "has no peer stage" ValueError
        if record is not None:
            record((rank, ranks[rank][index]))
        return True

    if record is not None:
        timed_hook = on_run

        def on_run(rank: int, index: int, start: float, end: float) -> None:
            record((rank, ranks[rank][index]))
            if timed_hook is not None:
                timed_hook(rank, index, start, end)

    num_ids = never + 1 + len(arrivals)
    durations = [0.0] * num_ids if cost is None else list(cost) + [0.0] * (num_ids - len(cost))
    state = walk(graph.key_ids, needs, durations, num_ids,
                 other=other if has_other else None, on_run=on_run)
    return Execution(state, graph, arrivals)


# --------------------------------------------------------------------------- memory walks

def memory_curve(jobs: Iterable[Tuple[str, int]], delta: Callable[[str, int], float]
                 ) -> List[float]:
    """Live memory after each (kind, stage) job of an executed order, ``delta(kind, stage)``
    being a job's change (e.g. ``Costs.memory_delta(kind)`` times the stage's bytes)."""
    level, curve = 0.0, []
    for kind, stage in jobs:
        level += delta(kind, stage)
        curve.append(level)
    return curve


def serial_memory(job_order: Sequence[Tuple[str, int]], delta: Callable[[str, int], float]
                  ) -> Tuple[float, List[float]]:
    """(peak, curve) of live memory when ``job_order`` ((job type, rank) pairs, e.g.
    ``("backward_b3", 1)``) runs one job after the other, as the one-process emulation does;
    send / recv / optimizer jobs change nothing."""
    jobs = []
    for job_type, _ in job_order:
        kind, stage = parse_job_type(job_type)
        if kind != OPTIMIZER and kind not in COMM_KINDS:
            jobs.append((kind, stage))
    curve = memory_curve(jobs, delta)
    return max(curve, default=0.0), curve


def rank_peaks(sim, delta: Callable[[str, int], float]) -> List[float]:
    """Per-rank peak live memory of a simulated schedule (:class:`latency.SimResult`): each
    rank's own compute jobs in its order, frees as they come (never below 0, the empty
    rank)."""
    return [max([0.0] + memory_curve(((t.job.kind, t.stage) for t in row if t.job.is_compute),
                                     delta))
            for row in sim.timeline]

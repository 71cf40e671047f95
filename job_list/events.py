"""The one dependency / event engine: every rank runs its list in order; a job starts when its
rank is free and every job it needs is done (plus the latency ``comm`` when that job ran on
another rank).  :func:`simulate.simulate`, :meth:`SearchContext.simulate`, the validator's
symbolic execution and the comm lowering's replay are all :func:`walk` on integer tables.

Tables: ``orders[rank]`` lists the ids a rank runs (-1: an entry that is no compute job, e.g.
a send / recv / optimizer, handed to the ``other`` hook); ``needs[id]`` is a tuple of
(id, rank of that job) it waits for; ``cost[id]`` its duration (zeros for an execution order
without times).  An id can stand for something other than a job, e.g. "the data of job d has
arrived on rank r" in a lowered schedule: the ``other`` hook of a recv marks it done.

Also the memory walks over an executed order (:func:`serial_memory`, :func:`rank_peaks`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from .ir import COMM_KINDS, OPTIMIZER, parse_job_type

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
    (-1.0: not done), the running memory level per rank and the highest level reached."""

    orders: Sequence[Sequence[int]]
    head: List[int]
    clock: List[float]
    end: List[float]
    level: List[float]
    peak: float = 0.0

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
    state's ``peak``); ``starts`` (``num_ids`` floats) receives each job's start; ``other``
    runs the entries with id -1 (default: they take no time and never wait; a hook may move
    the clocks of its rank and of others, e.g. for a blocking transfer).  The state it
    reaches does not depend on the order the ranks are tried in (running a job never stops
    another), so the deadlock, if any, does not either.
    """
    pp = len(orders)
    state = WalkState(orders, [0] * pp, [0.0] * pp, [-1.0] * num_ids, [0.0] * pp)
    end, head, clock, level = state.end, state.head, state.clock, state.level
    track_memory, record_starts = delta is not None, starts is not None
    peak = 0.0
    progressed = True
    while progressed:
        progressed = False
        for r, order in enumerate(orders):
            h, t, lv = head[r], clock[r], level[r]
            n = len(order)
            while h < n:
                j = order[h]
                if j < 0:
                    if other is not None:
                        if h != head[r]:  # the jobs run so far count even if the hook waits
                            progressed = True
                        head[r], clock[r], level[r] = h, t, lv
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
                head[r], clock[r], level[r] = h, t, lv
                progressed = True
    state.peak = peak
    return state


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
    """Per-rank peak live memory of a simulated schedule (:class:`simulate.SimResult`): each
    rank's own compute jobs in its order, frees as they come (never below 0, the empty
    rank)."""
    return [max([0.0] + memory_curve(((t.job.kind, t.stage) for t in row if t.job.is_compute),
                                     delta))
            for row in sim.timeline]

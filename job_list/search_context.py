"""The search's integer view of one configuration: job ids, costs, memory deltas and a fast
simulator (:class:`SearchContext`), shared by the greedy, layout and local searches of
:mod:`auto`.

Same model as :mod:`simulate`: a job starts when its rank is free and its inputs are there (plus
the latency ``costs.comm`` across ranks); memory is counted in units of one virtual stage's
activations for one micro-batch (:meth:`costs.Costs.memory_delta`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

from .costs import Costs
from .events import walk
from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, Job, Schedule
from .placement import LOOPED, Placement

#: job kinds of the search, as integers (an unsplit stage's B is searched as its I)
F, I, W = 0, 1, 2
KIND_NAMES = (FORWARD, BACKWARD_B, BACKWARD_W)
EPS = 1e-9
INF = float("inf")


class SearchContext:
    """Job numbering, costs and a fast simulator for one (pp, vpp, m, placement, costs) and one
    choice of the stages whose backward is split (``split_stages``, default: all).

    Job id of (kind, stage, mb) is ``(kind * S + stage) * m + mb`` with S = pp*vpp stages.
    An unsplit stage's full backward B is searched as its I job with B's cost and memory
    release, followed by a W job of cost 0 that changes nothing; :meth:`to_jobs` turns that
    I into B and drops the W (which only waits on its I, on the same rank, so removing it
    changes no start time).
    """

    def __init__(self, pp: int, vpp: int, m: int, placement: str = LOOPED,
                 costs: Optional[Costs] = None, split_stages: Optional[Sequence[int]] = None):
        self.pp, self.vpp, self.m = pp, vpp, m
        self.placement = Placement(placement, pp, vpp)
        self.costs = costs or Costs()
        self.S = S = pp * vpp
        self.costs.check_stages(S)
        self.split_stages = frozenset(range(S) if split_stages is None else split_stages)
        self.comm = float(self.costs.comm)
        split = [s in self.split_stages for s in range(S)]
        #: live-unit change at the end of an F, I, W job per stage (the simulator's model;
        #: an unsplit stage's "I" is its B)
        self.memory_delta = [
            [self.costs.memory_delta(FORWARD)] * S,
            [self.costs.memory_delta(BACKWARD_B if split[s] else BACKWARD) for s in range(S)],
            [self.costs.memory_delta(BACKWARD_W) if split[s] else 0.0 for s in range(S)]]
        self.rank_of = [0] * S
        self.chunk_of = [0] * S
        for s in range(S):
            self.rank_of[s], self.chunk_of[s] = self.placement.rank_chunk(s)
        #: stages held by each rank, in model order (= chunk order)
        self.stages_of = [[self.placement.stage(r, c) for c in range(vpp)] for r in range(pp)]
        self.cost = [[self.costs.of(FORWARD, s) for s in range(S)],
                     [self.costs.of(BACKWARD_B if split[s] else BACKWARD, s) for s in range(S)],
                     [self.costs.of(BACKWARD_W, s) if split[s] else 0.0 for s in range(S)]]
        #: the costs the search sees (an unsplit stage: I = tB, W = 0), for the bounds
        self.effective_costs = replace(self.costs, backward=None,
                                       backward_b=tuple(self.cost[I]),
                                       backward_w=tuple(self.cost[W]))
        self.N = 3 * S * m
        # per job: kind, stage, mb, rank, cost, dependency ids
        self.kind_of: List[int] = []
        self.stage_of: List[int] = []
        self.rank_of_job: List[int] = []
        self.cost_of: List[float] = []
        self.deps: List[Tuple[int, ...]] = []
        self.delta_of: List[float] = []
        for kind in (F, I, W):
            for s in range(S):
                for mb in range(m):
                    self.kind_of.append(kind)
                    self.stage_of.append(s)
                    self.rank_of_job.append(self.rank_of[s])
                    self.cost_of.append(self.cost[kind][s])
                    self.delta_of.append(self.memory_delta[kind][s])
                    if kind == F:
                        deps = (self.id(F, s - 1, mb),) if s > 0 else ()
                    elif kind == I:
                        deps = (self.id(F, s, mb),) + ((self.id(I, s + 1, mb),) if s + 1 < S else ())
                    else:
                        deps = (self.id(I, s, mb),)
                    self.deps.append(deps)
        #: per job: its dependencies as (id, rank) pairs, the table of :func:`events.walk`
        self.needs = [tuple((d, self.rank_of_job[d]) for d in deps) for deps in self.deps]

    def id(self, kind: int, stage: int, mb: int) -> int:
        return (kind * self.S + stage) * self.m + mb

    def job(self, jid: int) -> Optional[Job]:
        """The job of id ``jid`` (None for the W stand-in of an unsplit stage)."""
        kind, rest = divmod(jid, self.S * self.m)
        stage, mb = divmod(rest, self.m)
        if stage not in self.split_stages and kind != F:
            if kind == W:
                return None
            return Job(BACKWARD, self.chunk_of[stage], mb)
        return Job(KIND_NAMES[kind], self.chunk_of[stage], mb)

    def to_jobs(self, orders: Sequence[Sequence[int]]) -> List[List[Job]]:
        return [[job for job in map(self.job, order) if job is not None] for order in orders]

    def from_schedule(self, schedule: Schedule) -> List[List[int]]:
        """Job ids of a compute-only schedule with this placement whose split stages are
        ``split_stages`` (a B becomes its I id followed by its W id)."""
        index = {FORWARD: F, BACKWARD_B: I, BACKWARD_W: W}
        out = []
        for r, jobs in enumerate(schedule.ranks):
            row = []
            for j in jobs:
                if not j.is_compute:
                    continue
                stage = self.placement.stage(r, j.chunk)
                if j.kind == BACKWARD:
                    row += [self.id(I, stage, j.micro_batch), self.id(W, stage, j.micro_batch)]
                else:
                    row.append(self.id(index[j.kind], stage, j.micro_batch))
            out.append(row)
        return out

    def simulate(self, orders: Sequence[Sequence[int]], starts: Optional[List[float]] = None
                 ) -> Optional[Tuple[float, Tuple[float, ...], float]]:
        """(makespan, peak per rank, sum of rank finish times) of ``orders``; None if they
        deadlock.  ``starts`` (a list of N floats), when given, receives each job's start.

        Same timing as :func:`simulate.simulate`; the peak is the running level after each job
        in list order, never below the simulator's (which frees first on equal end times).
        """
        state = walk(orders, self.needs, self.cost_of, self.N, comm=self.comm,
                     delta=self.delta_of, starts=starts)
        if not state.finished:
            return None
        return max(state.clock), tuple(state.peaks), sum(state.clock)

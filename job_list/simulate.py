"""Discrete-event simulation of a schedule: each rank runs its list in order; a job starts when
its rank is free and its dependencies are done (plus the latency ``comm`` when they ran on
another rank).  Send / recv jobs take no time of their own: the latency stands for them.

The memory model is :meth:`costs.Costs.memory_delta`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .bounds import lower_bound  # noqa: F401  (re-exported: simulate.lower_bound)
from .costs import COST_FIELDS, EXTRA_FIELDS, Costs  # noqa: F401  (re-exported)
from .deps import DependencyGraph
from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, Job, Schedule


@dataclass(frozen=True)
class TimedJob:
    rank: int
    index: int
    job: Job
    stage: int
    start: float
    end: float


@dataclass
class SimResult:
    schedule: Schedule
    costs: Costs
    timeline: List[List[TimedJob]]
    makespan: float
    busy: List[float]
    peak_memory: List[float]
    memory_curve: List[List[Tuple[float, float]]] = field(repr=False, default_factory=list)

    @property
    def bubble_ratio(self) -> float:
        """Idle share of all ranks' time up to the makespan."""
        total = self.makespan * self.schedule.pp
        return 0.0 if total == 0 else 1.0 - sum(self.busy) / total

    @property
    def max_peak_memory(self) -> float:
        return max(self.peak_memory)

    def start_of(self) -> Dict[Tuple[int, int], float]:
        """(rank, index in the rank's list) -> start time, compute jobs only."""
        return {(t.rank, t.index): t.start for row in self.timeline for t in row}


def simulate(schedule: Schedule, costs: Optional[Costs] = None) -> SimResult:
    """Time every compute job of ``schedule`` (send / recv jobs are skipped)."""
    from .validate import ScheduleError, explain_deadlock  # validate imports nothing of ours back

    costs = costs if costs is not None else Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, got {type(costs).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule (build_schedule(...)), got "
                        f"{type(schedule).__name__}")
    costs.check_stages(schedule.num_stages)
    graph = DependencyGraph(schedule)
    table = graph.dependency_table()
    stage_of_id = [stage for stage, _, _ in graph.keys]
    cost = _cost_table(costs, schedule.num_stages)
    comm = costs.comm
    end: List[Optional[float]] = [None] * len(graph.keys)  # per key id
    timeline: List[List[TimedJob]] = [[] for _ in range(schedule.pp)]
    clock = [0.0] * schedule.pp
    head = [0] * schedule.pp
    remaining = sum(1 for row in graph.key_ids for kid in row if kid >= 0)

    while remaining:
        progressed = False
        for rank, jobs in enumerate(schedule.ranks):
            index, count = head[rank], len(jobs)
            deps, ids, row = table[rank], graph.key_ids[rank], timeline[rank]
            while index < count:
                kid = ids[index]
                if kid < 0:  # send / recv / optimizer: no time of its own
                    index += 1
                    continue
                start = clock[rank]
                for dep, dep_rank in deps[index]:
                    if dep < 0:
                        continue  # no rank runs it: nothing to wait for (as dependencies())
                    finished = end[dep]
                    if finished is None:
                        break
                    if dep_rank != rank:
                        finished += comm
                    if finished > start:
                        start = finished
                else:
                    job = jobs[index]
                    stage = stage_of_id[kid]
                    try:
                        finish = start + cost[job.kind][stage]
                    except IndexError:  # placement has more stages than pp*vpp: costs.of raises
                        finish = start + costs.of(job.kind, stage)
                    end[kid] = finish
                    row.append(TimedJob(rank, index, job, stage, start, finish))
                    clock[rank] = finish
                    index += 1
                    remaining -= 1
                    progressed = True
                    continue
                break  # a dependency has not finished yet
            head[rank] = index
        if not progressed:
            raise ScheduleError(explain_deadlock(schedule.compute_only()))
    makespan = max(clock) if timeline else 0.0
    busy = [sum(t.end - t.start for t in row) for row in timeline]
    curves = [_memory_curve(row, costs) for row in timeline]
    peaks = [max((level for _, level in curve), default=0.0) for curve in curves]
    return SimResult(schedule, costs, timeline, makespan, busy, peaks, curves)


def _cost_table(costs: Costs, num_stages: int) -> Dict[str, List[float]]:
    """kind -> per-stage cost, so the event loop indexes lists instead of calling ``costs.of``."""
    return {kind: [costs.of(kind, stage) for stage in range(num_stages)]
            for kind in (FORWARD, BACKWARD, BACKWARD_B, BACKWARD_W)}


def _memory_curve(row: Sequence[TimedJob], costs: Costs) -> List[Tuple[float, float]]:
    """(time, live activation units) after each job of one rank; frees before allocations."""
    events = sorted(((t.end, costs.memory_delta(t.job.kind)) for t in row),
                    key=lambda e: (e[0], e[1]))
    level, curve = 0.0, []
    for time, delta in events:
        level += delta
        curve.append((time, level))
    return curve

"""The latency model (:func:`simulate_latency`) and the timeline every simulation returns
(:class:`SimResult`): each rank runs its list in order; a job starts when its rank is free and
its dependencies are done (plus the latency ``comm`` when they ran on another rank); send /
recv jobs take no time.

The comm lowering places its send / recv pairs by this model's times, and the rendezvous model
(:mod:`simulate`) runs on the lowered schedule: so this model sits below :mod:`lower` and the
rendezvous model above it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .costs import Costs
from .deps import DependencyGraph
from .events import walk
from .ir import Job, Schedule
from .validate import ScheduleError, explain_deadlock


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
    #: per rank, when its list ends: its last job, or under rendezvous costs a transfer after it
    rank_ends: List[float] = field(repr=False, default_factory=list)

    @property
    def bubble_ratio(self) -> float:
        """Idle share of all ranks' time up to the makespan."""
        total = self.makespan * self.schedule.pp
        return 0.0 if total == 0 else 1.0 - sum(self.busy) / total

    @property
    def max_peak_memory(self) -> float:
        return max(self.peak_memory)


def checked_costs(schedule: Schedule, costs: Optional[Costs]) -> Costs:
    """``costs`` (default ``Costs()``) once the arguments of a simulation are checked."""
    costs = costs if costs is not None else Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, got {type(costs).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule (build_schedule(...)), got "
                        f"{type(schedule).__name__}")
    costs.check_stages(schedule.num_stages)
    return costs


def simulate_latency(schedule: Schedule, costs: Optional[Costs] = None) -> SimResult:
    """The latency model whatever ``costs.comm_mode``: time every compute job of ``schedule``
    (send / recv jobs take no time)."""
    costs = checked_costs(schedule, costs)
    graph = DependencyGraph(schedule)
    # a dependency no rank runs has nothing to wait for (as dependencies())
    by_id = graph.dependency_by_id()
    needs = by_id if all(dep >= 0 for refs in by_id for dep, _ in refs) else \
        [tuple(ref for ref in refs if ref[0] >= 0) for refs in by_id]
    cost = key_costs(costs, graph.keys)
    timeline: List[List[TimedJob]] = [[] for _ in range(schedule.pp)]
    keys, key_ids, ranks = graph.keys, graph.key_ids, schedule.ranks

    def record(rank: int, index: int, start: float, end: float) -> None:
        timeline[rank].append(TimedJob(rank, index, ranks[rank][index],
                                       keys[key_ids[rank][index]][0], start, end))

    state = walk(graph.key_ids, needs, cost, len(graph.keys), comm=costs.comm, on_run=record)
    if not state.finished:
        raise ScheduleError(explain_deadlock(schedule.compute_only()))
    return result_of(schedule, costs, timeline, state.clock)


def result_of(schedule: Schedule, costs: Costs, timeline: List[List[TimedJob]],
            clock: Sequence[float]) -> SimResult:
    makespan = max(clock) if timeline else 0.0
    busy = [sum(t.end - t.start for t in row) for row in timeline]
    curves = [_memory_curve(row, costs) for row in timeline]
    peaks = [max((level for _, level in curve), default=0.0) for curve in curves]
    return SimResult(schedule, costs, timeline, makespan, busy, peaks, curves, list(clock))


def key_costs(costs: Costs, keys) -> List[float]:
    """Cost per key id; ``costs.of`` checks its arguments, so once per (kind, stage)."""
    table: Dict[Tuple[str, int], float] = {}
    out = []
    for stage, kind, _ in keys:
        value = table.get((kind, stage))
        if value is None:
            value = table[kind, stage] = costs.of(kind, stage)
        out.append(value)
    return out


def _memory_curve(row: Sequence[TimedJob], costs: Costs) -> List[Tuple[float, float]]:
    """(time, live activation units) after each job of one rank; frees before allocations."""
    events = sorted(((t.end, costs.memory_delta(t.job.kind)) for t in row),
                    key=lambda e: (e[0], e[1]))
    level, curve = 0.0, []
    for time, delta in events:
        level += delta
        curve.append((time, level))
    return curve

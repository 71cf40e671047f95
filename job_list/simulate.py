"""Discrete-event simulation of a schedule: each rank runs its list in order; a job starts when
its rank is free and its dependencies are done (plus the latency ``comm`` when they ran on
another rank).  Send / recv jobs take no time of their own: the latency stands for them.

Under ``Costs(comm_mode="rendezvous")`` (blocking transfers, gloo on CPU) the schedule runs
lowered instead (:func:`lower.lower_comm`; a lowered input as given): a send and its matching
recv start together when both ranks have reached them and the data exists, and keep both ranks
busy for ``comm`` (:func:`validate.execute` with durations).

The memory model is :meth:`costs.Costs.memory_delta`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .bounds import lower_bound  # noqa: F401  (re-exported: simulate.lower_bound)
from .costs import COST_FIELDS, EXTRA_FIELDS, Costs  # noqa: F401  (re-exported)
from .deps import DependencyGraph
from .events import walk
from .ir import Job, Schedule
from .validate import ScheduleError, execute, explain_deadlock


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

    def start_of(self) -> Dict[Tuple[int, int], float]:
        """(rank, index in the rank's list) -> start time, compute jobs only."""
        return {(t.rank, t.index): t.start for row in self.timeline for t in row}


def simulate(schedule: Schedule, costs: Optional[Costs] = None) -> SimResult:
    """Time every compute job of ``schedule`` (send / recv jobs are skipped)."""
    costs = costs if costs is not None else Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, got {type(costs).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule (build_schedule(...)), got "
                        f"{type(schedule).__name__}")
    costs.check_stages(schedule.num_stages)
    if costs.rendezvous:
        return _simulate_rendezvous(schedule, costs)
    graph = DependencyGraph(schedule)
    # a dependency no rank runs has nothing to wait for (as dependencies())
    by_id = graph.dependency_by_id()
    needs = by_id if all(dep >= 0 for refs in by_id for dep, _ in refs) else \
        [tuple(ref for ref in refs if ref[0] >= 0) for refs in by_id]
    cost = _key_costs(costs, graph.keys)
    timeline: List[List[TimedJob]] = [[] for _ in range(schedule.pp)]
    keys, key_ids, ranks = graph.keys, graph.key_ids, schedule.ranks

    def record(rank: int, index: int, start: float, end: float) -> None:
        timeline[rank].append(TimedJob(rank, index, ranks[rank][index],
                                       keys[key_ids[rank][index]][0], start, end))

    state = walk(graph.key_ids, needs, cost, len(graph.keys), comm=costs.comm, on_run=record)
    if not state.finished:
        raise ScheduleError(explain_deadlock(schedule.compute_only()))
    return _result(schedule, costs, timeline, state.clock)


def _simulate_rendezvous(schedule: Schedule, costs: Costs) -> SimResult:
    """:func:`simulate` with blocking send / recv pairs, on the lowered schedule; the timeline
    indexes ``schedule``'s own lists (compute jobs only, as the latency model's)."""
    from .lower import lower_comm  # lower builds on simulate

    lowered_input = any(job.is_comm for jobs in schedule.ranks for job in jobs)
    lowered = schedule if lowered_input else lower_comm(schedule, costs)
    graph = DependencyGraph(lowered)
    index_in_input = [_input_indexes(schedule.ranks[r], jobs) for r, jobs in enumerate(lowered.ranks)]
    timeline: List[List[TimedJob]] = [[] for _ in range(schedule.pp)]
    keys, key_ids = graph.keys, graph.key_ids

    def record(rank: int, index: int, start: float, end: float) -> None:
        timeline[rank].append(TimedJob(rank, index_in_input[rank][index],
                                       lowered.ranks[rank][index],
                                       keys[key_ids[rank][index]][0], start, end))

    execution = execute(lowered, graph, cost=_key_costs(costs, keys), comm=float(costs.comm),
                        on_run=record)
    if not execution.state.finished:
        raise ScheduleError(explain_deadlock(lowered))
    return _result(schedule, costs, timeline, execution.state.clock)


def _input_indexes(input_jobs: Sequence[Job], lowered_jobs: Sequence[Job]) -> List[int]:
    """Per entry of a rank's lowered list, the index of the same job in the input list (-1 for
    the send / recv the lowering added): lowering keeps every other job, in order."""
    out, position = [], 0
    for job in lowered_jobs:
        if job.is_comm and (position >= len(input_jobs) or input_jobs[position] != job):
            out.append(-1)
            continue
        if position >= len(input_jobs) or input_jobs[position] != job:
            raise AssertionError(f"lowering reordered the rank's jobs at {job}")
        out.append(position)
        position += 1
    return out


def _result(schedule: Schedule, costs: Costs, timeline: List[List[TimedJob]],
            clock: Sequence[float]) -> SimResult:
    makespan = max(clock) if timeline else 0.0
    busy = [sum(t.end - t.start for t in row) for row in timeline]
    curves = [_memory_curve(row, costs) for row in timeline]
    peaks = [max((level for _, level in curve), default=0.0) for curve in curves]
    return SimResult(schedule, costs, timeline, makespan, busy, peaks, curves, list(clock))


def _key_costs(costs: Costs, keys) -> List[float]:
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

"""Discrete-event simulation of a schedule (:func:`simulate`): each rank runs its list in order;
a job starts when its rank is free and its dependencies are done (plus the latency ``comm`` when
they ran on another rank).  Send / recv jobs take no time of their own: the latency stands for
them (the latency model, :mod:`latency`).

Under ``Costs(comm_mode="rendezvous")`` (blocking transfers, gloo on CPU) the schedule runs
lowered instead (:func:`lower.lower_comm`; a lowered input as given): a send and its matching
recv start together when both ranks have reached them and the data exists, and keep both ranks
busy for ``comm`` (:func:`events.execute` with durations).

The memory model is :meth:`costs.Costs.memory_delta`.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from .costs import Costs
from .deps import DependencyGraph
from .events import execute
from .ir import Job, Schedule
from .latency import SimResult, TimedJob, checked_costs, key_costs, result_of, simulate_latency
from .lower import lower_comm
from .validate import ScheduleError, explain_deadlock


def simulate(schedule: Schedule, costs: Optional[Costs] = None) -> SimResult:
    """Time every compute job of ``schedule`` under ``costs.comm_mode`` (module doc)."""
    costs = checked_costs(schedule, costs)
    if costs.rendezvous:
        return _simulate_rendezvous(schedule, costs)
    return simulate_latency(schedule, costs)


def _simulate_rendezvous(schedule: Schedule, costs: Costs) -> SimResult:
    """:func:`simulate` with blocking send / recv pairs, on the lowered schedule; the timeline
    indexes ``schedule``'s own lists (compute jobs only, as the latency model's)."""
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

    execution = execute(lowered, graph, cost=key_costs(costs, keys), comm=float(costs.comm),
                        on_run=record)
    if not execution.state.finished:
        raise ScheduleError(explain_deadlock(lowered))
    return result_of(schedule, costs, timeline, execution.state.clock)


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

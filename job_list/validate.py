"""Schedule validation: completeness, local order, and deadlock freedom.

Compute-only schedules run with the data dependencies of :mod:`deps`.  Lowered schedules (with
send / recv jobs) run under rendezvous semantics: a send and its matching recv complete together
only when both ranks have reached them, as with blocking collectives on gloo; a compute job needs
its cross-rank inputs through a recv that ran earlier on its own rank.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from .deps import DependencyGraph, JobKey, job_key, short
from .events import execute
from .grid import step_grid
from .ir import (BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, OP_OF_KIND, OPTIMIZER, RECV_BACKWARD,
                 RECV_FORWARD, Job, Schedule)


class ScheduleError(ValueError):
    """A schedule that breaks the pipeline semantics or cannot run to the end."""


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` is complete, ordered and deadlock-free."""
    _check_jobs(schedule)
    graph = DependencyGraph(schedule)  # after _check_jobs: every job's stage exists
    _check_completeness(schedule, graph)
    _check_local_order(schedule, graph)
    if any(job.is_comm for jobs in schedule.ranks for job in jobs):
        _check_comm_pairs(schedule, graph)
    message = _run(schedule, graph)
    if message:
        raise ScheduleError(message)


def explain_deadlock(schedule: Schedule) -> str:
    """The deadlock message for ``schedule`` ('' if it runs to the end)."""
    return _run(schedule) or ""


def _check_jobs(schedule: Schedule) -> None:
    if len(schedule.ranks) != schedule.pp:
        raise ScheduleError(f"schedule has {len(schedule.ranks)} rank lists, pp is {schedule.pp}")
    for rank, jobs in enumerate(schedule.ranks):
        for index, job in enumerate(jobs):
            if job.kind == OPTIMIZER:
                if index != len(jobs) - 1:
                    raise ScheduleError(f"rank {rank}, job #{index}: the optimizer must be last")
                continue
            if job.chunk >= schedule.vpp:
                raise ScheduleError(f"rank {rank}, job #{index} ({job}): chunk must be < vpp "
                                    f"({schedule.vpp})")
            if job.micro_batch >= schedule.m:
                raise ScheduleError(f"rank {rank}, job #{index} ({short(schedule, rank, job)}): "
                                    f"micro-batch must be < m ({schedule.m})")


def _check_completeness(schedule: Schedule, graph: Optional[DependencyGraph] = None) -> None:
    graph = graph or DependencyGraph(schedule)
    places: List[List[Tuple[int, int]]] = [[] for _ in graph.keys]  # per key id: (rank, index)
    for rank, row in enumerate(graph.key_ids):
        for index, kid in enumerate(row):
            if kid >= 0:
                places[kid].append((rank, index))
    for kid, where in enumerate(places):
        if len(where) > 1:
            key = graph.keys[kid]
            at = ", ".join(f"rank {rank} job #{index}" for rank, index in where)
            raise ScheduleError(f"job {key[0]}{OP_OF_KIND[key[1]]}{key[2]} appears {len(where)} times "
                                f"({at}); each (stage, kind, micro-batch) runs once")

    present = set(graph.keys)  # every count is 1 from here on
    if schedule.is_forward_only:
        _check_forward_only(schedule, present)
        return
    for stage in range(schedule.num_stages):
        for mb in range(schedule.m):
            has = {kind: int((stage, kind, mb) in present)
                   for kind in (FORWARD, BACKWARD, BACKWARD_B, BACKWARD_W)}
            if not has[FORWARD]:
                raise ScheduleError(f"{_at(stage, mb)}: missing forward {stage}F{mb}")
            full, split = has[BACKWARD], has[BACKWARD_B] + has[BACKWARD_W]
            if full and split:
                raise ScheduleError(f"{_at(stage, mb)}: has both a full backward and split I/W "
                                    f"jobs")
            if not full and (has[BACKWARD_B] != 1 or has[BACKWARD_W] != 1):
                raise ScheduleError(f"{_at(stage, mb)}: needs one backward (B), or one I and one "
                                    f"W; found I x{has[BACKWARD_B]}, W x{has[BACKWARD_W]}")


def _check_forward_only(schedule: Schedule, present: Set[JobKey]) -> None:
    """An evaluation schedule: one forward per (stage, micro-batch), nothing else."""
    for rank, jobs in enumerate(schedule.ranks):
        for index, job in enumerate(jobs):
            if job.kind in (BACKWARD, BACKWARD_B, BACKWARD_W, OPTIMIZER):
                raise ScheduleError(f"rank {rank}, job #{index} ({job.kind}): a forward-only "
                                    "schedule has no backward or optimizer jobs")
    for stage in range(schedule.num_stages):
        for mb in range(schedule.m):
            if (stage, FORWARD, mb) not in present:
                raise ScheduleError(f"{_at(stage, mb)}: missing forward {stage}F{mb}")


def _at(stage: int, mb: int) -> str:
    return f"stage {stage}, micro-batch {mb}"


_NEEDS_LOCALLY = {BACKWARD: FORWARD, BACKWARD_B: FORWARD, BACKWARD_W: BACKWARD_B}


def _check_local_order(schedule: Schedule, graph: Optional[DependencyGraph] = None) -> None:
    """F before its B / I, and I before its W, on the owning rank."""
    graph = graph or DependencyGraph(schedule)
    for rank, jobs in enumerate(schedule.ranks):
        seen: Set[JobKey] = set()
        for index, kid in enumerate(graph.key_ids[rank]):
            if kid < 0:
                continue
            key = graph.keys[kid]
            stage, kind, mb = key
            need = _NEEDS_LOCALLY.get(kind)
            if need and (stage, need, mb) not in seen:
                job = jobs[index]
                raise ScheduleError(f"rank {rank}, job #{index} ({short(schedule, rank, job)}) "
                                    f"comes before its {stage}{OP_OF_KIND[need]}{mb}")
            seen.add(key)


def _check_comm_pairs(schedule: Schedule, graph: Optional[DependencyGraph] = None) -> None:
    """Every send has exactly one matching recv on the peer, and vice versa."""
    graph = graph or DependencyGraph(schedule)
    # (rank, (kind, chunk, micro-batch)) -> [count, job]; plain tuples hash faster than Jobs
    present: Dict[Tuple[int, tuple], list] = {}
    for rank, jobs in enumerate(schedule.ranks):
        for job in jobs:
            if job.is_comm:
                entry = present.setdefault((rank, (job.kind, job.chunk, job.micro_batch)), [0, job])
                entry[0] += 1
    for (rank, (_, _, mb)), (n, job) in present.items():
        if n > 1:
            raise ScheduleError(f"rank {rank}: {short(schedule, rank, job)} appears {n} times")
        peer = graph.comm_peer(rank, job)
        if peer is None:
            graph.comm_partner(rank, job)  # raises its "has no peer stage" ValueError
        peer_rank, peer_kind, peer_chunk = peer
        if peer_rank == rank:
            raise ScheduleError(f"rank {rank}: {short(schedule, rank, job)} talks to its own rank")
        if (peer_rank, (peer_kind, peer_chunk, mb)) not in present:
            peer_job = Job(peer_kind, peer_chunk, mb)
            raise ScheduleError(f"rank {rank}: {short(schedule, rank, job)} has no matching "
                                f"{short(schedule, peer_rank, peer_job)} on rank {peer_rank}")


# ---------------------------------------------------------------------- deadlock message
#
# events.execute runs the schedule on integer tables (the hot loop of validate); only when it
# gets stuck does _run rebuild the job-level state and ask _blocker why, for the message.  The
# state it reaches is the same whatever the order ranks are tried in: running a job never stops
# another from running, so the deadlock (if any) and its explanation do not depend on it.

def _run(schedule: Schedule, graph: Optional[DependencyGraph] = None) -> Optional[str]:
    """Execute the schedule symbolically; return a deadlock explanation or None."""
    execution = execute(schedule, graph)
    if execution.state.finished:
        return None
    lowered = any(job.is_comm for jobs in schedule.ranks for job in jobs)
    head = execution.state.head
    blocker = _blocker(schedule, execution.graph, lowered, execution.done(),
                       execution.received(), head)
    grid = step_grid(schedule, frozenset(execution.state.blocked()))
    return (_describe(schedule, head, blocker)
            + "\nper rank, the jobs in list order; [blocked] heads:\n" + grid)


def _blocker(schedule: Schedule, graph: DependencyGraph, lowered: bool, done: Set[JobKey],
             received: Set[Tuple[int, JobKey]], head: List[int]):
    """``blocker(rank, job)``: why ``job`` at the head of ``rank`` cannot run now, as (reason,
    (rank, job) awaited), or None if it can — in the words of the deadlock message."""

    def blocker(rank: int, job: Job) -> Optional[Tuple[str, Optional[Tuple[int, Job]]]]:
        if job.is_compute:
            for key in graph.required_keys(rank, job):
                found = graph.resolve(key)
                if found is None:
                    return f"{key[0]}{OP_OF_KIND[key[1]]}{key[2]}, which no rank runs", None
                dep_rank, dep = found
                dep_key = job_key(schedule, dep_rank, dep)
                if dep_rank != rank and lowered:
                    if (rank, dep_key) not in received:
                        recv_kind = RECV_FORWARD if dep.kind == FORWARD else RECV_BACKWARD
                        recv = Job(recv_kind, job.chunk, job.micro_batch)
                        return f"{short(schedule, rank, recv)} (data of " \
                               f"{short(schedule, dep_rank, dep)})", (rank, recv)
                elif dep_key not in done:
                    return short(schedule, dep_rank, dep), found
            return None
        if job.kind == OPTIMIZER:
            return None
        peer_rank, peer_job = graph.comm_partner(rank, job)
        source = graph.comm_source(rank, job)
        if source is not None:
            found = graph.resolve(source)
            if found is None or job_key(schedule, *found) not in done:
                what = short(schedule, *found) if found else f"stage {source[0]} output"
                return f"{what} (the data it sends)", found
        peer_jobs = schedule.ranks[peer_rank]
        if head[peer_rank] >= len(peer_jobs) or peer_jobs[head[peer_rank]] != peer_job:
            return f"rank {peer_rank} to post {short(schedule, peer_rank, peer_job)}", \
                (peer_rank, peer_job)
        return None

    return blocker


def _describe(schedule: Schedule, head: List[int], blocker) -> str:
    lines = []
    for rank, jobs in enumerate(schedule.ranks):
        if head[rank] >= len(jobs):
            continue
        job = jobs[head[rank]]
        reason = blocker(rank, job)
        if reason is None:  # a recv whose sender is not there yet
            lines.append(f"rank {rank}, job #{head[rank]} ({short(schedule, rank, job)}) waits "
                         f"for its sender")
            continue
        text, awaited = reason
        line = f"rank {rank}, job #{head[rank]} ({short(schedule, rank, job)}) waits for {text}"
        if awaited is not None:
            other = awaited[0]
            other_jobs = schedule.ranks[other]
            if (head[other] < len(other_jobs) and other != rank
                    and other_jobs[head[other]] != awaited[1]):
                line += (f", which rank {other} runs only after "
                         f"{short(schedule, other, other_jobs[head[other]])}")
        lines.append(line)
    return "deadlock: " + "; ".join(lines)

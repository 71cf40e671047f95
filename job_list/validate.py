"""Schedule validation: completeness, local order, and deadlock freedom.

Compute-only schedules run with the data dependencies of :mod:`deps`.  Lowered schedules (with
send / recv jobs) run under rendezvous semantics: a send and its matching recv complete together
only when both ranks have reached them, as with blocking collectives on gloo; a compute job needs
its cross-rank inputs through a recv that ran earlier on its own rank.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Set, Tuple

from .deps import DependencyGraph, JobKey, job_key, short
from .ir import (BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, OPTIMIZER, RECV_BACKWARD,
                 RECV_FORWARD, SEND_BACKWARD, SEND_FORWARD, Job, Schedule)


class ScheduleError(ValueError):
    """A schedule that breaks the pipeline semantics or cannot run to the end."""


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` is complete, ordered and deadlock-free."""
    _check_jobs(schedule)
    _check_completeness(schedule)
    _check_local_order(schedule)
    if any(job.is_comm for jobs in schedule.ranks for job in jobs):
        _check_comm_pairs(schedule)
    message = _run(schedule)
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


def _check_completeness(schedule: Schedule) -> None:
    counts: Counter = Counter()
    for rank, jobs in enumerate(schedule.ranks):
        for job in jobs:
            if job.is_compute:
                counts[job_key(schedule, rank, job)] += 1
    for key, n in counts.items():
        if n > 1:
            raise ScheduleError(f"job {key[0]}{_op(key[1])}{key[2]} appears {n} times")
    for stage in range(schedule.num_stages):
        for mb in range(schedule.m):
            name = f"stage {stage}, micro-batch {mb}"
            has = {kind: counts[(stage, kind, mb)] for kind in (FORWARD, BACKWARD, BACKWARD_B,
                                                                 BACKWARD_W)}
            if not has[FORWARD]:
                raise ScheduleError(f"{name}: missing forward {stage}F{mb}")
            full, split = has[BACKWARD], has[BACKWARD_B] + has[BACKWARD_W]
            if full and split:
                raise ScheduleError(f"{name}: has both a full backward and split I/W jobs")
            if not full and (has[BACKWARD_B] != 1 or has[BACKWARD_W] != 1):
                raise ScheduleError(f"{name}: needs one backward (B), or one I and one W; "
                                    f"found I x{has[BACKWARD_B]}, W x{has[BACKWARD_W]}")


def _check_local_order(schedule: Schedule) -> None:
    """F before its B / I, and I before its W, on the owning rank."""
    for rank, jobs in enumerate(schedule.ranks):
        seen: Set[JobKey] = set()
        for index, job in enumerate(jobs):
            if not job.is_compute:
                continue
            stage, kind, mb = job_key(schedule, rank, job)
            need = {BACKWARD: FORWARD, BACKWARD_B: FORWARD, BACKWARD_W: BACKWARD_B}.get(kind)
            if need and (stage, need, mb) not in seen:
                raise ScheduleError(f"rank {rank}, job #{index} ({short(schedule, rank, job)}) "
                                    f"comes before its {stage}{_op(need)}{mb}")
            seen.add((stage, kind, mb))


def _check_comm_pairs(schedule: Schedule) -> None:
    """Every send has exactly one matching recv on the peer, and vice versa."""
    graph = DependencyGraph(schedule)
    present: Counter = Counter()
    for rank, jobs in enumerate(schedule.ranks):
        for job in jobs:
            if job.is_comm:
                present[(rank, job)] += 1
    for (rank, job), n in present.items():
        if n > 1:
            raise ScheduleError(f"rank {rank}: {short(schedule, rank, job)} appears {n} times")
        peer = graph.comm_partner(rank, job)
        if peer[0] == rank:
            raise ScheduleError(f"rank {rank}: {short(schedule, rank, job)} talks to its own rank")
        if not present.get(peer):
            raise ScheduleError(f"rank {rank}: {short(schedule, rank, job)} has no matching "
                                f"{short(schedule, *peer)} on rank {peer[0]}")


def _op(kind: str) -> str:
    return {FORWARD: "F", BACKWARD: "B", BACKWARD_B: "I", BACKWARD_W: "W"}[kind]


def _run(schedule: Schedule) -> Optional[str]:
    """Execute the schedule symbolically; return a deadlock explanation or None."""
    graph = DependencyGraph(schedule)
    lowered = any(job.is_comm for jobs in schedule.ranks for job in jobs)
    done: Set[JobKey] = set()           # compute jobs finished (any rank)
    received: Set[Tuple[int, JobKey]] = set()  # (rank, key of remote producer) delivered locally
    head = [0] * schedule.pp

    def blocker(rank: int, job: Job) -> Optional[Tuple[str, Optional[Tuple[int, Job]]]]:
        """Why ``job`` at the head of ``rank`` cannot run now: (reason, (rank, job) awaited)."""
        if job.is_compute:
            for key in graph.required_keys(rank, job):
                found = graph.resolve(key)
                if found is None:
                    return f"{key[0]}{_op(key[1])}{key[2]}, which no rank runs", None
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

    def execute(rank: int, job: Job) -> None:
        if job.is_compute:
            done.add(job_key(schedule, rank, job))
        head[rank] += 1

    total = sum(len(jobs) for jobs in schedule.ranks)
    executed = 0
    while executed < total:
        progressed = False
        for rank, jobs in enumerate(schedule.ranks):
            while head[rank] < len(jobs):
                job = jobs[head[rank]]
                if blocker(rank, job) is not None:
                    break
                if job.kind in (SEND_FORWARD, SEND_BACKWARD):
                    peer_rank, peer_job = graph.comm_partner(rank, job)
                    source = graph.resolve(graph.comm_source(rank, job))
                    received.add((peer_rank, job_key(schedule, *source)))
                    execute(peer_rank, peer_job)
                    executed += 1
                elif job.kind in (RECV_FORWARD, RECV_BACKWARD):
                    break  # completes together with its send, from the sender's side
                execute(rank, job)
                executed += 1
                progressed = True
        if not progressed and executed < total:
            return _describe(schedule, head, blocker)
    return None


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

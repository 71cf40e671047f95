"""Data dependencies between the jobs of a schedule — the one definition the validator, the
simulator and the comm lowering share.

F(s, mb) needs F(s-1, mb); B or I (s, mb) needs F(s, mb) and the B-or-I of (s+1, mb);
W(s, mb) needs I(s, mb).  Send / recv jobs carry a cross-rank dependency: send_forward(s) after
F(s), recv_forward(s+1) before F(s+1); send_backward(s) after B/I(s), recv_backward(s-1) before
B/I(s-1).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .ir import (BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, RECV_BACKWARD, RECV_FORWARD,
                 SEND_BACKWARD, SEND_FORWARD, Job, Schedule)

#: (global stage, kind, micro-batch) — a job's identity independent of its rank.
JobKey = Tuple[int, str, int]
GRAD_KINDS = (BACKWARD, BACKWARD_B)


def job_key(schedule: Schedule, rank: int, job: Job) -> JobKey:
    return schedule.placement.stage(rank, job.chunk), job.kind, job.micro_batch


def short(schedule: Schedule, rank: int, job: Job) -> str:
    """Short form ``{stage}{op}{mb}`` of a job (``OPT`` for the optimizer)."""
    return str(schedule.to_action(rank, job))


class DependencyGraph:
    """Index of a schedule's compute jobs with their cross-stage dependencies."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        #: job key -> (rank, position in that rank's list)
        self.position: Dict[JobKey, Tuple[int, int]] = {}
        for rank, jobs in enumerate(schedule.ranks):
            for index, job in enumerate(jobs):
                if job.is_compute:
                    self.position.setdefault(job_key(schedule, rank, job), (rank, index))

    def _job_at(self, key: JobKey) -> Optional[Tuple[int, Job]]:
        where = self.position.get(key)
        if where is None:
            return None
        rank, index = where
        return rank, self.schedule.ranks[rank][index]

    def grad_producer(self, stage: int, micro_batch: int) -> Optional[Tuple[int, Job]]:
        """The B or I job that produces the input gradient of ``stage`` for ``micro_batch``."""
        for kind in GRAD_KINDS:
            found = self._job_at((stage, kind, micro_batch))
            if found is not None:
                return found
        return None

    def required_keys(self, rank: int, job: Job) -> List[JobKey]:
        """Keys of the compute jobs ``job`` needs (B-or-I given as kind BACKWARD)."""
        stage, kind, mb = job_key(self.schedule, rank, job)
        if kind == FORWARD:
            return [(stage - 1, FORWARD, mb)] if stage > 0 else []
        if kind in GRAD_KINDS:
            keys = [(stage, FORWARD, mb)]
            if stage + 1 < self.schedule.num_stages:
                keys.append((stage + 1, BACKWARD, mb))
            return keys
        if kind == BACKWARD_W:
            return [(stage, BACKWARD_B, mb)]
        return []

    def resolve(self, key: JobKey) -> Optional[Tuple[int, Job]]:
        stage, kind, mb = key
        return self.grad_producer(stage, mb) if kind == BACKWARD else self._job_at(key)

    def dependencies(self, rank: int, job: Job) -> List[Tuple[int, Job]]:
        """(rank, job) of every compute job that must finish before compute ``job`` starts."""
        return [found for found in map(self.resolve, self.required_keys(rank, job)) if found]

    def comm_partner(self, rank: int, job: Job) -> Tuple[int, Job]:
        """For a send / recv job: (peer rank, the matching recv / send job on the peer)."""
        placement = self.schedule.placement
        stage = placement.stage(rank, job.chunk)
        peer_stage, peer_kind = {
            SEND_FORWARD: (stage + 1, RECV_FORWARD), RECV_FORWARD: (stage - 1, SEND_FORWARD),
            SEND_BACKWARD: (stage - 1, RECV_BACKWARD), RECV_BACKWARD: (stage + 1, SEND_BACKWARD),
        }[job.kind]
        if not 0 <= peer_stage < self.schedule.num_stages:
            raise ValueError(f"{short(self.schedule, rank, job)} on rank {rank} has no peer stage "
                             f"{peer_stage}")
        peer_rank, peer_chunk = placement.rank_chunk(peer_stage)
        return peer_rank, Job(peer_kind, peer_chunk, job.micro_batch)

    def comm_source(self, rank: int, job: Job) -> Optional[JobKey]:
        """For a send job: the key of the local compute job whose output it sends."""
        stage = self.schedule.placement.stage(rank, job.chunk)
        if job.kind == SEND_FORWARD:
            return stage, FORWARD, job.micro_batch
        if job.kind == SEND_BACKWARD:
            return stage, BACKWARD, job.micro_batch
        return None


def dependencies(schedule: Schedule, rank: int, job: Job) -> List[Tuple[int, Job]]:
    """Convenience wrapper: the compute jobs ``job`` (on ``rank``) waits for."""
    return DependencyGraph(schedule).dependencies(rank, job)

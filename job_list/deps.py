"""Data dependencies between the jobs of a schedule — the one definition the validator, the
simulator and the comm lowering share.

F(s, mb) needs F(s-1, mb); B or I (s, mb) needs F(s, mb) and the B-or-I of (s+1, mb);
W(s, mb) needs I(s, mb).  Send / recv jobs carry a cross-rank dependency: send_forward(s) after
F(s), recv_forward(s+1) before F(s+1); send_backward(s) after B/I(s), recv_backward(s-1) before
B/I(s-1).

Speed: the validator, simulator and lowering walk every job of a schedule several times, so a
:class:`DependencyGraph` numbers the distinct compute keys once (``key_ids``) and resolves each
compute job's dependencies to those numbers once (:meth:`DependencyGraph.dependency_table`);
their loops then index lists instead of building keys and calling ``Placement.stage`` (which
checks its arguments on every call) per job.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .ir import (BACKWARD, BACKWARD_B, BACKWARD_W, COMPUTE_KINDS, FORWARD, SEND_BACKWARD,
                 SEND_FORWARD, Job, Schedule, other_end)

#: (global stage, kind, micro-batch) — a job's identity independent of its rank.
JobKey = Tuple[int, str, int]
GRAD_KINDS = (BACKWARD, BACKWARD_B)
#: One resolved dependency: (key id of the producing job, its rank); (-1, -1) if no rank runs it.
DepRef = Tuple[int, int]
MISSING: DepRef = (-1, -1)

_COMPUTE = frozenset(COMPUTE_KINDS)
#: send kind -> kind of the local compute job whose output it ships (BACKWARD: B or I)
_SOURCE = {SEND_FORWARD: FORWARD, SEND_BACKWARD: BACKWARD}
#: compute kind -> the jobs it needs, as (stage offset, kind) with BACKWARD meaning "the B or
#: the I"; a need on the stage before the first or after the last is dropped.
_REQUIRES = {FORWARD: ((-1, FORWARD),), BACKWARD: ((0, FORWARD), (1, BACKWARD)),
             BACKWARD_B: ((0, FORWARD), (1, BACKWARD)), BACKWARD_W: ((0, BACKWARD_B),)}


def job_key(schedule: Schedule, rank: int, job: Job) -> JobKey:
    return schedule.placement.stage(rank, job.chunk), job.kind, job.micro_batch


def short(schedule: Schedule, rank: int, job: Job) -> str:
    """Short form ``{stage}{op}{mb}`` of a job (``OPT`` for the optimizer)."""
    return str(schedule.to_action(rank, job))


class DependencyGraph:
    """Index of a schedule's compute jobs with their cross-stage dependencies."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        placement = schedule.placement
        #: (rank, chunk) -> stage and stage -> (rank, chunk), built once from the placement
        self._stage_of = {(r, c): placement.stage(r, c)
                          for r in range(placement.pp) for c in range(placement.vpp)}
        self._rank_chunk = [placement.rank_chunk(s) for s in range(placement.num_stages)]
        #: job key -> (rank, position in that rank's list); the first occurrence wins
        self.position: Dict[JobKey, Tuple[int, int]] = {}
        #: key id -> job key, numbered in order of first occurrence
        self.keys: List[JobKey] = []
        #: key_ids[rank][index]: key id of that compute job, -1 for send / recv / optimizer
        self.key_ids: List[List[int]] = []
        self._id_of: Dict[JobKey, int] = {}
        self._rank_of_id: List[int] = []  # key id -> rank of its first occurrence
        id_of, keys = self._id_of, self.keys
        for rank, jobs in enumerate(schedule.ranks):
            # chunk -> stage on this rank (chunks are >= 0, so no negative index wraps around)
            stages = [placement.stage(rank, c) for c in range(placement.vpp)] \
                if rank < placement.pp else []
            row = []
            for index, job in enumerate(jobs):
                kind = job.kind
                if kind not in _COMPUTE:
                    row.append(-1)
                    continue
                try:
                    stage = stages[job.chunk]
                except IndexError:
                    stage = placement.stage(rank, job.chunk)  # raises its ValueError
                key = (stage, kind, job.micro_batch)
                kid = id_of.get(key)
                if kid is None:
                    kid = id_of[key] = len(keys)
                    keys.append(key)
                    self.position[key] = (rank, index)
                    self._rank_of_id.append(rank)
                row.append(kid)
            self.key_ids.append(row)
        self._by_id: Optional[List[Tuple[DepRef, ...]]] = None
        self._dependency_table: Optional[List[List[Optional[Tuple[DepRef, ...]]]]] = None
        self._peers: Dict[Tuple[int, str, int], Optional[Tuple[int, str, int]]] = {}

    # ------------------------------------------------------------------ fast integer views

    def stage(self, rank: int, chunk: int) -> int:
        """``placement.stage(rank, chunk)`` from a table (same ValueError when out of range)."""
        stage = self._stage_of.get((rank, chunk))
        return self.schedule.placement.stage(rank, chunk) if stage is None else stage

    def resolve_id(self, key: JobKey) -> int:
        """:meth:`resolve` as a key id (-1 if no rank runs it): kind BACKWARD means B, else I."""
        stage, kind, mb = key
        if kind == BACKWARD:
            kid = self._id_of.get(key, -1)
            return kid if kid >= 0 else self._id_of.get((stage, BACKWARD_B, mb), -1)
        return self._id_of.get(key, -1)

    def rank_of_id(self, kid: int) -> int:
        """Rank of the (first) job with key id ``kid``."""
        return self._rank_of_id[kid]

    def dependency_by_id(self) -> List[Tuple[DepRef, ...]]:
        """Per key id: one (key id, rank) per :meth:`required_keys` entry, resolved, in that
        order (:data:`MISSING` where no rank runs it).  Computed once per graph."""
        if self._by_id is None:
            id_of, rank_of_id = self._id_of, self._rank_of_id
            num_stages = self.schedule.num_stages
            by_id = []
            for stage, kind, mb in self.keys:  # the loop of _required_of_key and resolve_id
                refs = []
                for offset, need in _REQUIRES.get(kind, ()):
                    other = stage + offset
                    if (offset < 0 and other < 0) or (offset > 0 and other >= num_stages):
                        continue
                    kid = id_of.get((other, need, mb), -1)
                    if kid < 0 and need == BACKWARD:
                        kid = id_of.get((other, BACKWARD_B, mb), -1)
                    refs.append(MISSING if kid < 0 else (kid, rank_of_id[kid]))
                by_id.append(tuple(refs))
            self._by_id = by_id
        return self._by_id

    def dependency_table(self) -> List[List[Optional[Tuple[DepRef, ...]]]]:
        """``table[rank][index]``: :meth:`dependency_by_id` of that compute job; None for
        others.  Computed once per graph (duplicate jobs share their tuple)."""
        if self._dependency_table is None:
            by_id = self.dependency_by_id()
            self._dependency_table = [[None if kid < 0 else by_id[kid] for kid in row]
                                      for row in self.key_ids]
        return self._dependency_table

    def comm_peer(self, rank: int, job: Job) -> Optional[Tuple[int, str, int]]:
        """For a send / recv job: (peer rank, peer kind, peer chunk), None if the peer stage is
        outside the pipeline (:meth:`comm_partner` then raises)."""
        memo = (rank, job.kind, job.chunk)  # the peer does not depend on the micro-batch
        if memo in self._peers:
            return self._peers[memo]
        peer_stage, peer_kind = other_end(job.kind, self.stage(rank, job.chunk))
        peer = None
        if 0 <= peer_stage < self.schedule.num_stages:
            if peer_stage < len(self._rank_chunk):
                peer_rank, peer_chunk = self._rank_chunk[peer_stage]
            else:  # schedule and placement disagree on the stage count: the placement raises
                peer_rank, peer_chunk = self.schedule.placement.rank_chunk(peer_stage)
            peer = peer_rank, peer_kind, peer_chunk
        self._peers[memo] = peer
        return peer

    # ------------------------------------------------------------------ the documented API

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
        return self._required_of_key((self.stage(rank, job.chunk), job.kind, job.micro_batch))

    def _required_of_key(self, key: JobKey) -> List[JobKey]:
        stage, kind, mb = key
        num_stages = self.schedule.num_stages
        return [(stage + offset, need, mb) for offset, need in _REQUIRES.get(kind, ())
                if not ((offset < 0 and stage + offset < 0)
                        or (offset > 0 and stage + offset >= num_stages))]

    def resolve(self, key: JobKey) -> Optional[Tuple[int, Job]]:
        stage, kind, mb = key
        return self.grad_producer(stage, mb) if kind == BACKWARD else self._job_at(key)

    def dependencies(self, rank: int, job: Job) -> List[Tuple[int, Job]]:
        """(rank, job) of every compute job that must finish before compute ``job`` starts."""
        return [found for found in map(self.resolve, self.required_keys(rank, job)) if found]

    def comm_partner(self, rank: int, job: Job) -> Tuple[int, Job]:
        """For a send / recv job: (peer rank, the matching recv / send job on the peer)."""
        peer = self.comm_peer(rank, job)
        if peer is None:
            peer_stage, _ = other_end(job.kind, self.stage(rank, job.chunk))
            raise ValueError(f"{short(self.schedule, rank, job)} on rank {rank} has no peer stage "
                             f"{peer_stage}")
        peer_rank, peer_kind, peer_chunk = peer
        return peer_rank, Job(peer_kind, peer_chunk, job.micro_batch)

    def comm_source(self, rank: int, job: Job) -> Optional[JobKey]:
        """For a send job: the key of the local compute job whose output it sends."""
        stage = self.stage(rank, job.chunk)
        kind = _SOURCE.get(job.kind)
        return None if kind is None else (stage, kind, job.micro_batch)


def dependencies(schedule: Schedule, rank: int, job: Job) -> List[Tuple[int, Job]]:
    """Convenience wrapper: the compute jobs ``job`` (on ``rank``) waits for."""
    return DependencyGraph(schedule).dependencies(rank, job)

"""The CPU world ring with more than two pipeline ranks: one communicator serves every
transfer, so every process takes part in every exchange of the step, at its place in the plan
opening's global order (a *bystander* job for an exchange between two other ranks)."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import List

import paddle

from pipesplit.job_list import OPTIMIZER, Schedule
from pipesplit.job_list.ir import SEND_BACKWARD, SEND_FORWARD, job_type, other_end
from pipesplit.passes.transport.launch_store import launch_store, round_key
from pipesplit.passes.transport.p2p import Transfer, handoff_type, world_ring_comm
from pipesplit.passes.transport.rank_comm import RankComm, RankPrograms, own_jobs


def comm_transfers(kind: str, stage: int, transfers: List[Transfer]) -> List[Transfer]:
    """The transfers the send / recv of ``kind`` on ``stage`` carries, by name."""
    other, _ = other_end(kind, stage)
    ends = (stage, other) if kind in (SEND_FORWARD, SEND_BACKWARD) else (other, stage)
    return sorted((t for t in transfers if (t.src_stage, t.dst_stage) == ends),
                  key=lambda t: t.name)


def world_transfers(found: list, schedule: Schedule, rank: int) -> List[Transfer]:
    """Every cross-rank transfer of the step, on every rank: the CPU world-ring transport
    (more than two ranks) needs each rank to take part in the others' exchanges, but the engine
    gives each rank only its own program (``found``: its
    :class:`~pipesplit.passes.engine.engine_rank.EngineTransfer` list).  The senders publish shapes
    and dtypes through the launcher's TCP store; this rank's own transfers keep their names."""
    store = launch_store()
    key = round_key("engine", paddle.distributed.get_rank(), store)
    sends = [[t.kind, t.transfer.src_stage, t.transfer.dst_stage, t.transfer.dst,
              [int(d) for d in t.transfer.shape], str(t.transfer.dtype).replace("paddle.", "")]
             for t in found if t.kind in (SEND_FORWARD, SEND_BACKWARD)]
    store.set(f"{key}/{rank}", json.dumps(sends).encode())
    out = [t.transfer for t in found]
    for other in range(schedule.pp):
        if other == rank:
            continue
        published = json.loads(bytes(store.get(f"{key}/{other}")).decode())
        for i, (kind, src_stage, dst_stage, dst, shape, dtype) in enumerate(published):
            if dst != rank:  # this rank's own recvs are in ``found``
                out.append(Transfer(f"rank{other}_{job_type(kind, src_stage)}_{i:04d}",
                                    handoff_type(shape, dtype), other, dst, src_stage,
                                    dst_stage))
    return out


def world_ring_order(schedule, sequence, rank, transfers, own_order, own_comm, programs,
                      progress):
    """CPU: the rank's job order with a bystander job for every exchange between two other
    ranks, at its place in the global order ``sequence`` (the plan opening's, of every rank's
    lowered jobs; ``programs`` gets the bystander programs).
    Returns (job order, comm sequence, bystander job type -> (sender, receiver)).  Removing the
    bystander jobs gives ``own_order`` back (checked): the GPU order."""
    placement = schedule.placement
    exchanges, sends = [], []  # sends: index in ``sequence`` of each exchange's send
    for index, (who, job) in enumerate(sequence):
        if job.kind in (SEND_FORWARD, SEND_BACKWARD):
            exchanges.append(comm_transfers(job.kind, placement.stage(who, job.chunk),
                                             transfers))
            sends.append(index)
    bystander_programs, roles = world_ring_comm(exchanges, rank, progress=progress)
    programs.update(bystander_programs)
    role_at = dict(zip(sends, roles))
    pairs = {t: (exchange[0].src, exchange[0].dst) for exchange, t in zip(exchanges, roles)
             if t is not None}
    order, comm_sequence, own = [], [], iter(own_comm)
    for index, (who, job) in enumerate(sequence):
        if job.kind == OPTIMIZER:
            continue
        if who == rank:
            order.append((job.type, job.micro_batch))
            if job.is_comm:
                comm_sequence.append(next(own))
        elif role_at.get(index) is not None:
            order.append((role_at[index], job.micro_batch))
            comm_sequence.append((role_at[index], job.micro_batch, who))
    if [o for o in order if o[0] not in pairs] != own_order:
        raise AssertionError(f"rank {rank}: the global order's own jobs differ from the "
                             "lowered list")
    return order, comm_sequence, pairs


def world_ring_jobs(transport, rank: RankPrograms) -> RankComm:
    """The world ring's comm jobs of ``rank`` (``transport``: the plan's): its own
    (:func:`~.rank_comm.own_jobs`), then a bystander job for every exchange between two other
    ranks, at its place in the plan opening's global order (:func:`world_ring_order`)."""
    own = own_jobs(transport, rank)
    order, comm_sequence, bystanders = world_ring_order(
        rank.opened.schedule, rank.opened.order, rank.rank, rank.step_transfers(),
        own.job_order, own.comm_sequence, rank.programs, rank.progress)
    return replace(own, job_order=order, comm_sequence=comm_sequence, bystanders=bystanders)

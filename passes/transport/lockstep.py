"""The CPU transport of hybrid meshes (dp / mp beside pp): every collective on the world ring.

On a CPU build one process can use one communicator (see :mod:`pipesplit.passes.transport.world_ring`),
so with data or tensor parallelism beside the pipeline every collective of every job becomes a
world gather that every process issues at the same point.  The step runs in lockstep: the
processes follow one global order of every pipeline rank's jobs
(the plan opening's, the lowering's own), each running its own jobs
and a *bystander* job for every job of another stage that gathers; the optimizers, which differ
between stages, interleave their gathers inside one program.  All replicas of a stage (its dp /
mp peers) run the same jobs at the same time, so one gather serves all of them.  Removing the
bystander jobs gives the GPU path's job order.  Shapes of other stages' gathers come through the
launcher's TCP store.
"""
from __future__ import annotations

import json
from typing import Dict, List, Sequence, Tuple

from pipesplit.job_list import OPTIMIZER, Schedule
from pipesplit.job_list.ir import (COMM_KINDS, RECV_BACKWARD, RECV_FORWARD, SEND_BACKWARD,
                                   SEND_FORWARD, bystander_type, job_type, parse_bystander_type)
from pipesplit.job_list.lower import RankJob, peer_of
from pipesplit.job_list.pipe import Pipe

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.passes.transport.launch_store import launch_store, round_key
from pipesplit.passes.transport.rank_comm import RankComm, RankPrograms

paddle = require_supported_paddle()

from pipesplit.passes.transport.world_ring import (bystander_program, collective_sequence,  # noqa: E402
                                           emulate_group_collectives, emulate_with_bystanders,
                                           merge_sequences, world_comm_program)

def ring_ranks(ring_id: int) -> Tuple[int, ...]:
    """The processes of the engine's ring ``ring_id``, in its order (``peer`` indexes them)."""
    from paddle.distributed.auto_parallel.static.process_group import get_process_group

    group = get_process_group(ring_id)
    if group is None:
        raise ValueError(f"the engine program uses ring {ring_id}, which has no process group")
    return tuple(group.ranks)


def _within_stage(pipe: Pipe, process: int):
    """``group_ranks`` for the compute jobs: a group must not span pipeline stages."""
    def group_ranks(ring_id: int):
        members = ring_ranks(ring_id)
        others = set(members) & set(pipe.processes) - {process}
        if others:
            raise ValueError(f"the engine program has a collective on ring {ring_id} (processes "
                             f"{list(members)}) that spans pipeline stages (processes "
                             f"{sorted(others)} run other stages of this pipeline); pipesplit's "
                             "CPU transport serves dp / mp groups within one stage")
        return members
    return group_ranks


def _exchange(payload: dict, pipe: Pipe) -> Dict[int, dict]:
    """Every pipeline rank's ``payload`` (as its process in this pipeline published it)."""
    store = launch_store()
    me = paddle.distributed.get_rank()
    key = round_key("hybrid", me, store)
    store.set(f"{key}/{me}", json.dumps(payload).encode())
    return {r: json.loads(bytes(store.get(f"{key}/{p}")).decode())
            for r, p in enumerate(pipe.processes)}


def _as_gathers(signature) -> List[Tuple[Tuple[int, ...], str]]:
    return [(tuple(shape), dtype) for shape, dtype in signature]


def lockstep_order(sequence: Sequence[RankJob], lowered: Schedule, rank: int,
                   gathers: Dict[int, Dict[str, list]]) -> List[Tuple[str, int]]:
    """This pipeline rank's jobs in the global order ``sequence`` (the plan opening's, of every
    rank's ``lowered`` jobs), with a bystander job wherever another rank runs a job that
    gathers (``gathers[r][job type]`` non-empty); a send and its recv share their gathers, so
    neither end bystands the other."""
    order, own = [], []
    for who, job in sequence:
        if job.kind == OPTIMIZER:
            continue
        if who == rank:
            order.append((job.type, job.micro_batch))
            own.append((job.type, job.micro_batch))
        elif job.kind in (RECV_FORWARD, RECV_BACKWARD):
            continue  # its gathers were issued with its send
        elif job.kind in (SEND_FORWARD, SEND_BACKWARD) and peer_of(lowered, who, job) == rank:
            continue  # this rank's recv comes next
        elif gathers[who].get(job.type):
            order.append((bystander_type(who, job.type), job.micro_batch))
    expected = [(j.type, j.micro_batch) for j in lowered.ranks[rank] if j.kind != OPTIMIZER]
    if own != expected:
        raise AssertionError(f"rank {rank}: the global order's own jobs differ from the lowered "
                             "list")
    return order


def _optimizer_plan(merged, rank: int):
    """The optimizer's gathers on ``rank``: its own, and the others' as bystander gathers."""
    return [("own", None) if rank in (owner, peer) else ("bystander", gather)
            for owner, peer, gather in merged]


def lockstep_jobs(transport, rank: RankPrograms) -> RankComm:
    """Rewrite ``rank.programs`` (in place) for the CPU world ring, add the comm and bystander
    programs; the job order is the plan opening's global order without the optimizer (its
    lockstep jobs count no progress).  ``transport``: the plan's (its ``world``)."""
    world = transport.world
    process = rank.process
    gathers: Dict[str, list] = {}
    programs = rank.programs
    for program_type, program in programs.items():
        if program_type != OPTIMIZER:
            gathers[program_type] = emulate_group_collectives(program, process, world,
                                                              _within_stage(rank.pipe, process))
    for chunk in range(rank.num_chunks):
        for kind in COMM_KINDS:
            comm_type = job_type(kind, chunk)
            programs[comm_type], gathers[comm_type] = world_comm_program(
                rank.transfers_of(kind, chunk), process, world)
    optimizer = programs.get(OPTIMIZER)  # (evaluation and prediction have none)
    sequence = [] if optimizer is None else [
        (kind, None if peer is None else rank.pipe.rank_of(peer), gather)
        for kind, peer, gather in collective_sequence(optimizer, ring_ranks)]
    everyone = _exchange({"jobs": gathers, "optimizer": sequence}, rank.pipe)
    jobs = {r: {t: _as_gathers(sig) for t, sig in p["jobs"].items()} for r, p in everyone.items()}
    order = lockstep_order(rank.opened.order, rank.opened.lowered, rank.rank, jobs)
    for program_type, _ in order:
        bystander = parse_bystander_type(program_type)
        if bystander is not None and program_type not in programs:
            who, own_type = bystander
            programs[program_type] = bystander_program(jobs[who][own_type], world)
    if optimizer is not None:
        merged = merge_sequences({r: [(k, peer, (tuple(g[0]), g[1]))
                                      for k, peer, g in p["optimizer"]]
                                  for r, p in everyone.items()})
        emulate_with_bystanders(optimizer, process, world, ring_ranks,
                                _optimizer_plan(merged, rank.rank))
    return RankComm(order)

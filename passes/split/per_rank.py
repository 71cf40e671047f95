"""One rank's programs of a multi-process pipeline (``pp_stage = r``).

The input program holds every virtual stage (chunk id = GLOBAL stage).  It is split as in the
one-process emulation (:func:`pipesplit.ir_utils.split_program`); then rank ``r`` keeps the
sub-programs of its own stages, typed by LOCAL chunk ``c`` (stage = ``placement.stage(r, c)``):
``forward{c}``, ``backward{c}`` / ``backward_b{c}`` / ``backward_w{c}``, ``send_forward{c}``,
``recv_forward{c}``, ``send_backward{c}``, ``recv_backward{c}`` and ``optimizer``.

* Handoffs crossing from stage ``s`` to ``s+1`` (forward) or ``s`` to ``s-1`` (input gradients)
  between two ranks become p2p transfers in the send / recv sub-programs
  (:mod:`pipesplit.passes.transport.p2p`: gloo broadcasts on the world ring on CPU, NCCL send_v2 /
  recv_v2 on GPU).
  Adjacent stages on one rank (the V placement's turn) hand over in memory.
* The optimizer sub-program keeps only the updates of the parameters this rank's stages use;
  global-norm clipping's squared norm and a tied weight's gradient are summed over the ranks
  with an all-reduce first (:func:`filter_optimizer`).
* The build follows every builder's order (:class:`~pipesplit.passes.split.builder.PlanBuilder`):
  :class:`WholeModelRankBuilder` fills the rank's communication.
* The comm programs and the job order are the plan's transport's
  (:meth:`~pipesplit.passes.transport.base.Transport.rank_comm`, the back half both rank
  builders share: :mod:`pipesplit.passes.transport.rank_comm`): the rank's list from
  :func:`pipesplit.job_list.lower.lower_comm` (a rendezvous-safe order: every rank issues its
  communications in one global order), optimizer last.  On CPU with more than two ranks every
  broadcast involves all ranks (the world-ring transport,
  :func:`pipesplit.passes.transport.p2p.world_ring_comm`): the rank's list then also holds a
  ``bystander{s}_{t}`` job for each exchange between two other ranks, at its place in
  :func:`pipesplit.job_list.lower.global_order`; without them it is the GPU list.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

from pipesplit.job_list import OPTIMIZER, Schedule
from pipesplit.job_list.ir import (BACKWARD, BACKWARD_B, COMPUTE_KINDS, FORWARD,
                                   SEND_BACKWARD, SEND_FORWARD, job_type, other_end,
                                   parse_job_type)
from pipesplit.job_list.pipe import Pipe

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes.split.builder import RankJobs, RankPlanBuilder

paddle = require_supported_paddle()

from pipesplit.passes.transport.progress import CommProgress  # noqa: E402
from pipesplit.passes.transport.ring_order import comm_transfers  # noqa: E402
from pipesplit.ir_utils.extract import SplitProgram  # noqa: E402
from pipesplit.passes.transport.base import Transport  # noqa: E402
from pipesplit.passes.transport.devices import rank_plan_transport  # noqa: E402
from pipesplit.passes.transport.p2p import Transfer, first_user, producer_of  # noqa: E402
from pipesplit.passes.transport.rank_comm import (CommJobInfo, EventSites,  # noqa: E402
                                                  RankPrograms)


@dataclass
class RankInfo:
    """Rank-specific facts of a per-rank plan (``PipelinePlan.rank_info``)."""

    rank: int
    pp: int
    transport: Transport              # the plan's (way chosen): gloo on CPU, NCCL on GPU
    stages: Dict[int, int]            # local chunk -> global stage
    param_names: List[str]            # parameters this rank holds and updates
    comm: Dict[str, CommJobInfo] = field(default_factory=dict)
    ring_ids: Dict[Tuple[int, int], int] = field(default_factory=dict)
    fetch_names: List[str] = field(default_factory=list)
    feed_names: List[str] = field(default_factory=list)   # data ops this rank's programs read
    # the rank's comm jobs of one step, in order: (job type, micro-batch, peer); a bystander
    # job's peer is the sender of the exchange it takes part in
    comm_sequence: List[Tuple[str, int, Optional[int]]] = field(default_factory=list)
    # CPU world-ring transport: bystander job type -> (sender, receiver) of its exchange
    bystanders: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    # all-reduces in the optimizer (global-norm clipping, tied weights) and their NCCL ring
    num_all_reduces: int = 0
    reduce_ring_id: Optional[int] = None

    @property
    def backend(self) -> str:
        """Paddle's name of the plan's collective backend."""
        return self.transport.backend

    @property
    def progress(self) -> CommProgress:
        """This rank's comm jobs, for naming the one a failed or stalled step was in."""
        return CommProgress(self.comm_sequence, self.bystanders)


def _names_in(program) -> Set[str]:
    """Persistable / named values a program refers to: kwargs, parameters, data, outputs."""
    out = set()
    blk = program.global_block()
    out.update(blk.kwargs())
    for op in blk.ops:
        name = op.name()
        if name == "builtin.parameter":
            out.add(op.attrs()["parameter_name"])
        elif name == "pd_op.data":
            out.add(op.attrs()["name"])
        elif name == "builtin.shadow_output":
            out.add(op.attrs()["output_name"])
    return out


def _params_in(program) -> Set[str]:
    return {op.attrs()["parameter_name"] for op in program.global_block().ops
            if op.name() == "builtin.parameter"}


def _data_in(program) -> Set[str]:
    """Names of the (non-persistable) data ops a program reads: the feeds."""
    return {op.attrs()["name"] for op in program.global_block().ops
            if op.name() == "pd_op.data" and not op.result(0).persistable}


def cross_rank_transfers(split: SplitProgram, schedule: Schedule) -> List[Transfer]:
    """Every handoff crossing between two ranks, once per (name, receiving stage)."""
    placement = schedule.placement
    out = []
    for name in sorted(split.handoffs):
        h = split.handoffs[name]
        pkind, pstage = parse_job_type(h.producer)
        if pstage is None:
            continue
        seen = set()
        for consumer in h.consumers:
            ckind, cstage = parse_job_type(consumer)
            if cstage is None:
                raise ValueError(f"handoff {name} from {h.producer} is read by the optimizer")
            if placement.rank_of(cstage) == placement.rank_of(pstage) or cstage in seen:
                continue
            forward = pkind == FORWARD and cstage == other_end(SEND_FORWARD, pstage)[0]
            backward = pkind in (BACKWARD, BACKWARD_B) and \
                cstage == other_end(SEND_BACKWARD, pstage)[0]
            if not (forward or backward):
                raise ValueError(
                    f"handoff {name} goes from {h.producer} (stage {pstage}) to {consumer} "
                    f"(stage {cstage}) on another rank; across ranks only a forward output to "
                    "the next stage and an input gradient (backward / backward_b) to the "
                    "previous stage can be sent")
            seen.add(cstage)
            value = split.programs[consumer].global_block().kwargs()[name]
            out.append(Transfer(name, value.type(), placement.rank_of(pstage),
                                placement.rank_of(cstage), pstage, cstage))
    return out


def filter_optimizer(program, owners: Dict[str, Set[int]], rank: int, pp: int,
                     all_reduce_sum: Callable[[object], object]) -> int:
    """Turn the whole model's optimizer sub-program into rank ``rank``'s (in place).

    ``owners``: persistable name (parameter, gradient accumulator, counter) -> the ranks whose
    compute programs use it.  Every value gets the set of ranks that hold it (intersection of
    its operands'; names without owner, such as the learning rate or optimizer moments, are
    everywhere).  An op the rank does not hold is erased.  A sum whose terms no one rank holds
    -- global-norm clipping's sum of squared norms, a tied weight's sum of gradient
    contributions -- becomes a partial sum of the terms this rank is the first holder of,
    then ``all_reduce_sum`` over the pipeline ranks (every rank meets these sums in the same
    program order, so the collectives match; a rank holding none of the terms, such as a
    middle rank for a tied weight, still takes part with zeros).  Any other op mixing ranks raises ValueError.
    Returns the number of all-reduces inserted."""
    everyone = frozenset(range(pp))
    blk = program.global_block()
    holders: Dict[int, frozenset] = {kw.id: frozenset(owners.get(name, everyone))
                                     for name, kw in blk.kwargs().items()}

    def held(v):
        return holders.get(v.id, everyone)

    erased: Set[int] = set()
    drop = []
    orphans = []
    reductions = 0
    # the all-reduces stay on every rank, used or not: all pipeline ranks take part in each
    # (a tied weight's rank-less neighbours too), in program order
    collectives: Set[int] = set()
    for op in list(blk.ops):
        if op.id() in erased:
            continue
        srcs = [v for v in op.operands_source() if v is not None and v.initialized()]
        if op.name() == "builtin.parameter":
            ranks = frozenset(owners.get(op.attrs()["parameter_name"], everyone))
        else:
            ranks = everyone.intersection(*(held(v) for v in srcs))
        if not ranks:
            chain = _cross_rank_sum(op)
            if chain is None:
                raise ValueError(
                    f"optimizer op {op.name()} combines values held by different pipeline "
                    "ranks and is not a sum pipesplit can all-reduce (a tied weight's gradient "
                    "contributions or global-norm clipping's squared norms)")
            mine = [v for v in srcs if rank in held(v) and rank == min(held(v))]
            # terms another rank counts: their producers are left without users below
            orphans += [(d.id(), d) for d in (v.get_defining_op() for v in srcs
                                               if not any(v.id == t.id for t in mine))
                        if d is not None]
            total = _all_reduced_partial_sum(chain, mine, all_reduce_sum)
            holders[total.id] = everyone
            collectives.add(total.get_defining_op().id())
            erased.update(o.id() for o in chain)
            for o in reversed(chain):
                o.erase()
            reductions += 1
            continue
        for r in op.results():
            holders[r.id] = ranks
        if rank not in ranks:
            drop.append(op)

    _erase_with_unused_producers(drop, orphans, collectives)
    for name in list(blk.kwargs()):
        if rank not in owners.get(name, everyone) and blk.kwargs()[name].use_empty():
            blk.erase_kwarg(name)
    return reductions


def _erase_with_unused_producers(drop, orphans, keep: Set[int]) -> None:
    """Erase the ops ``drop`` (in reverse program order), then every producer left without
    users by that or among ``orphans`` ((op id, op) pairs), transitively: parameters,
    constants, casts ...  Ops whose id is in ``keep`` (the collectives) stay."""
    def producers(op):
        return [(d.id(), d) for d in (v.get_defining_op() for v in op.operands_source()
                                      if v is not None and v.initialized()) if d is not None]

    erased = {op.id() for op in drop}
    candidates = [(oid, op) for oid, op in orphans if oid not in erased]
    for op in reversed(drop):
        candidates += producers(op)
        op.erase()
    while candidates:
        oid, op = candidates.pop()
        if oid in erased or oid in keep or not op.num_results() \
                or not all(r.use_empty() for r in op.results()):
            continue
        candidates += producers(op)
        erased.add(oid)
        op.erase()


def _cross_rank_sum(combine_op):
    """The ops of a full sum over the values ``combine_op`` packs: [combine, add_n] or
    [combine, stack, sum over every axis]; None for anything else."""
    if combine_op.name() != "builtin.combine":
        return None
    users = combine_op.result(0).all_used_ops()
    if len(users) != 1:
        return None
    user = users[0]
    if user.name() == "pd_op.add_n":
        return [combine_op, user]
    if user.name() != "pd_op.stack":
        return None
    sums = user.result(0).all_used_ops()
    if len(sums) != 1 or sums[0].name() != "pd_op.sum" or sums[0].attrs().get("keepdim"):
        return None
    axis = sums[0].operand_source(1).get_defining_op()
    if axis is None or axis.name() != "pd_op.full_int_array" or list(axis.attrs()["value"]):
        return None  # a sum over some axes only is not a sum of the terms
    return [combine_op, user, sums[0]]


def _all_reduced_partial_sum(chain, terms, all_reduce_sum):
    """Before the last op of ``chain``: this rank's ``terms`` summed (zeros if none), in the
    chain result's shape, all-reduced; the chain's result is replaced by it."""
    result = chain[-1].result(0)
    shape = [int(s) for s in result.shape]
    paddle.pir.set_insertion_point(chain[-1])
    if not terms:
        partial = paddle.full(shape, 0.0, dtype=result.dtype)
    else:
        partial = terms[0] if len(terms) == 1 else paddle._C_ops.add_n(terms)
        if [int(s) for s in partial.shape] != shape:
            partial = paddle.reshape(partial, shape)
    total = all_reduce_sum(partial)
    for v in (partial, total):
        d = v.get_defining_op()
        if d is not None and d.op_role != 2:
            d.op_role = 2
    result.replace_all_uses_with(total)
    return total


def build_rank_plan(main_program, startup_program, config: PipelineConfig,
                    device: str = "auto", progress: bool = True, requested=None,
                    overlap: bool = True):
    """The :class:`~pipesplit.passes.split.core.PipelinePlan` of rank ``config.pp_stage``
    (:class:`WholeModelRankBuilder`).

    ``device``: "cpu" (gloo broadcasts on the world ring, any pp_degree), "gpu" (NCCL send_v2 / recv_v2) or
    "auto" (from Paddle's current expected place).  ``progress``: comm programs bump the
    persistable counter :data:`pipesplit.passes.transport.p2p.PROGRESS_VAR` (zero it per step) so a
    watchdog can name the comm job a stuck rank waits in.  ``overlap`` (NCCL): transfers on
    streams of their own, tied to their producers and consumers by events, or on the compute
    stream in job order (``strategy.pipeline.enable_send_recv_overlap``).
    """
    if config.pp_stage is None:
        raise ValueError("build_rank_plan needs pp_stage (this process's pipeline rank)")
    transport = rank_plan_transport(device, config.pp_degree, overlap)
    return WholeModelRankBuilder(main_program, config, transport, progress, requested).build()


class WholeModelRankBuilder(RankPlanBuilder):
    """Rank ``config.pp_stage`` of the whole model: the base's split (global stages, with
    accumulation and fetches); the rank keeps its own stages' programs under local job types,
    its handoffs to other ranks become transfers, its optimizer keeps its parameters."""

    def __init__(self, main_program, config: PipelineConfig, transport: Transport,
                 progress: bool, requested=None):
        super().__init__(main_program, config, requested)
        self.transport = transport      # the plan's, its way chosen for pp processes
        self.progress = progress
        # (set from the split by rank_programs, read by rank_jobs)
        self.stages: Dict[int, int] = {}                 # local chunk -> global stage
        self.owners: Dict[str, Set[int]] = {}            # persistable name -> its ranks
        self.params: Set[str] = set()                    # parameters the compute programs use

    def rank_programs(self, opened, split) -> RankPrograms:
        config, schedule = self.config, opened.schedule
        self.stages = stages = {c: schedule.placement.stage(config.pp_stage, c)
                                for c in range(config.vpp_degree)}
        self.owners, self.params = _ownership(split, schedule.placement)
        programs = _local_compute_programs(split, stages, schedule.is_forward_only)
        transfers = cross_rank_transfers(split, schedule)
        return RankPrograms(
            rank=config.pp_stage, pipe=Pipe.single_process_per_stage(config.pp_degree),
            opened=opened, num_chunks=config.vpp_degree, programs=programs,
            transfers_of=lambda kind, chunk: comm_transfers(kind, stages[chunk], transfers),
            step_transfers=lambda: transfers, event_sites=_WholeModelSites(split, stages),
            ring_ids=self.transport.p2p_rings(schedule), progress=self.progress)

    def plan_transport(self, rank: RankPrograms) -> Transport:
        return self.transport

    def rank_jobs(self, split, rank: RankPrograms, comm, transport: Transport) -> RankJobs:
        """The comm order, then the optimizer cut to this rank's parameters (its all-reduce
        ring, if any, made after the p2p rings: in the same order on every rank)."""
        programs = rank.programs
        programs[OPTIMIZER], num_all_reduces, reduce_ring_id = _rank_optimizer(
            split.programs[OPTIMIZER], self.owners, rank.rank, self.config.pp_degree, transport)
        order = list(comm.job_order)
        if not rank.opened.schedule.is_forward_only:
            order.append((OPTIMIZER, 0))
        rank_split = _rank_split(split, programs, self.stages, self.config.vpp_degree)
        info = RankInfo(rank=rank.rank, pp=self.config.pp_degree, transport=transport,
                        stages=self.stages, param_names=self._params_of(rank.rank),
                        comm=comm.comm, ring_ids=rank.ring_ids,
                        fetch_names=[n for _, n in rank_split.fetches],
                        feed_names=_feeds_of(programs, order),
                        comm_sequence=comm.comm_sequence, bystanders=comm.bystanders,
                        reduce_ring_id=reduce_ring_id, num_all_reduces=num_all_reduces)
        return RankJobs(order, programs, rank_split, recorded={"rank_info": info})

    def _params_of(self, rank: int) -> List[str]:
        """The parameters rank ``rank`` holds and updates."""
        local = {n for n, ranks in self.owners.items() if rank in ranks}
        return sorted(p for p in self.params if p in local)


def _feeds_of(programs, order) -> List[str]:
    """The data ops the programs of ``order``'s jobs read."""
    used = dict.fromkeys(t for t, _ in order)
    return sorted(set().union(*(_data_in(programs[t]) for t in used)))


def _ownership(split: SplitProgram, placement) -> Tuple[Dict[str, Set[int]], Set[str]]:
    """(persistable name -> the ranks whose compute programs use it, every parameter a compute
    program uses).  A parameter used by stages on several ranks (tied weights) lives on each of
    them: its gradient contributions are all-reduced in the optimizer (filter_optimizer)."""
    owners: Dict[str, Set[int]] = {}
    params: Set[str] = set()
    for t, prog in split.programs.items():
        kind, stage = parse_job_type(t)
        if kind not in COMPUTE_KINDS:
            continue
        for n in _names_in(prog):
            owners.setdefault(n, set()).add(placement.rank_of(stage))
        params |= _params_in(prog)
    return owners, params


def _local_compute_programs(split: SplitProgram, stages: Dict[int, int], forward_only: bool
                            ) -> Dict[str, object]:
    """The rank's compute programs under local job types (``backward1`` for its chunk 1); a
    stage's backward is one job or B / W as its schedule runs it (split_chunks_of)."""
    kinds = [FORWARD] if forward_only else list(COMPUTE_KINDS)
    return {job_type(kind, c): split.programs[job_type(kind, s)]
            for c, s in stages.items() for kind in kinds if job_type(kind, s) in split.programs}


def _rank_optimizer(opt, owners, rank: int, pp: int, transport: Transport):
    """(the optimizer program cut to this rank's parameters, its number of all-reduces, the
    ring of every pipeline rank they use or None)."""
    reduce_ring = []  # the transport's ring of every pipeline rank, made on first use

    def all_reduce(value):
        if not reduce_ring:
            reduce_ring.append(transport.reduce_ring(pp))
        return transport.all_reduce_sum(value, reduce_ring[0])

    with paddle.static.program_guard(opt):
        num_all_reduces = filter_optimizer(opt, owners, rank, pp, all_reduce)
    return opt, num_all_reduces, (reduce_ring[0] if reduce_ring else None)


def _rank_split(split: SplitProgram, programs, stages: Dict[int, int], num_chunks: int
                ) -> SplitProgram:
    """The rank's view of the split: its programs, the handoffs that touch its stages, its
    fetches under local job types."""
    stage_to_chunk = {s: c for c, s in stages.items()}

    def local(job_type: str) -> bool:
        return parse_job_type(job_type)[1] in stage_to_chunk

    fetches = []
    for t, n in split.fetches:
        kind, stage = parse_job_type(t)
        if stage is not None and stage in stage_to_chunk:
            fetches.append((job_type(kind, stage_to_chunk[stage]), n))
    rank_split = SplitProgram(
        programs=dict(programs), num_chunks=num_chunks, split_backward=split.split_backward,
        handoffs={n: h for n, h in split.handoffs.items()
                  if local(h.producer) or any(local(c) for c in h.consumers)},
        fetches=fetches)
    rank_split.accumulation = split.accumulation
    return rank_split


class _WholeModelSites(EventSites):
    """Where a transfer's value is made and read in the whole model's split (the producer's
    and the consumers' programs by global stage), for the stream events of the GPU."""

    def __init__(self, split: SplitProgram, stages: Dict[int, int]):
        self.split, self.stages = split, stages

    def before_send(self, kind, chunk, transfer):
        handoff = self.split.handoffs[transfer.name]
        producer = producer_of(self.split.programs[handoff.producer], transfer.name)
        return [] if producer is None else [(producer, f"pipesplit_{kind}_{transfer.name}")]

    def after_recv(self, kind, chunk, transfer):
        out = []
        for consumer in self.split.handoffs[transfer.name].consumers:
            if parse_job_type(consumer)[1] != self.stages[chunk]:
                continue
            user = first_user(self.split.programs[consumer], transfer.name)
            if user is not None:
                out.append((user, f"pipesplit_{kind}_{transfer.name}_{consumer}"))
        return out

"""One rank's plan from the program Paddle's auto-parallel engine hands its pipeline pass.

``paddle.distributed.to_static`` partitions the model per rank before it calls
``pir_pass.pipeline_pass`` (see docs/engine.md).  The program this rank gets holds only its own
stages, with LOCAL chunk ids (0 .. vpp-1, set by the engine's chunk completion; all -1 when
vpp = 1), Paddle's own ``send_v2`` / ``recv_v2`` at the stage boundaries (one ring per
direction) and the gradient-merge buffers (``<param>@GRAD@MERGE``) that already accumulate the
micro-batches.  :func:`build_engine_rank_plan` turns it into a ``core.Plan`` with
:class:`EngineRankBuilder`, in the order every builder follows
(:class:`~pipesplit.passes.split.builder.PlanBuilder`); what it fills:

1. the split, before completion (:meth:`EngineRankBuilder.prepare`): every ``recv_v2``
   becomes a named block input and every ``send_v2`` a named output
   (``builtin.shadow_output``), so the transfers can move into send / recv jobs; each is checked
   against the peer the schedule's placement gives, as a process of this process's pipeline
   (``job_list.pipe``: the processes sharing its dp / mp coordinate; a mismatch is a
   ``ValueError``, not a hang); then the shared core completes, splits the backward into B / W
   (a value that is sent is needed outside its chunk, so it stays in B) and cuts
   ``forward{c}`` ... ``optimizer`` by local chunk, adding NO gradient accumulation;
2. the rank's communication: the plan's transport builds the send / recv jobs and the job
   order from this rank's programs and transfers
   (:meth:`~pipesplit.passes.transport.base.Transport.rank_comm`, the back half both rank
   builders share: :mod:`pipesplit.passes.transport.rank_comm`): on CPU gloo broadcasts on
   ring 0 (every rank joining every transfer beyond two ranks), or, with dp / mp beside the
   pipeline or an optimizer exchange between more than two ranks, every collective a world
   gather in lockstep (:mod:`pipesplit.passes.transport.lockstep`); on GPU the engine's own
   NCCL rings, with stream events;
3. the job order is this rank's list from pipesplit's lowering (rendezvous-safe), the step's
   shared-parameter exchanges around it, optimizer last.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from pipesplit.job_list import OPTIMIZER, Schedule
from pipesplit.job_list.ir import (COMPUTE_KINDS, RECV_BACKWARD, RECV_FORWARD, SEND_BACKWARD,
                                   SEND_FORWARD, job_type, other_end, parse_job_type)
from pipesplit.job_list.pipe import Pipe

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes.split.builder import RankJobs, RankPlanBuilder
from pipesplit.passes.split.core import PipelinePlan
from pipesplit.passes.transport.lockstep import ring_ranks as _ring_ranks
from pipesplit.passes.transport.base import Transport
from pipesplit.passes.transport.rank_comm import EventSites, RankPrograms
from pipesplit.passes.transport.ring_order import world_transfers

paddle = require_supported_paddle()

from pipesplit.ir_utils import without_op_callstacks  # noqa: E402
from pipesplit.ir_utils.clip import clip_the_average  # noqa: E402
from pipesplit.ir_utils.regather import regather_for_backward  # noqa: E402
from pipesplit.passes.engine.shared_parameters import (SHARED_GRADS, SHARED_WEIGHTS,  # noqa: E402
                                                       SharedOnThisRank, SharedParameter,
                                                       serve_shared_parameters, step_transfers)
from pipesplit.ir_utils.roles import ROLE_BACKWARD, ROLE_FORWARD, ROLE_OPTIMIZE  # noqa: E402
from pipesplit.passes.transport.p2p import Transfer, first_user, producer_of  # noqa: E402

P2P_OPS = ("pd_op.send_v2", "pd_op.recv_v2")
HANDOFF_PREFIX = "pipesplit_p2p_"


def is_engine_program(program) -> bool:
    """True for a program the engine partitioned per rank (it carries Paddle's p2p ops)."""
    return any(op.name() in P2P_OPS for op in program.global_block().ops)


@dataclass(frozen=True)
class EngineTransfer:
    """One of the engine's p2p ops, as this rank's send / recv job will carry it."""

    kind: str            # send_forward, recv_forward, send_backward, recv_backward
    chunk: int           # local chunk
    transfer: Transfer


def _kind_of(op) -> str:
    sending = op.name() == "pd_op.send_v2"
    if op.op_role == ROLE_FORWARD:
        return SEND_FORWARD if sending else RECV_FORWARD
    if op.op_role == ROLE_BACKWARD:
        return SEND_BACKWARD if sending else RECV_BACKWARD
    raise ValueError(f"the engine program has {op.name()} with op_role {op.op_role}; "
                     "pipesplit knows p2p between forward stages, between backward stages "
                     "and inside the optimizer")


def localize_chunks(program, vpp: int) -> None:
    """Every forward / backward op gets a local chunk id in [0, vpp): with vpp = 1 the engine
    sets none, so all are chunk 0; with vpp > 1 an id outside the range is an error."""
    for op in program.global_block().ops:
        if op.op_role not in (ROLE_FORWARD, ROLE_BACKWARD):
            continue
        c = op.chunk_id if op.has_attr("chunk_id") else -1
        if vpp == 1:
            if c != 0:
                op.set_int_attr("chunk_id", 0)
        elif c >= vpp:
            raise ValueError(f"strategy.pipeline.vpp_degree is {vpp}, but the engine program "
                             f"has {op.name()} in chunk {c}")


def p2p_to_handoffs(program, rank: int, schedule: Schedule, pipe: Pipe) -> List[EngineTransfer]:
    """Replace (in place) each ``send_v2`` by a named output and each ``recv_v2`` by a named
    block input; return the transfers in program order, checked against ``schedule``'s
    placement (``ValueError`` naming the stage, the ranks and the strategy field).  ``rank`` is
    this process's pipeline rank in ``pipe``; the transfers' ends are processes."""
    block = program.global_block()
    place = _expected_place()
    out: List[EngineTransfer] = []
    counts: Dict[Tuple[str, int], int] = {}
    for op in list(block.ops):
        if op.name() not in P2P_OPS or op.op_role == ROLE_OPTIMIZE:
            continue  # the optimizer's exchanges (clipping's norms) stay in its program
        kind, chunk = _kind_of(op), op.chunk_id
        ring = _ring_of(op)
        peer = _pipeline_rank(pipe, ring[1][int(op.attrs()["peer"])], op.name(), kind, chunk)
        stage = schedule.placement.stage(rank, chunk)
        other = _checked_neighbour(schedule, op, kind, rank, chunk, peer)
        k = counts.get((kind, chunk), 0)
        counts[(kind, chunk)] = k + 1
        name = f"{HANDOFF_PREFIX}{job_type(kind, chunk)}_{k}"
        if op.name() == "pd_op.send_v2":
            value_type = _send_as_output(block, op, name).type()
            src, dst, src_stage, dst_stage = rank, peer, stage, other
        else:
            value_type = _recv_as_input(block, op, name, place)
            src, dst, src_stage, dst_stage = peer, rank, other, stage
        _check_static_shape(op, kind, chunk, value_type)
        op.erase()
        out.append(EngineTransfer(kind, chunk, Transfer(
            name, value_type, pipe.process_of(src), pipe.process_of(dst), src_stage, dst_stage,
            ring)))
    paddle.pir.set_insertion_point_to_block_end(block)
    return out


def _expected_place():
    """Paddle's current expected place, as a block input's place attribute takes it."""
    place = paddle.base.libpaddle.Place()
    place.set_place(paddle.framework._current_expected_place())
    return place


def _checked_neighbour(schedule: Schedule, op, kind: str, rank: int, chunk: int,
                       peer: int) -> int:
    """The stage at the other end of the engine's p2p ``op`` (``kind`` of local ``chunk``):
    the placement's neighbour of this rank's stage, which must be on pipeline rank ``peer``
    (``op``'s); a ``ValueError`` naming the stage, the ranks and the schedule otherwise."""
    placement = schedule.placement
    stage = placement.stage(rank, chunk)
    other, _ = other_end(kind, stage)
    if not 0 <= other < schedule.num_stages:
        raise ValueError(
            f"strategy.pipeline.schedule_mode={schedule.name!r} makes stage {stage} (rank "
            f"{rank}, chunk {chunk}) the {'last' if other > stage else 'first'} stage, but "
            f"the engine's program has a {op.name()} ({kind}) with rank {peer}: the stage "
            "meshes contradict the schedule's placement")
    expected = placement.rank_of(other)
    if peer != expected:
        raise ValueError(
            f"strategy.pipeline.schedule_mode={schedule.name!r} puts stage {stage} (rank "
            f"{rank}, chunk {chunk}) next to stage {other} on rank {expected} "
            f"({placement.kind} placement), but the engine's program has a {op.name()} "
            f"({kind}) with rank {peer}: the stage meshes contradict the schedule's "
            "placement")
    return other


def _send_as_output(block, send, name: str):
    """The value ``send`` sends, written as the named output ``name`` of ``send``'s job (a
    ``builtin.shadow_output`` made right before it, in its role and chunk): the value."""
    value = send.operand_source(0)
    paddle.pir.set_insertion_point(send)
    if _is_source(value):
        # (another stage reads a parameter (a tied embedding), a feed or a relayed value: a
        # handoff of the value itself would rename its variable to the handoff's name)
        value = _shared(value, send)
    paddle._C_ops.set_persistable_value(value, name)
    sink = block.ops[block.ops.index(send) - 1]  # the shadow_output just made
    sink.op_role = send.op_role
    sink.set_int_attr("chunk_id", send.chunk_id)
    return value


def _recv_as_input(block, recv, name: str, place):
    """The value ``recv`` receives, replaced by the block input ``name`` (not persistable, on
    ``place``) wherever it is used: its type."""
    result = recv.result(0)
    value_type = result.type()
    kw = block.add_kwarg(name, value_type)
    kw.persistable = False
    kw.place_attr = place
    result.replace_all_uses_with(kw)
    return value_type


def _check_static_shape(op, kind: str, chunk: int, value_type) -> None:
    """A transfer's shape is fixed when the plan is built: a dynamic one is refused."""
    if any(int(s) < 0 for s in value_type.shape):
        raise ValueError(f"{op.name()} of {job_type(kind, chunk)} has a dynamic shape "
                         f"{list(value_type.shape)}; pipesplit's engine path needs static "
                         "micro-batch shapes: give dist.to_static a loader of fixed-size "
                         "batches (drop_last=True), whose first batch the engine traces, "
                         "and no -1 in the model's own shapes between stages")


#: ops whose value is a variable of the scope by its own name (a parameter, a feed)
_SCOPE_SOURCES = ("builtin.parameter", "pd_op.data")


def _is_source(value) -> bool:
    """A value that is a scope variable by its own name: a parameter, a feed, or a block
    input (a value received from the stage before and sent on to the next unchanged: a
    relayed one, :mod:`.relay`)."""
    producer = value.get_defining_op() if value.initialized() else None
    return producer is None or producer.name() in _SCOPE_SOURCES


def _shared(value, op):
    """A value sharing ``value``'s data, made right before ``op`` in ``op``'s job."""
    import paddle

    shared = paddle._C_ops.share_data_(value)
    maker = shared.get_defining_op()
    maker.op_role = op.op_role
    maker.set_int_attr("chunk_id", op.chunk_id)
    return shared


def _pipeline_rank(pipe: Pipe, process: int, op_name: str, kind: str, chunk: int) -> int:
    """The pipeline rank of the engine's p2p peer ``process``: it must be in this process's
    pipeline (the neighbouring stage at the same dp / mp coordinate)."""
    try:
        return pipe.rank_of(process)
    except ValueError:
        raise ValueError(
            f"the engine's program has a {op_name} ({job_type(kind, chunk)}) with process "
            f"{process}, which is not in this process's pipeline {list(pipe.processes)} (the "
            "processes of each stage mesh at this process's coordinate): the stage meshes must "
            "be the sub-meshes of one global mesh along its 'pp' axis, activations resharded "
            "between them with the same placements") from None


def _check_against_schedule(transfers: List[EngineTransfer], lowered: Schedule, rank: int):
    """Every comm job the schedule gives this rank carries a transfer, and every transfer has
    a comm job: otherwise the program and the schedule disagree about stage boundaries."""
    scheduled = {(j.kind, j.chunk) for j in lowered.ranks[rank] if j.is_comm}
    present = {(t.kind, t.chunk) for t in transfers}
    for kind, chunk in sorted(scheduled ^ present):
        where = "the schedule has" if (kind, chunk) in scheduled else "the engine program has"
        other = "the engine program has none" if (kind, chunk) in scheduled \
            else "the schedule has none"
        raise ValueError(
            f"strategy.pipeline.schedule_mode={lowered.name!r}: {where} "
            f"{job_type(kind, chunk)} on rank {rank} but {other}: the program's stage "
            f"boundaries do not match the schedule's {lowered.placement.kind} placement "
            f"(pp_degree={lowered.pp}, vpp_degree={lowered.vpp})")


class _EngineSites(EventSites):
    """Where a transfer's value is made and read in this rank's programs (every compute
    program, and the optimizer), for the stream events of the GPU."""

    def __init__(self, compute: Dict[str, object]):
        self.compute = compute

    def before_send(self, kind, chunk, transfer):
        producers = ((producer_of(program, transfer.name), transfer.name)
                     for program in self.compute.values())
        return [(op, event) for op, event in producers if op is not None]

    def after_recv(self, kind, chunk, transfer):
        users = ((first_user(program, transfer.name), f"{transfer.name}_{program_type}")
                 for program_type, program in self.compute.items())
        return [(op, event) for op, event in users if op is not None]


def _optimizer_exchanges(programs) -> bool:
    """Whether the optimizer exchanges values between pipeline ranks (the global norm of
    ``ClipGradByGlobalNorm``)."""
    optimizer = programs.get(OPTIMIZER)
    return optimizer is not None and any(op.name() in P2P_OPS
                                         for op in optimizer.global_block().ops)


def _rank_programs(programs, found: List[EngineTransfer], opened, config: PipelineConfig,
                   pipe: Pipe) -> RankPrograms:
    """This rank as its transport builds its comm jobs: ``programs`` (the compute programs and
    the optimizer), the engine's transfers of each comm kind and chunk, and, for the CPU world
    ring, every transfer of the step (published through the launch store)."""
    def transfers_of(kind: str, chunk: int) -> List[Transfer]:
        return [t.transfer for t in found if (t.kind, t.chunk) == (kind, chunk)]

    rank = config.pp_stage
    return RankPrograms(
        rank=rank, pipe=pipe, opened=opened, num_chunks=config.vpp_degree, programs=programs,
        transfers_of=transfers_of,
        step_transfers=lambda: world_transfers(found, opened.schedule, rank),
        event_sites=_EngineSites(dict(programs)))


def build_engine_rank_plan(main_program, config: PipelineConfig, transport: Transport,
                           pipe: Optional[Pipe] = None, requested=None,
                           shared: Sequence[SharedParameter] = (),
                           regather: bool = True) -> PipelinePlan:
    """The plan of pipeline rank ``config.pp_stage`` from the engine's per-rank program (never
    modified; :class:`EngineRankBuilder`).  ``transport``: the engine's (its device's,
    :func:`~pipesplit.passes.transport.devices.transport_for`); the plan chooses its way from
    the world, ``pp`` and the optimizer's exchanges.  ``pipe``: this
    process's pipeline (which process runs each pipeline rank; default one process per stage,
    pipeline rank = process).  ``requested``: the request the opening resolved, its schedule
    built.  ``shared``:
    the parameters read on another stage's rank (sent once per step:
    :mod:`pipesplit.passes.engine.shared_parameters`).  ``regather``: a weight sharding stage 3
    gathers for the forward is gathered again for the backward
    (:mod:`pipesplit.ir_utils.regather`), not kept from one job to the other."""
    if config.pp_stage is None:
        raise ValueError("the engine path needs pp_stage (this process's pipeline rank)")
    pipe = pipe or Pipe.single_process_per_stage(config.pp_degree)
    if pipe.pp != config.pp_degree:
        raise ValueError(f"strategy.pipeline.pp_degree is {config.pp_degree}, but this process's "
                         f"pipeline has {pipe.pp} stages (processes {list(pipe.processes)})")
    return EngineRankBuilder(main_program, config, transport, pipe, requested, shared,
                             regather).build()


class EngineRankBuilder(RankPlanBuilder):
    """Rank ``config.pp_stage`` from the engine's per-rank program: split by local chunk with
    no accumulation (the engine's gradient merge accumulates) and no fetches (the engine
    fetches); the engine's p2p ops become handoffs before the split (:meth:`prepare`); the
    transport's way is chosen from the rank's programs; the step's shared-parameter exchanges
    go around the comm order."""

    chunk_ids_are_stages = False
    adds_accumulation = False
    adds_fetches = False

    def __init__(self, main_program, config: PipelineConfig, transport: Transport, pipe: Pipe,
                 requested=None, shared: Sequence[SharedParameter] = (),
                 regather: bool = True):
        super().__init__(main_program, config, requested)
        self.device_transport = transport   # the engine's, no plan's way chosen yet
        self.pipe, self.shared, self.regather = pipe, shared, regather
        # (set by prepare, read by the later steps)
        self.found: List[EngineTransfer] = []   # the engine's p2p ops, now handoffs
        self.here = SharedOnThisRank()          # the shared parameters this rank serves

    def prepare(self, work, opened) -> None:
        """Local chunk ids, the stage-3 weights gathered again for the backward, the
        parameters another stage reads served by step jobs, the p2p ops made handoffs."""
        rank, placement = self.config.pp_stage, opened.schedule.placement
        localize_chunks(work, self.config.vpp_degree)
        if self.regather:
            regather_for_backward(work)
        self.here = serve_shared_parameters(work, rank, placement, self.pipe, self.shared,
                                            _ring_of)
        self.found.extend(p2p_to_handoffs(work, rank, opened.schedule, self.pipe))

    def communicate(self, opened, split):
        with without_op_callstacks():  # as the split: the ops added here point into pipesplit
            return super().communicate(opened, split)

    def rank_programs(self, opened, split) -> RankPrograms:
        """The split's programs, checked against the schedule's comm jobs, the optimizer's
        clipping made to act on the average (:func:`~pipesplit.ir_utils.clip.clip_the_average`)."""
        _check_against_schedule(self.found, opened.lowered, self.config.pp_stage)
        programs = dict(split.programs)
        if OPTIMIZER in programs:  # (evaluation and prediction have none)
            clip_the_average(programs[OPTIMIZER], self.config.num_micro_batches)
        return _rank_programs(programs, self.found, opened, self.config, self.pipe)

    def plan_transport(self, rank: RankPrograms) -> Transport:
        return self.device_transport.for_plan(paddle.distributed.get_world_size(),
                                              self.config.pp_degree,
                                              _optimizer_exchanges(rank.programs))

    def rank_jobs(self, split, rank: RankPrograms, comm, transport: Transport) -> RankJobs:
        """The shared weights' exchange first, the comm order, their gradients' exchange,
        the optimizer last; the split records the rank's programs."""
        programs = rank.programs
        order = _with_step_exchanges(comm.job_order, programs, self.shared, self.here,
                                     rank.opened.schedule.placement, self.pipe, rank.process,
                                     transport)
        required_vars = _compute_names(split, programs)
        split.programs = programs
        return RankJobs(order, programs, split, required_vars=required_vars, recorded=dict(
            comm_progress=comm.comm_progress(self.pipe),
            scope_variables=dict(self.here.scope_variables)))


def _compute_names(split, programs) -> Dict[str, frozenset]:
    """The named values the split recorded for its compute programs still in ``programs`` (the
    transport replaces the comm programs and adds ops to the optimizer's, never names to a
    compute program)."""
    return {t: names for t, names in split.required_vars.items()
            if programs.get(t) is split.programs.get(t)
            and parse_job_type(t)[0] in COMPUTE_KINDS}


def _ring_of(op) -> Tuple[int, Tuple[int, ...]]:
    ring_id = int(op.attrs()["ring_id"])
    return ring_id, _ring_ranks(ring_id)


def _with_step_exchanges(job_order, programs, shared, here: SharedOnThisRank, placement,
                         pipe: Pipe, process: int, transport: Transport
                         ) -> List[Tuple[str, int]]:
    """``job_order`` with the step's shared-parameter exchanges (their programs added to
    ``programs``): the weights before the first job, their gradients just before the
    optimizer, which comes last."""
    for phase in (SHARED_WEIGHTS, SHARED_GRADS):
        if phase == SHARED_GRADS and not (here.training and OPTIMIZER in programs):
            continue  # (evaluation and prediction send no gradients)
        program = transport.step_program(step_transfers(shared, placement, pipe, phase, here),
                                         process,
                                         here.zeroed.items() if phase == SHARED_WEIGHTS else ())
        if program is not None:
            programs[phase] = program
    order = ([(SHARED_WEIGHTS, 0)] if SHARED_WEIGHTS in programs else []) + list(job_order)
    if OPTIMIZER in programs:
        order += [(SHARED_GRADS, 0)] if SHARED_GRADS in programs else []
        order.append((OPTIMIZER, 0))
    return order

"""Parameters read on another stage's rank: the weight sent once per step, its gradient once.

A parameter of one stage that another stage reads through a reshard onto its mesh (the
embedding ``dist.parallelize`` ties to the output head, a layer's own
``dist.reshard(first_stage_param, last_mesh, ...)``) reaches the engine's per-rank programs
as p2p pairs in every micro-batch: the owner's forward ``send_v2`` of the parameter and the
reader's ``recv_v2``; the reader's backward ``send_v2`` of its gradient and the owner's
``recv_v2``, summed into the parameter's gradient-merge buffer.  The weight is the same in
every micro-batch and the owner needs only the sum of the gradients, so the plan moves both
out of the micro-batches (:func:`serve_shared_parameters`, before the other p2p ops become
handoffs):

* the reader reads the weight from a scope variable (:attr:`SharedParameter.weight_buffer`)
  that the step's first job (:data:`SHARED_WEIGHTS`) fills from the owner;
* the reader adds each micro-batch's gradient into a scope variable
  (:attr:`SharedParameter.grad_buffer`, zeroed by the first job) instead of sending it; the
  job before the optimizer (:data:`SHARED_GRADS`) sends the sum, and the owner's optimizer
  adds it to ``<param>@GRAD@MERGE`` first, so the update and a global norm count it once, as
  in unsplit training.

The reader tells its transfers from the activations it receives from the same rank by shape;
a parameter whose shape an activation between the same ranks also has is refused with a
``ValueError`` naming both.  :func:`step_transfers` gives every process the step's exchanges
in one order (the parameters sorted), so the collectives of all processes match.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from pipesplit.job_list.pipe import Pipe
from pipesplit.job_list.placement import Placement
from pipesplit.passes.transport.step_exchange import StepTransfer, scope_variable

import paddle

from pipesplit.ir_utils.roles import ROLE_BACKWARD, ROLE_FORWARD, ROLE_OPTIMIZE

#: the step's first job: every weight another stage reads, to its reader
SHARED_WEIGHTS = "shared_weights"
#: the job before the optimizer: the summed gradients of those weights, to their owners
SHARED_GRADS = "shared_grads"
_SEND, _RECV = "pd_op.send_v2", "pd_op.recv_v2"


@dataclass(frozen=True, order=True)
class SharedParameter:
    """Parameter ``name`` of stage ``owner``, read on stage ``reader`` (another rank)."""

    name: str
    shape: Tuple[int, ...]   # its local shape on the owner (what the forward p2p carries)
    dtype: str               # str() of its PIR dtype
    owner: int
    reader: int
    grad_shape: Tuple[int, ...] = ()  # the reader's local shape of it (the backward p2p's)

    def carried_shape(self, phase: str) -> Tuple[int, ...]:
        return self.shape if phase == SHARED_WEIGHTS else (self.grad_shape or self.shape)

    @property
    def weight_buffer(self) -> str:
        return f"pipesplit_shared_{self.name}@stage{self.reader}"

    @property
    def grad_buffer(self) -> str:
        return f"pipesplit_shared_{self.name}@GRAD@stage{self.reader}"

    @property
    def merge_buffer(self) -> str:
        return f"{self.name}@GRAD@MERGE"

    def describe(self) -> str:
        return (f"parameter {self.name!r} {list(self.shape)} of stage {self.owner}, read on "
                f"stage {self.reader}")


@dataclass
class SharedOnThisRank:
    """What :func:`serve_shared_parameters` found and changed in one rank's program."""

    rings: Dict[Tuple[str, str], object] = field(default_factory=dict)  # (param, phase) -> ring
    types: Dict[Tuple[str, str], object] = field(default_factory=dict)  # (param, phase) -> type
    scope_variables: Dict[str, object] = field(default_factory=dict)    # name -> PIR type
    zeroed: Dict[str, object] = field(default_factory=dict)             # name -> PIR type
    training: bool = False


def step_transfers(shared: Sequence[SharedParameter], placement: Placement, pipe: Pipe,
                   phase: str, here: SharedOnThisRank) -> List[StepTransfer]:
    """The step's exchanges of ``phase`` (:data:`SHARED_WEIGHTS` or :data:`SHARED_GRADS`) in
    this process's pipeline, in the order every process uses; ``here``: what this rank's
    program gave (the types and NCCL rings of its own ends)."""
    out = []
    for p in sorted(shared):
        owner = pipe.process_of(placement.rank_of(p.owner))
        reader = pipe.process_of(placement.rank_of(p.reader))
        ends = (owner, reader, p.name, p.weight_buffer) if phase == SHARED_WEIGHTS \
            else (reader, owner, p.grad_buffer, p.grad_buffer)
        out.append(StepTransfer(*ends, p.carried_shape(phase), p.dtype.replace("paddle.", ""),
                                here.types.get((p.name, phase)),
                                here.rings.get((p.name, phase))))
    return out


def serve_shared_parameters(program, rank: int, placement: Placement, pipe: Pipe,
                            shared: Sequence[SharedParameter], ring_of) -> SharedOnThisRank:
    """Take the p2p ops of ``shared`` out of ``program`` (rank ``rank``'s, chunk ids local and
    set), in place, as the module docstring says.  ``ring_of(op)``: (ring id, ring's processes)
    of an engine p2p op."""
    block = program.global_block()
    process = pipe.process_of(rank)
    found = SharedOnThisRank(training=any(op.op_role == ROLE_BACKWARD for op in block.ops))
    for p in shared:
        owner = pipe.process_of(placement.rank_of(p.owner))
        reader = pipe.process_of(placement.rank_of(p.reader))
        if process not in (owner, reader):
            continue
        for phase in (SHARED_WEIGHTS, SHARED_GRADS) if found.training else (SHARED_WEIGHTS,):
            sending = (process == owner) == (phase == SHARED_WEIGHTS)
            op = _the_p2p_op(block, p, phase, _SEND if sending else _RECV,
                             reader if process == owner else owner, ring_of)
            found.rings[(p.name, phase)] = ring_of(op)
            value_type = (op.operand_source(0) if sending else op.result(0)).type()
            found.types[(p.name, phase)] = value_type
            if process == owner:
                _serve_owner(block, op, p, value_type, found)
            else:
                _serve_reader(block, op, p, value_type, found)
    paddle.pir.set_insertion_point_to_block_end(block)
    return found


def _the_p2p_op(block, p: SharedParameter, phase: str, name: str, peer: int, ring_of):
    """The one ``name`` op of ``phase`` with ``peer`` that carries ``p`` (the owner's forward
    send reads the parameter itself; the others are told by shape)."""
    role = ROLE_FORWARD if phase == SHARED_WEIGHTS else ROLE_BACKWARD
    shape = p.carried_shape(phase)
    candidates = []
    for op in block.ops:
        if op.name() != name or op.op_role != role:
            continue
        _, ring = ring_of(op)
        if ring[int(op.attrs()["peer"])] != peer:
            continue
        value = op.operand_source(0) if name == _SEND else op.result(0)
        if role == ROLE_FORWARD and name == _SEND:
            producer = value.get_defining_op()
            if producer is not None and producer.name() == "builtin.parameter" \
                    and producer.attrs()["parameter_name"] == p.name:
                candidates.append(op)
        elif tuple(int(s) for s in value.type().shape) == shape \
                and str(value.dtype) == p.dtype:
            candidates.append(op)
    what = f"{'forward' if role == ROLE_FORWARD else 'backward'} {name} with process {peer}"
    if not candidates:
        raise ValueError(f"{p.describe()}: the engine program of this rank has no {what} "
                         f"carrying a {list(shape)} value")
    if len(candidates) > 1:
        raise ValueError(
            f"{p.describe()}: {len(candidates)} {what} ops carry a {list(shape)} "
            f"{p.dtype} value, and pipesplit tells the parameter from an activation of the "
            "same stages by its shape; give the activation another shape, or untie the weight")
    return candidates[0]


def _serve_owner(block, op, p: SharedParameter, value_type, found: SharedOnThisRank) -> None:
    if op.name() == _SEND:  # the weight: read from the parameter by the first job
        op.erase()
        return
    # the gradient: the reader's sum arrives before the optimizer, which adds it first
    merge = block.kwargs().get(p.merge_buffer)
    if merge is None:
        raise ValueError(f"{p.describe()}: the engine program has no gradient-merge buffer "
                         f"{p.merge_buffer!r} to add the reader's gradient to (pipesplit needs "
                         "strategy.pipeline.accumulate_steps > 1 for a parameter read on "
                         "another rank)")
    received = op.result(0)
    chain, summand = _path_into_the_sums(received)
    _drop_from_sums(summand)
    first_update = next(o for o in block.ops if o.op_role == ROLE_OPTIMIZE)
    # the ops between the p2p and the sum (the owner's slice of a replicated gradient, ...)
    # are linear: they act on the step's sum as well, at the optimizer's start
    for moved in chain:
        moved.move_before(first_update)
        moved.op_role = ROLE_OPTIMIZE
    buffer = scope_variable(block, p.grad_buffer, value_type)
    if not chain:
        summand = buffer
    received.replace_all_uses_with(buffer)
    op.erase()
    paddle.pir.set_insertion_point(first_update)
    total = paddle._C_ops.add_(merge, summand)
    total.get_defining_op().op_role = ROLE_OPTIMIZE
    found.scope_variables[p.grad_buffer] = value_type


def _serve_reader(block, op, p: SharedParameter, value_type, found: SharedOnThisRank) -> None:
    if op.name() == _RECV:  # the weight, from the scope variable the first job fills
        op.result(0).replace_all_uses_with(scope_variable(block, p.weight_buffer, value_type))
        found.scope_variables[p.weight_buffer] = value_type
        op.erase()
        return
    # the gradient: summed over the micro-batches here, sent once before the optimizer
    paddle.pir.set_insertion_point(op)
    summed = paddle._C_ops.add_(scope_variable(block, p.grad_buffer, value_type),
                                op.operand_source(0))
    adder = summed.get_defining_op()
    adder.op_role = ROLE_BACKWARD
    adder.set_int_attr("chunk_id", op.chunk_id)
    found.scope_variables[p.grad_buffer] = value_type
    found.zeroed[p.grad_buffer] = value_type
    op.erase()


#: ops that may stand between the owner's recv of a gradient and its sum: each maps its first
#: operand linearly (slices, reshapes, casts; the dp all-reduce of a gradient that is partial
#: over dp, or its reduce-scatter under sharding stage 2 / 3) and takes only constants beside it
_LINEAR = ("pd_op.slice", "pd_op.reshape", "pd_op.cast", "pd_op.transpose", "pd_op.split",
           "pd_op.assign", "pd_op.scale", "pd_op.all_reduce", "pd_op.c_allreduce_sum",
           "pd_op.reduce_scatter")


def _path_into_the_sums(received):
    """The ops from ``received`` to the value the sums add (with the constants only they
    read, in program order), and that value."""
    chain, value = [], received
    while True:
        users = value.all_used_ops()
        if len(users) != 1 or users[0].name() not in _LINEAR or users[0].num_results() != 1:
            return chain, value
        op = users[0]
        for operand in op.operands_source()[1:]:
            maker = operand.get_defining_op()
            if maker is None or maker.num_operands() or len(operand.all_used_ops()) != 1:
                raise ValueError(f"the engine program's {op.name()} of a received gradient "
                                 "reads a computed value; pipesplit moves only constants")
            chain.append(maker)
        chain.append(op)
        value = op.result(0)


def _drop_from_sums(received) -> None:
    """The owner's backward adds the reader's gradient (``received``) to its own
    (``add_n`` of a ``builtin.combine``): take it out of each sum."""
    for combine in list(received.all_used_ops()):
        sums = combine.result(0).all_used_ops() if combine.name() == "builtin.combine" else []
        if not sums or any(s.name() != "pd_op.add_n" for s in sums):
            raise ValueError(f"the engine program uses a received gradient in {combine.name()}"
                             "; pipesplit expects it summed into the parameter's gradient "
                             "(builtin.combine + pd_op.add_n)")
        rest = [v for v in combine.operands_source() if not v.is_same(received)]
        for add_n in sums:
            paddle.pir.set_insertion_point(add_n)
            if len(rest) == 1:
                replacement = rest[0]
            else:
                replacement = paddle._C_ops.add_n(rest)
                new_op = replacement.get_defining_op()
                for made in (new_op, new_op.operand_source(0).get_defining_op()):
                    made.op_role = add_n.op_role
                    made.set_int_attr("chunk_id", add_n.chunk_id)
            add_n.result(0).replace_all_uses_with(replacement)
            add_n.erase()
        combine.erase()

"""A parameter read on another stage's rank leaves the micro-batches
(``passes/engine/shared_parameters.py``): checked on PIR programs written as Paddle's engine
writes a tied weight's p2p ops (the launches of tests/multiprocess/test_hybrid*.py train with
them)."""
import pytest

import paddle

from pipesplit.ir_utils.roles import ROLE_BACKWARD, ROLE_FORWARD, ROLE_OPTIMIZE
from pipesplit.job_list.pipe import Pipe
from pipesplit.job_list.placement import LOOPED, Placement
from pipesplit.passes.engine.shared_parameters import (SHARED_GRADS, SHARED_WEIGHTS,
                                                       SharedParameter, serve_shared_parameters,
                                                       step_transfers)

RING = (12, (0, 1))  # the engine's ring of the two processes: peer i is process i
WEIGHT = SharedParameter("w", (6, 4), "paddle.float32", owner=0, reader=1, grad_shape=(6, 4))
PLACEMENT, PIPE = Placement(LOOPED, 2, 1), Pipe((0, 1))


def _ring_of(op):
    return RING


def _tag(value, role):
    op = value.get_defining_op()
    op.op_role = role
    op.set_int_attr("chunk_id", 0)
    return value


def _send(x, peer, role):
    paddle._C_ops.send_v2(x, RING[0], peer, True, False)
    op = paddle.static.default_main_program().global_block().ops[-1]
    op.op_role = role
    op.set_int_attr("chunk_id", 0)


def _recv(shape, peer, role):
    return _tag(paddle._C_ops.recv_v2(list(shape), paddle.float32, peer, RING[0], True, False),
                role)


def _program(build):
    program = paddle.pir.Program()
    with paddle.pir_utils.IrGuard(), paddle.static.program_guard(program):
        build(program.global_block())
    return program


def _serve(program, rank, shared=(WEIGHT,), placement=PLACEMENT, pipe=PIPE):
    with paddle.pir_utils.IrGuard(), paddle.static.program_guard(program):
        return serve_shared_parameters(program, rank, placement, pipe, list(shared), _ring_of)


def _names(program):
    return [op.name() for op in program.global_block().ops]


def _owner(block):
    """Stage 0: sends the weight, receives its gradient and sums it into the merge buffer."""
    w = paddle.static.create_parameter([6, 4], "float32", name="w")
    _send(w, 1, ROLE_FORWARD)
    own = _tag(paddle.full([6, 4], 1.0), ROLE_BACKWARD)
    received = _recv([6, 4], 1, ROLE_BACKWARD)
    total = _tag(paddle._C_ops.add_n([received, own]), ROLE_BACKWARD)
    merge = block.add_kwarg("w@GRAD@MERGE", total.type())
    merge.persistable = True
    _tag(paddle._C_ops.add_(merge, total), ROLE_BACKWARD)
    _tag(paddle._C_ops.scale(merge, 0.5, 0.0, True), ROLE_OPTIMIZE)


def _reader(block, twins=False):
    """Stage 1: receives an activation and the weight, sends the weight's gradient back."""
    x = _recv([2, 4], 0, ROLE_FORWARD)
    w = _recv([6, 4], 0, ROLE_FORWARD)
    if twins:  # an activation of the weight's shape from the same rank
        _recv([6, 4], 0, ROLE_FORWARD)
    _tag(paddle.matmul(x, w, transpose_y=True), ROLE_FORWARD)
    _send(_tag(paddle.full([6, 4], 2.0), ROLE_BACKWARD), 0, ROLE_BACKWARD)


def test_the_owner_sends_the_weight_and_adds_the_readers_sum_before_its_optimizer():
    program = _program(_owner)
    found = _serve(program, 0)
    names = _names(program)
    assert "pd_op.send_v2" not in names and "pd_op.recv_v2" not in names
    assert "pd_op.add_n" not in names  # the own gradient alone goes to the merge buffer
    first_update = next(op for op in program.global_block().ops
                        if op.op_role == ROLE_OPTIMIZE)
    assert first_update.name() == "pd_op.add_"
    assert [v.get_defining_op() is None for v in first_update.operands_source()] == [True, True]
    assert set(program.global_block().kwargs()) == {"w@GRAD@MERGE", WEIGHT.grad_buffer}
    assert found.training and set(found.scope_variables) == {WEIGHT.grad_buffer}
    weights, grads = (step_transfers([WEIGHT], PLACEMENT, PIPE, phase, found)
                      for phase in (SHARED_WEIGHTS, SHARED_GRADS))
    assert [(t.src, t.dst, t.src_name, t.dst_name) for t in weights + grads] == [
        (0, 1, "w", WEIGHT.weight_buffer), (1, 0, WEIGHT.grad_buffer, WEIGHT.grad_buffer)]


def test_the_reader_reads_the_weight_from_the_scope_and_sums_its_gradient_there():
    program = _program(_reader)
    found = _serve(program, 1)
    names = _names(program)
    assert names.count("pd_op.recv_v2") == 1  # the activation's, still per micro-batch
    assert "pd_op.send_v2" not in names
    kwargs = program.global_block().kwargs()
    assert set(kwargs) == {WEIGHT.weight_buffer, WEIGHT.grad_buffer}
    assert all(kw.persistable for kw in kwargs.values())
    matmul = next(op for op in program.global_block().ops if op.name() == "pd_op.matmul")
    assert matmul.operand_source(1).is_same(kwargs[WEIGHT.weight_buffer])
    assert set(found.zeroed) == {WEIGHT.grad_buffer}  # by the step's first job


def test_an_activation_of_the_weights_shape_between_the_same_ranks_is_refused_by_name():
    program = _program(lambda block: _reader(block, twins=True))
    before = _names(program)
    with pytest.raises(ValueError, match=r"parameter 'w' \[6, 4\] of stage 0, read on stage 1: "
                                         r"2 forward pd_op.recv_v2 with process 0"):
        _serve(program, 1)
    assert _names(program) == before


def test_a_rank_at_neither_end_changes_nothing():
    program = _program(_owner)
    before = _names(program)
    three = Pipe((0, 1, 2))
    far = SharedParameter("w", (6, 4), "paddle.float32", owner=1, reader=2, grad_shape=(6, 4))
    found = _serve(program, 0, [far], Placement(LOOPED, 3, 1), three)
    assert _names(program) == before and not found.scope_variables

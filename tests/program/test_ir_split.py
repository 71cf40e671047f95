"""Real-Paddle (CPU) tests of the PIR program surgery in pipesplit.ir_utils."""
import numpy as np
import pytest

import paddle

from pipesplit.ir_utils import (BACKWARD_W_ATTR, build_gpt, build_mlp, check_program,  # noqa: E402
                                complete_program, fthenb_order, init_scope, make_plan,
                                read_params, run_plan, run_unsplit_baseline, split_program)

STEPS = 3
ATOL = 1e-6
RTOL = 1e-6


def _build(kind, stages, m, opt):
    batch = 12 if m == 3 else 8
    lr = 0.1 if opt == "sgd" else 1e-3
    builder = build_mlp if kind == "mlp" else build_gpt
    return builder(stages, optimizer=opt, lr=lr, batch_size=batch)


def _run_split(model, split, m, order=None):
    order = order or fthenb_order(split.num_chunks, m, split.split_backward)
    plan = make_plan(order, split.programs, m)
    scope = init_scope(model, split)
    losses = [run_plan(plan, scope, model.make_batch(step)) for step in range(STEPS)]
    return losses, read_params(scope, model.param_names)


def _compare(model, losses, params, m):
    base_losses, base_params = run_unsplit_baseline(model, STEPS, m)
    np.testing.assert_allclose(np.array(losses), np.array(base_losses), rtol=RTOL, atol=ATOL)
    worst = 0.0
    for name in model.param_names:
        np.testing.assert_allclose(params[name], base_params[name], rtol=RTOL, atol=ATOL,
                                   err_msg=name)
        worst = max(worst, float(np.abs(params[name] - base_params[name]).max()))
    return worst


CASES = [pytest.param(kind, s, m, opt, id=f"{kind}-s{s}-m{m}-{opt}",
                      marks=[pytest.mark.slow] if (kind, s) == ("gpt", 4) else [])
         for kind in ("mlp", "gpt") for opt in ("sgd", "adam") for s in (1, 2, 4) for m in (1, 2, 3)]


@pytest.mark.parametrize("kind,stages,m,opt", CASES)
def test_fthenb_matches_unsplit(kind, stages, m, opt):
    model = _build(kind, stages, m, opt)
    split = split_program(model.main, stages)
    losses, params = _run_split(model, split, m)
    assert len(losses) == STEPS and all(len(row) == m for row in losses)
    _compare(model, losses, params, m)


def test_job_types_and_handoffs():
    model = build_mlp(2)
    split = split_program(model.main, 2)
    expected = {f"{k}{c}" for c in range(2) for k in (
        "forward", "backward", "send_forward", "recv_forward", "send_backward",
        "recv_backward")} | {"optimizer"}
    assert set(split.programs) == expected
    for k in ("send_forward", "recv_forward", "send_backward", "recv_backward"):
        assert split.programs[f"{k}0"].global_block().num_ops() == 0
    # the activation crossing stage 0 -> 1 and the grad crossing 1 -> 0 are handoffs
    assert any(h.producer == "forward0" and "forward1" in h.consumers
               for h in split.handoffs.values())
    assert any(h.producer == "backward1" and "backward0" in h.consumers
               for h in split.handoffs.values())
    for h in split.handoffs.values():
        assert h.name in split.required_vars[h.producer]
        for c in h.consumers:
            assert h.name in split.required_vars[c]
    assert split.fetches == [("forward1", "loss")]
    assert split.fetch_job("loss") == "forward1"


def test_input_program_unchanged():
    model = build_gpt(2, optimizer="adam")
    before_text, before_ops = str(model.main), model.main.global_block().num_ops()
    split_program(model.main, 2)
    split_program(model.main, 2, split_backward=True)
    assert model.main.global_block().num_ops() == before_ops
    assert str(model.main) == before_text


def test_sum_mode_scales_by_m():
    # SGD with sum accumulation and lr/m equals avg accumulation with lr
    m = 2
    model_avg = build_mlp(2, lr=0.1)
    model_sum = build_mlp(2, lr=0.05)
    _, p_avg = _run_split(model_avg, split_program(model_avg.main, 2, accumulate="avg"), m)
    _, p_sum = _run_split(model_sum, split_program(model_sum.main, 2, accumulate="sum"), m)
    for name in model_avg.param_names:
        np.testing.assert_allclose(p_sum[name], p_avg[name], rtol=1e-5, atol=1e-6)


def _mark_w(program):
    """Hand-mark the grad ops whose results feed only parameter updates (weight grads of the
    first layer: matmul_grad / add_grad of stage 0) as backward_w."""
    marked = 0
    for op in program.global_block().ops:
        if op.name() in ("pd_op.matmul_grad", "pd_op.add_grad"):
            last = op
    last.set_bool_attr(BACKWARD_W_ATTR, True)
    marked += 1
    return marked, last


def test_split_backward_with_marked_op():
    m = 2
    model = build_mlp(2, optimizer="adam", lr=1e-3)
    marked = model.main.clone()
    _, op = _mark_w(marked)
    name = op.name()
    split = split_program(marked, 2, split_backward=True)
    assert "backward_b0" in split.programs and "backward_w0" in split.programs
    assert "backward0" not in split.programs
    w_ops = [o.name() for o in split.programs["backward_w0"].global_block().ops]
    assert name in w_ops
    assert "pd_op.add_" in w_ops  # its gradient accumulation follows it into W
    assert split.programs["backward_w1"].global_block().num_ops() == 0
    losses, params = _run_split(model, split, m)
    _compare(model, losses, params, m)


def test_split_backward_without_marks_puts_all_in_b():
    model = build_mlp(2)
    split = split_program(model.main, 2, split_backward=True)
    for c in range(2):
        assert split.programs[f"backward_w{c}"].global_block().num_ops() == 0
        assert split.programs[f"backward_b{c}"].global_block().num_ops() > 0


def test_complete_program_fills_roles_and_chunks():
    model = build_gpt(2, optimizer="adam")
    prog = model.main.clone()
    complete_program(prog)
    check_program(prog, 2)
    for op in prog.global_block().ops:
        assert op.op_role in (0, 1, 2), op.name()
        if op.name().endswith("_grad"):
            assert op.op_role == 1 and op.chunk_id in (0, 1)
        if op.name() == "pd_op.adam_":
            assert op.op_role == 2
    # embedding grad belongs to stage 0, the LM head's cross entropy grad to stage 1
    chunk_of = {op.name(): op.chunk_id for op in prog.global_block().ops}
    assert chunk_of["pd_op.embedding_grad"] == 0
    assert chunk_of["pd_op.cross_entropy_with_softmax_grad"] == 1


def _plain_program():
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        loss = paddle.mean(paddle.static.nn.fc(x, 4))
        paddle.optimizer.SGD(0.1).minimize(loss)
    return main


def test_no_chunks_raises():
    prog = _plain_program()
    with pytest.raises(ValueError, match="chunk"):
        split_program(prog, 1)
    with pytest.raises(ValueError, match="role"):
        check_program(prog, 1)


def test_chunk_count_mismatch_raises():
    model = build_mlp(2)
    with pytest.raises(ValueError, match="num_chunks"):
        split_program(model.main, 4)
    with pytest.raises(ValueError, match="num_chunks"):
        split_program(model.main, 1)
    with pytest.raises(ValueError, match="num_chunks"):
        split_program(model.main, 0)


def test_bad_micro_batches_raise():
    model = build_mlp(2, batch_size=8)
    split = split_program(model.main, 2)
    with pytest.raises(ValueError, match="divisible"):
        plan = make_plan(fthenb_order(2, 3), split.programs, 3)
        run_plan(plan, init_scope(model, split), model.make_batch(0))
    with pytest.raises(ValueError, match="num_micro_batches"):
        make_plan(fthenb_order(2, 1), split.programs, 0)
    with pytest.raises(ValueError, match="num_micro_batches"):
        fthenb_order(2, 0)
    with pytest.raises(ValueError, match="divisible"):
        run_unsplit_baseline(model, 1, 3)


def test_make_plan_skip_gc():
    model = build_mlp(2)
    split = split_program(model.main, 2)
    m = 2
    plan = make_plan(fthenb_order(2, m), split.programs, m)
    assert plan.micro_batch_num() == m
    jobs = plan.job_list()
    assert [j.type() for j in jobs][-1] == "optimizer"
    with pytest.raises(ValueError, match="no program"):
        make_plan([("forward7", 0)], split.programs, 1)


def test_with_split_backward_pass():
    import pipesplit.ir_utils.split_backward as sb
    m = 2
    model = build_gpt(2, optimizer="adam", lr=1e-3)
    prog = model.main.clone()
    complete_program(prog)
    sb.split_backward(prog)
    split = split_program(prog, 2, split_backward=True)
    assert split.programs["backward_w0"].global_block().num_ops() > 0
    losses, params = _run_split(model, split, m)
    _compare(model, losses, params, m)


def test_split_program_per_chunk_split_and_bad_chunks():
    """split_backward as a chunk set: those chunks get backward_b / backward_w, the others one
    backward sub-program; bad chunk ids are refused, the input program unchanged."""
    from pipesplit.ir_utils.split_backward import split_backward
    model = build_mlp(3, optimizer="sgd", batch_size=8)
    before = len(model.main.global_block().ops)
    for bad in ({3}, {-1}, {True}):
        with pytest.raises(ValueError, match="split_backward must be a bool or chunk ids"):
            split_program(model.main, 3, split_backward=bad)
    assert len(model.main.global_block().ops) == before
    work = model.main.clone()
    complete_program(work)
    report = split_backward(work, chunks={1})
    assert set(c for c, n in report.w_ops.items() if n) == {1}
    split = split_program(work, 3, split_backward={1}, completed=True)
    assert {"backward0", "backward_b1", "backward_w1", "backward2"} <= set(split.programs)
    assert not {"backward1", "backward_b0", "backward_w2"} & set(split.programs)
    with pytest.raises(ValueError, match="chunks must be chunk ids"):
        split_backward(model.main.clone(), chunks={-2})

"""Tests for pipesplit.ir_utils.split_backward (real Paddle, CPU).

Programs are built here with ``pir_chunk_id_guard`` per stage; the backward of each stage is
built with ``paddle.static.gradients`` under ``pir_chunk_id_guard(stage)`` +
``pir_op_role_guard(1)`` (stage by stage, chaining the input gradient), and SGD under
``pir_op_role_guard(2)``: every grad op then carries its stage's chunk and role 1 without
depending on ``complete_program``.
"""
from collections import Counter

import numpy as np
import pytest

import paddle
from paddle.base.framework import pir_chunk_id_guard, pir_op_role_guard

from pipesplit.ir_utils.split_backward import (
    W_ATTR,
    classify_backward,
    is_backward_w,
    op_flops,
    split_backward,
)


@pytest.fixture(autouse=True)
def _static(static_mode):
    """Every test here builds static programs (a module-level enable_static() held only until
    another module's test, run before these in the same worker, went back to dynamic mode)."""


# --------------------------------------------------------------------------- builders


def _build(stages, feed_specs, feed, lr=0.1):
    """``stages``: list of ``fn(h, feeds) -> (out, [params])``; stage c runs in chunk c.
    Returns (main, startup, feed)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        paddle.seed(2024)
        with pir_op_role_guard(0):
            feeds = {n: paddle.static.data(n, s, d) for n, s, d in feed_specs}
            ins, outs, params = [], [], []
            h = None
            for c, fn in enumerate(stages):
                with pir_chunk_id_guard(c):
                    ins.append(h)
                    h, ps = fn(h, feeds)
                    outs.append(h)
                    params.append(ps)
        pgs, dnext = [], None
        for c in reversed(range(len(stages))):
            with pir_chunk_id_guard(c), pir_op_role_guard(1):
                ps = params[c]
                inputs = list(ps) + ([ins[c]] if ins[c] is not None else [])
                tg = None if dnext is None else [dnext]
                grads = paddle.static.gradients([outs[c]], inputs, target_gradients=tg)
                pgs += list(zip(ps, grads[: len(ps)]))
                dnext = grads[len(ps)] if ins[c] is not None else None
        with pir_op_role_guard(2):
            paddle.optimizer.SGD(lr).apply_gradients(pgs)
    return main, startup, feed


def _loss_of(program):
    """The loss: the value saved as "loss" if there is one, else the last forward result."""
    ops = program.global_block().ops
    for op in ops:
        if op.name() == "builtin.shadow_output" and op.attrs().get("output_name") == "loss":
            return op.operand_source(0)
    return [op for op in ops if op.op_role == 0 and op.num_results()][-1].result(0)


def _run_step(program, startup, feed, init=None):
    place = paddle.CPUPlace()
    scope = paddle.static.Scope()
    names = [p.name for p in program.global_block().all_parameters()]
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(place)
        exe.run(startup)
        if init is not None:
            for n, a in init.items():
                scope.var(n).get_tensor().set(a, place)
        before = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
        (loss,) = exe.run(program, feed=feed, fetch_list=[_loss_of(program)])
        after = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
    return np.array(loss), before, after


def _assert_exact(ref, prog, startup, feed):
    l0, init, p0 = _run_step(ref, startup, feed)
    l1, _, p1 = _run_step(prog, startup, feed, init)
    np.testing.assert_allclose(l1, l0, rtol=0, atol=1e-6)
    assert p0.keys() == p1.keys() and p0
    moved = 0.0
    for n in p0:
        np.testing.assert_allclose(p1[n], p0[n], rtol=0, atol=1e-6, err_msg=n)
        moved = max(moved, float(np.abs(p0[n] - init[n]).max()))
    assert moved > 1e-4, "the SGD step must actually change the parameters"


def _linear(h, n_in, n_out, bias=True):
    lin = paddle.nn.Linear(n_in, n_out, bias_attr=None if bias else False)
    return lin(h), list(lin.parameters())


HID, SEQ, VOCAB = 8, 4, 11


def mlp_program(nchunks=3, batch=6):
    rng = np.random.default_rng(0)

    def stage(c):
        def fn(h, feeds):
            h = feeds["x"] if c == 0 else h
            out, ps = _linear(h, HID, HID)
            out = paddle.tanh(out)
            if c == nchunks - 1:
                out = paddle.mean(out * out)
            return out, ps
        return fn

    feed = {"x": rng.standard_normal((batch, HID)).astype("float32")}
    return _build([stage(c) for c in range(nchunks)], [("x", [-1, HID], "float32")], feed)


def gpt_program(batch=3):
    """chunk 0: embedding; chunk 1: pre-LN single-head attention block with residual;
    chunk 2: LN + LM head + loss.  Activations are [-1, SEQ, HID]."""
    rng = np.random.default_rng(1)

    def embed(_, feeds):
        emb = paddle.nn.Embedding(VOCAB, HID)
        return emb(feeds["ids"]), list(emb.parameters())

    def block(h, feeds):
        ln = paddle.nn.LayerNorm(HID)
        a = ln(h)
        ps = list(ln.parameters())
        q, p = _linear(a, HID, HID); ps += p
        k, p = _linear(a, HID, HID); ps += p
        v, p = _linear(a, HID, HID); ps += p
        s = paddle.nn.functional.softmax(paddle.matmul(q, k, transpose_y=True))
        o, p = _linear(paddle.matmul(s, v), HID, HID); ps += p
        return h + o, ps

    def head(h, feeds):
        ln = paddle.nn.LayerNorm(HID)
        logits, p = _linear(ln(h), HID, VOCAB)
        return paddle.mean(logits * logits), list(ln.parameters()) + p

    feed = {"ids": rng.integers(0, VOCAB, (batch, SEQ)).astype("int64")}
    return _build([embed, block, head], [("ids", [-1, SEQ], "int64")], feed)


def _bwd(program):
    return [op for op in program.global_block().ops if op.op_role == 1]


def _names(program, chunk, w):
    return Counter(op.name() for op in _bwd(program)
                   if op.chunk_id == chunk and is_backward_w(op) == w)


def _assert_well_formed(program):
    """B never reads a W value; every value leaving a chunk's backward is produced by B."""
    for op in _bwd(program):
        for r in op.results():
            if not r.initialized():
                continue
            for user in r.all_used_ops():
                if user.op_role == 2:
                    continue
                if is_backward_w(op):
                    assert user.op_role == 1 and user.chunk_id == op.chunk_id \
                        and is_backward_w(user), (op.name(), user.name())


# --------------------------------------------------------------------------- tests


def test_mlp_split_is_exact_and_classified():
    main, startup, feed = mlp_program()
    ref = main.clone()
    rep = split_backward(main, batch_size=6)
    _assert_exact(ref, main, startup, feed)
    _assert_well_formed(main)

    assert rep.decomposed == {"pd_op.matmul_grad": 2, "pd_op.add_grad": 2}
    assert rep.num_param_grads == 6
    # last and middle chunk: dX matmul + tanh_grad on the activation path (B);
    # bias sum and dW matmul in W
    for c in (1, 2):
        assert _names(main, c, w=True) == Counter(
            {"pd_op.matmul": 1, "pd_op.sum": 1, "pd_op.full_int_array": 1})
        b = _names(main, c, w=False)
        assert b["pd_op.matmul"] == 1 and b["pd_op.tanh_grad"] == 1
        assert "pd_op.matmul_grad" not in b and "pd_op.add_grad" not in b
        w_mm = [op for op in _bwd(main) if op.chunk_id == c and op.name() == "pd_op.matmul"
                and is_backward_w(op)]
        assert list(w_mm[0].result(0).shape) == [HID, HID]
    # loss-gradient seed ops live in B of the last chunk
    assert _names(main, 2, w=False)["pd_op.mean_grad"] == 1
    # first chunk: no gradient leaves it, everything is W and nothing needed decomposing
    assert not _names(main, 0, w=False)
    assert _names(main, 0, w=True) == Counter(
        {"pd_op.tanh_grad": 1, "pd_op.add_grad": 1, "pd_op.matmul_grad": 1})
    assert rep.b_ops[0] == 0 and rep.w_ops[0] == 3
    # FLOPs: every matmul of this MLP is 2*6*8*8
    f = 2 * 6 * HID * HID
    assert rep.b_flops == {0: 0, 1: f, 2: f}
    assert rep.w_flops == {0: f, 1: f, 2: f}
    assert rep.w_flops_share == pytest.approx(3 / 5)
    assert rep.w_flops_share_of_chunk(1) == pytest.approx(0.5)
    assert "W share" in rep.summary()


def test_gpt_block_split_is_exact_and_classified():
    main, startup, feed = gpt_program()
    ref = main.clone()
    rep = split_backward(main, batch_size=3)
    _assert_exact(ref, main, startup, feed)
    _assert_well_formed(main)

    # q, k, v, o and head linears: matmul_grad + bias add_grad each; the residual add_grad
    # and the two attention matmul_grads need both outputs in B and stay fused
    assert rep.decomposed == {"pd_op.matmul_grad": 5, "pd_op.add_grad": 5}
    assert rep.num_param_grads == 15
    ops = _bwd(main)
    # embedding grad: W
    (emb,) = [op for op in ops if op.name() == "pd_op.embedding_grad"]
    assert is_backward_w(emb) and emb.chunk_id == 0
    assert rep.b_ops[0] == 0
    # layer_norm_grad produces the activation gradient: stays whole, in B
    lns = [op for op in ops if op.name() == "pd_op.layer_norm_grad"]
    assert len(lns) == 2 and not any(is_backward_w(op) for op in lns)
    # every weight-gradient matmul is W, every activation-gradient matmul is B
    mms = [op for op in ops if op.name() == "pd_op.matmul"]
    w_mm = [op for op in mms if is_backward_w(op)]
    b_mm = [op for op in mms if not is_backward_w(op)]
    assert len(w_mm) == 5 and len(b_mm) == 5
    assert sorted(list(op.result(0).shape) for op in w_mm) == \
        sorted([[HID, HID]] * 4 + [[HID, VOCAB]])
    assert all(list(op.result(0).shape)[-2:] == [SEQ, HID] for op in b_mm)
    # dW of a [-1, SEQ, HID] activation is computed on folded [-1, HID] operands
    reshapes = [op for op in ops if op.name() == "pd_op.reshape"]
    assert len(reshapes) == 10 and all(is_backward_w(op) for op in reshapes)
    assert all(list(op.result(0).shape)[0] == -1 for op in reshapes)
    # attention matmul_grads: both outputs are activation gradients -> B, fused
    att = [op for op in ops if op.name() == "pd_op.matmul_grad"]
    assert len(att) == 2 and not any(is_backward_w(op) for op in att)
    # bias grads (sum over batch and seq) are W, no add_grad with a parameter stays
    sums = [op for op in ops if op.name() == "pd_op.sum"]
    assert len(sums) == 5 and all(is_backward_w(op) for op in sums)
    assert all(list(op.result(0).shape) in ([HID], [VOCAB]) for op in sums)
    # FLOPs: linear dX (B) == linear dW (W); attention (4 products) only B
    lin = 2 * 3 * SEQ * HID * HID
    att_f = 2 * 3 * SEQ * SEQ * HID
    assert rep.w_flops[1] == 4 * lin and rep.b_flops[1] == 4 * lin + 4 * att_f
    head_f = 2 * 3 * SEQ * HID * VOCAB
    assert rep.w_flops[2] == head_f and rep.b_flops[2] == head_f
    # W ops need B values of their chunk (dout of the linears) and forward activations
    assert rep.b_to_w_values[1] > 0 and rep.fwd_to_w_values[1] > 0


def _matmul_case(x_shape, y_shape, tx, ty, x_is_param, batch):
    """chunk 0: act = tanh(data @ W0) with the activation operand's shape;
    chunk 1: out = matmul(X, Y, tx, ty) with the other operand a parameter."""
    act_shape = x_shape if not x_is_param else y_shape
    par_shape = y_shape if not x_is_param else x_shape
    rng = np.random.default_rng(3)
    data_shape = list(act_shape[:-1]) + [5]

    def s0(_, feeds):
        out, ps = _linear(feeds["d"], 5, act_shape[-1], bias=False)
        return paddle.tanh(out), ps

    def s1(h, feeds):
        p = paddle.create_parameter(par_shape, "float32")
        x, y = (p, h) if x_is_param else (h, p)
        out = paddle.matmul(x, y, transpose_x=tx, transpose_y=ty)
        return paddle.mean(out * out), [p]

    real = [batch if d == -1 else d for d in data_shape]
    feed = {"d": rng.standard_normal(real).astype("float32")}
    return _build([s0, s1], [("d", data_shape, "float32")], feed)


# a 2-D activation whose dynamic batch dim is transposed away ("2d" with tx) is not a pipeline
# pattern, so that layout is not among the cases
MATMUL_LAYOUTS = [(case, tx, ty) for case in ("2d", "dyn3d", "dyn4d", "param_x")
                  for tx in (False, True) for ty in (False, True) if not (case == "2d" and tx)]


@pytest.mark.parametrize("case, tx, ty", MATMUL_LAYOUTS)
def test_matmul_grad_split_all_layouts(case, tx, ty):
    M, K, N = 3, 4, 5
    xm = [K, M] if tx else [M, K]
    ym = [N, K] if ty else [K, N]
    if case == "2d":
        xs, ys, x_is_param = [-1, K], ym, False  # M is the dynamic batch
    elif case == "dyn3d":
        xs, ys, x_is_param = [-1] + xm, ym, False
    elif case == "dyn4d":
        xs, ys, x_is_param = [-1, 2] + xm, ym, False
    else:  # parameter on the left, activation with a dynamic batch dim on the right
        xs, ys, x_is_param = xm, [-1] + ym, True
    main, startup, feed = _matmul_case(xs, ys, tx, ty, x_is_param, batch=4)
    ref = main.clone()
    grads = [op for op in _bwd(main) if op.name() == "pd_op.matmul_grad" and op.chunk_id == 1]
    assert len(grads) == 1
    rep = split_backward(main, batch_size=4)
    assert rep.decomposed.get("pd_op.matmul_grad") == 1
    c1 = [op for op in _bwd(main) if op.chunk_id == 1]
    assert not any(op.name() == "pd_op.matmul_grad" for op in c1)
    w = [op for op in c1 if is_backward_w(op)]
    assert any(op.name() == "pd_op.matmul" for op in w)
    # the W part ends in the parameter gradient's shape
    par_shape = xs if x_is_param else ys
    assert any(op.result(0).initialized() and list(op.result(0).shape) == par_shape
               for op in w if op.name() in ("pd_op.matmul", "pd_op.sum"))
    _assert_exact(ref, main, startup, feed)
    _assert_well_formed(main)
    # FLOPs are preserved by the decomposition: dX + dW == 2 * forward
    if case == "2d":
        fwd_flops = 2 * 4 * N * K
    else:
        fwd_flops = 2 * 4 * (2 if case == "dyn4d" else 1) * M * N * K
    assert rep.b_flops[1] + rep.w_flops[1] == 2 * fwd_flops


def test_dynamic_batch_matmul_grad_is_split_without_static_batch():
    # [-1, seq, hidden] @ [hidden, out]: Paddle's own splitter computes shape[0]*shape[1]
    # = -seq here; ours folds with -1 and runs with any batch size
    main, startup, _ = _matmul_case([-1, 6, 4], [4, 5], False, False, False, batch=2)
    ref = main.clone()
    split_backward(main)
    rs = [op for op in _bwd(main) if op.name() == "pd_op.reshape"]
    assert sorted(list(op.result(0).shape) for op in rs) == [[-1, 4], [-1, 5]]
    for batch in (2, 7):
        feed = {"d": np.random.default_rng(batch).standard_normal((batch, 6, 5)).astype("f4")}
        _assert_exact(ref, main, startup, feed)


def test_mark_survives_clone_and_split_is_idempotent():
    main, _, _ = gpt_program()
    rep = split_backward(main)
    clone = main.clone()
    w0 = [op.name() for op in _bwd(main) if is_backward_w(op)]
    w1 = [op.name() for op in _bwd(clone) if is_backward_w(op)]
    assert w0 == w1 and w0
    assert all(op.attrs()[W_ATTR] is True for op in _bwd(clone) if is_backward_w(op))
    rep2 = split_backward(clone)
    assert rep2.decomposed == {}
    assert rep2.b_ops == rep.b_ops and rep2.w_ops == rep.w_ops
    assert rep2.w_flops == rep.w_flops


def test_decompose_none_and_all():
    main, startup, feed = gpt_program()
    ref = main.clone()
    none = main.clone()
    rep = split_backward(none, decompose="none")
    assert rep.decomposed == {}
    # without decomposition the linears' fused grads carry dX: they are B
    mg = [op for op in _bwd(none) if op.name() == "pd_op.matmul_grad" and op.chunk_id == 1]
    assert len(mg) == 6 and not any(is_backward_w(op) for op in mg)
    assert rep.w_flops[1] == 0
    _assert_exact(ref, none, startup, feed)

    rep_all = split_backward(main, decompose="all")
    # "all" also splits the two attention matmul_grads and the residual add_grad
    assert rep_all.decomposed == {"pd_op.matmul_grad": 7, "pd_op.add_grad": 6}
    assert not any(op.name() in ("pd_op.matmul_grad", "pd_op.add_grad") for op in _bwd(main)
                   if op.chunk_id > 0)
    _assert_exact(ref, main, startup, feed)
    _assert_well_formed(main)
    with pytest.raises(ValueError, match="decompose"):
        split_backward(ref.clone(), decompose="some")
    with pytest.raises(ValueError, match="batch_size"):
        split_backward(ref.clone(), batch_size=0)


def test_classify_is_pure():
    main, _, _ = mlp_program()
    n = len(main.global_block().ops)
    is_b, needed = classify_backward(main)
    assert len(main.global_block().ops) == n
    assert not any(is_backward_w(op) for op in main.global_block().ops)
    assert sum(is_b.values()) > 0 and needed


def test_op_flops_resolves_reshape_of_dynamic_dim():
    main, _, _ = _matmul_case([-1, 6, 4], [4, 5], False, False, False, batch=2)
    split_backward(main)
    (w,) = [op for op in _bwd(main) if op.name() == "pd_op.matmul" and is_backward_w(op)]
    # [-1, 4]^T @ [-1, 5] where -1 = batch * 6
    assert op_flops(w, batch_size=10) == 2 * 4 * 5 * 60


def test_errors_without_backward_or_param_grads():
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        with pir_chunk_id_guard(0), pir_op_role_guard(0):
            x = paddle.static.data("x", [-1, 4], "float32")
            x.stop_gradient = False
            y, _ = _linear(x, 4, 4)
            loss = paddle.mean(y)
    fwd_only = main.clone()
    with pytest.raises(ValueError, match="no backward ops"):
        split_backward(fwd_only)
    with paddle.static.program_guard(main, startup):
        with pir_chunk_id_guard(0), pir_op_role_guard(1):
            paddle.static.gradients([loss], [x])  # input gradient only
    with pytest.raises(ValueError, match="no parameter gradients"):
        split_backward(main)


def test_untagged_minimize_program_hints_at_completion():
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        with pir_chunk_id_guard(0):
            y, _ = _linear(x, 4, 4)
            loss = paddle.mean(y)
        paddle.optimizer.SGD(0.1).minimize(loss)
    with pytest.raises(ValueError, match="complete_program"):
        split_backward(main)


def test_with_complete_program_and_models():
    """Integration with the model builders and complete_program."""
    from pipesplit.ir_utils.complete import complete_program
    from pipesplit.ir_utils.models import build_gpt

    m = build_gpt(num_stages=3, hidden=16, seq_len=8)
    ref = m.main.clone()
    complete_program(ref)
    prog = m.main.clone()
    complete_program(prog)
    rep = split_backward(prog, batch_size=m.batch_size)
    assert rep.decomposed["pd_op.matmul_grad"] > 0 and rep.decomposed["pd_op.add_grad"] > 0
    _assert_well_formed(prog)
    names = [n for n in m.feed_names]
    feed = {n: v for n, v in m.make_batch(0).items() if n in names}
    _assert_exact(ref, prog, m.startup, feed)

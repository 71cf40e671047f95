"""Clipping, weight decay, LR schedulers and tied weights give the unsplit full-batch result
(one process, ``pp_stage=None``), on programs written with ``paddle.nn`` layers
(``tests/helpers/_user_programs.py``).

The clipping bug these tests guard against: role completion used to make every op downstream of
a gradient a backward op, so ``ClipGradByGlobalNorm``'s squared norms / scale / multiplies (and
``ClipGradByNorm``'s, and a hand-written ``paddle.clip``) landed in a backward chunk and ran on
each micro-batch's gradient; the accumulation then averaged clipped micro-batch gradients
instead of clipping the averaged one (parameters off by 3e-4 .. 3.5e-3 after 3 steps here).
"""
from __future__ import annotations

import numpy as np
import pytest

import _user_programs as U

TOL = 1e-6

# every schedule family, on 4 virtual stages where the schedule allows (2 for vpp=1 at pp=2)
LAYOUTS = {"FThenB": (4, 1), "1F1B": (2, 1), "Eager1F1B": (2, 1), "VPP": (2, 2),
           "LoopedBFS": (2, 2), "ZBH1": (4, 1), "ZBH2": (2, 1), "InterleavedZB": (2, 2),
           "ZBV": (2, 2), "ZBVPP": (2, 2), "DualPipeV": (2, 2), "auto": (2, 1), "autoV": (2, 2)}
M = 4
GRID = U.pairwise_rows(dict(schedule=list(LAYOUTS), optimizer=U.OPTIMIZERS, clip=U.CLIPS,
                            lr_schedule=U.LR_SCHEDULES, tied=(False, True),
                            split_backward=(False, True)))
FAST_ROWS = 6  # the rest of the covering design is marked slow


def _case(row) -> U.Case:
    return U.Case(optimizer=row["optimizer"], clip=row["clip"], lr_schedule=row["lr_schedule"],
                  tied=row["tied"])


def _check_row(row):
    case = _case(row)
    pp, vpp = LAYOUTS[row["schedule"]]
    ref = U.train_unsplit(case, pp * vpp, M)
    losses, params, _ = U.train_split(case, row["schedule"], pp, vpp, M, row["split_backward"])
    loss_diff, param_diff = U.max_diffs(losses, params, *ref)
    where = f"{row['schedule']} pp={pp} vpp={vpp} split={row['split_backward']} {case.describe()}"
    assert loss_diff <= TOL, f"{where}: losses differ by {loss_diff:.3g}"
    assert param_diff <= TOL, f"{where}: parameters differ by {param_diff:.3g}"


def test_grid_covers_every_pair():
    factors = dict(schedule=list(LAYOUTS), optimizer=U.OPTIMIZERS, clip=U.CLIPS,
                   lr_schedule=U.LR_SCHEDULES, tied=(False, True), split_backward=(False, True))
    names = list(factors)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            seen = {(row[a], row[b]) for row in GRID}
            assert seen == {(x, y) for x in factors[a] for y in factors[b]}, (a, b)
    assert len(GRID) == len(LAYOUTS) * len(U.OPTIMIZERS)  # the least a pair cover can have


@pytest.mark.parametrize("row", GRID[:FAST_ROWS], ids=lambda r: "-".join(map(str, r.values())))
def test_grid_fast(row):
    _check_row(row)


@pytest.mark.slow
@pytest.mark.parametrize("row", GRID[FAST_ROWS:], ids=lambda r: "-".join(map(str, r.values())))
def test_grid(row):
    _check_row(row)


# --------------------------------------------------------------------------- clipping


@pytest.mark.parametrize("clip", ["global_norm", "by_norm", "by_value"])
def test_thresholds_really_clip(clip):
    """The grid's thresholds change training: without them the parameters differ."""
    clipped = U.train_unsplit(U.Case(clip=clip), 2, M, steps=1)[1]
    free = U.train_unsplit(U.Case(), 2, M, steps=1)[1]
    assert max(float(np.max(np.abs(clipped[n] - free[n]))) for n in free) > 1e-3


@pytest.mark.parametrize("pp", [2, 4])
def test_residual_mlp_momentum_global_norm_clip(pp):
    """The issue's program: residual paddle.nn.Linear MLP, Momentum, ClipGradByGlobalNorm(0.05),
    1F1B (was 4.5e-3 off at pp=2)."""
    case = U.Case(model="mlp", optimizer="momentum", clip="global_norm")
    ref = U.train_unsplit(case, pp, M)
    losses, params, _ = U.train_split(case, "1F1B", pp, 1, M)
    loss_diff, param_diff = U.max_diffs(losses, params, *ref)
    assert loss_diff <= TOL and param_diff <= TOL, (loss_diff, param_diff)


def test_clip_ops_run_in_the_optimizer_on_accumulated_gradients():
    from pipesplit.ir_utils import complete_program
    from pipesplit.ir_utils.accumulate import ACC_SUFFIX

    prog = U.build(U.Case(model="mlp", optimizer="momentum", clip="global_norm"), 2)
    work = prog.main.clone()
    complete_program(work)
    roles = {}
    for op in work.global_block().ops:
        roles.setdefault(op.name(), set()).add(op.op_role)
    for name in ("pd_op.squared_l2_norm", "pd_op.sqrt", "pd_op.maximum", "pd_op.momentum_"):
        assert roles[name] == {2}, name
    assert 1 in roles["pd_op.matmul_grad"] and 2 not in roles["pd_op.matmul_grad"]
    _, _, pipeline = U.train_split(U.Case(model="mlp", optimizer="momentum",
                                          clip="global_norm"), "1F1B", 2, 1, M, steps=1)
    # one accumulator per parameter, named after it, written in the backward jobs
    acc = pipeline.split.accumulation.buffers
    assert {n for n in acc if n.endswith(ACC_SUFFIX)} == {p + ACC_SUFFIX for p in prog.param_names}
    opt_ops = [op.name() for op in pipeline.split.programs["optimizer"].global_block().ops]
    assert opt_ops.count("pd_op.squared_l2_norm") == len(prog.param_names)
    for t, p in pipeline.split.programs.items():
        if t.startswith("backward"):
            assert "pd_op.squared_l2_norm" not in [op.name() for op in p.global_block().ops], t


def test_the_old_clipping_bug_is_caught(monkeypatch):
    """Mutation check: with the old role rule (everything below a gradient is backward) the
    same comparison fails by far more than its tolerance, for Momentum and for AdamW."""
    import pipesplit.ir_utils.complete as complete

    monkeypatch.setattr(complete, "_feeds_grad_op", lambda ops, idx: [True] * len(ops))
    for optimizer in ("momentum", "adamw"):
        case = U.Case(optimizer=optimizer, clip="global_norm")
        ref = U.train_unsplit(case, 2, M)
        losses, params, _ = U.train_split(case, "1F1B", 2, 1, M)
        assert U.max_diffs(losses, params, *ref)[1] > 100 * TOL, optimizer


def test_adam_difference_is_bounded():
    """Adam divides each gradient entry by its running RMS: an entry whose exact gradient is 0
    turns fp32 rounding noise (1e-9) into a step of up to lr.  The key projection's bias in
    attention is such an entry (softmax is shift invariant), so with Paddle's default
    attention biases Adam differs on those biases only, by at most lr per step; every other
    parameter still matches within 1e-6, which the clipping bug (>= 3e-4) would not."""
    case = U.Case(optimizer="adam", clip="global_norm", attention_bias=True)
    ref_losses, ref_params = U.train_unsplit(case, 4, M)
    losses, params, _ = U.train_split(case, "ZBH1", 4, 1, M)
    layers = 4
    key_biases = {f"linear_{6 * i + 1}.b_0" for i in range(layers)}  # q, k, v, out, ffn1, ffn2
    assert key_biases <= set(params)
    for name, value in params.items():
        diff = float(np.max(np.abs(value - ref_params[name])))
        bound = U.LEARNING_RATE["adam"] * U.STEPS if name in key_biases else TOL
        assert diff <= bound, f"{name}: {diff:.3g} > {bound:.3g}"
    assert float(np.max(np.abs(losses - ref_losses))) <= TOL


# --------------------------------------------------------------------------- LR schedulers


def test_lr_scheduler_is_applied_each_step():
    from pipesplit.ir_utils import apply_lr_scheduler

    case = U.Case(lr_schedule="step")
    ref_losses, ref_params = U.train_unsplit(case, 2, M)
    losses, params, _ = U.train_split(case, "ZBH1", 2, 1, M)
    assert U.max_diffs(losses, params, ref_losses, ref_params) <= (TOL, TOL)
    # the helper writes the scheduler's current value, as Executor.run does
    prog = U.build(case, 2)
    scope = U.new_scope(prog)
    for _ in range(U.STEPS):
        prog.scheduler.step()
    assert apply_lr_scheduler(prog.main, scope) == pytest.approx(0.1 * 0.5 ** U.STEPS)
    assert float(np.array(scope.find_var(prog.main.lr_name).get_tensor())) == \
        pytest.approx(0.1 * 0.5 ** U.STEPS)
    assert apply_lr_scheduler(U.build(U.Case(), 2).main, scope) is None


# the program: an LR scheduler the runner used to ignore unless given the program
LR_CASE = U.Case(model="mlp", optimizer="momentum", clip="global_norm", lr_schedule="step")


def _plan_alone(prog, way):
    """(core.Plan, scope ready for it), the plan being all that is kept of the split: from
    Paddle's pass registry (the ``plan`` attribute) or made of split_program's sub-programs."""
    import gc

    from paddle.distributed.passes import PassContext, new_pass

    import pipesplit.passes  # noqa: F401  (registers pipesplit_scheduler_<NAME>)
    from pipesplit.ir_utils import fthenb_order, make_plan, split_program

    if way == "pass":
        context = new_pass("pipesplit_scheduler_ZBH1", dict(num_micro_batches=M, pp_degree=2)
                           ).apply([prog.main], [prog.startup], PassContext())
        plan, split = context.get_attr("plan"), context.get_attr("pipesplit_plan").split
        del context
    else:
        split = split_program(prog.main, 2, num_micro_batches=M)
        plan = make_plan(fthenb_order(2, M), split.programs, M)
    scope = U.new_scope(prog)
    split.init_scope(scope)
    del split
    gc.collect()  # the sub-programs' Python objects go: the plan alone must know its scheduler
    return plan, scope


def _train(runner, prog, case):
    losses = []
    for step in range(U.STEPS):
        losses.append([float(x) for x in runner.step(U.batch(case, step, M * U.MICRO_BATCH_SIZE))])
        prog.scheduler.step()
    return np.array(losses), U.read(runner.scope, prog.param_names)


@pytest.mark.parametrize("way", ["pass", "split_program"])
def test_plan_runner_applies_the_lr_scheduler_unasked(way):
    """``PlanRunner(plan, scope)`` with no program: the scheduler the plan was split under is
    applied every step (it used to stay at its initial rate, 0.11 .. 0.33 off)."""
    import paddle
    from pipesplit.ir_utils import PlanRunner, lr_program_of

    prog = U.build(LR_CASE, 2)
    plan, scope = _plan_alone(prog, way)
    assert isinstance(plan, paddle.base.core.Plan)
    assert lr_program_of(plan).lr_scheduler is prog.scheduler
    losses, params = _train(PlanRunner(plan, scope), prog, LR_CASE)
    ref_losses, ref_params = U.train_unsplit(LR_CASE, 2, M)
    assert U.max_diffs(losses, params, ref_losses, ref_params) <= (TOL, TOL)
    # and the scheduler matters: a constant rate ends far from it
    constant = U.train_unsplit(U.Case(model="mlp", optimizer="momentum", clip="global_norm"),
                               2, M)[1]
    assert max(float(np.max(np.abs(constant[n] - ref_params[n]))) for n in params) > 1e-3


def test_plan_with_an_unknown_lr_scheduler_is_refused():
    """A plan reading a scheduler's learning rate whose scheduler nobody names (sub-programs
    made elsewhere) is refused rather than trained at the initial rate; a constant rate (a
    data op, not a parameter) never is."""
    from dataclasses import replace

    from pipesplit.ir_utils import (PlanRunner, fthenb_order, lr_program_of, make_plan,
                                    run_plan, split_program)
    from pipesplit.ir_utils.checks import plan_inputs

    prog = U.build(LR_CASE, 2)
    split = split_program(prog.main, 2, num_micro_batches=M)
    for program in split.programs.values():  # as sub-programs made elsewhere come
        if hasattr(program, "lr_scheduler"):
            del program.lr_scheduler, program.lr_name
    plan = make_plan(fthenb_order(2, M), split.programs, M)
    assert lr_program_of(plan) is None
    assert plan_inputs(plan).scheduled_lr == (prog.main.lr_name,)
    scope = U.new_scope(prog)
    split.init_scope(scope)
    feed = U.batch(LR_CASE, 0, M * U.MICRO_BATCH_SIZE)
    unknown = r"learning rate \['learning_rate_0'\] of an LR scheduler, but no scheduler is " \
              r"known.*program=main"
    with pytest.raises(ValueError, match=unknown):
        PlanRunner(plan, scope)
    with pytest.raises(ValueError, match=unknown):
        run_plan(plan, scope, feed)
    other = U.build(LR_CASE, 2).main
    other.lr_name = "learning_rate_7"
    with pytest.raises(ValueError, match="drives learning-rate variable 'learning_rate_7'"):
        PlanRunner(plan, scope, program=other)
    # named by the program, it trains as the unsplit program does
    losses, params = _train(PlanRunner(plan, scope, program=prog.main), prog, LR_CASE)
    assert U.max_diffs(losses, params, *U.train_unsplit(LR_CASE, 2, M)) <= (TOL, TOL)
    # a constant learning rate: nothing to apply, nothing refused
    case = replace(LR_CASE, lr_schedule="constant")
    const = U.build(case, 2)
    const_split = split_program(const.main, 2, num_micro_batches=M)
    const_plan = make_plan(fthenb_order(2, M), const_split.programs, M)
    assert lr_program_of(const_plan) is None and plan_inputs(const_plan).scheduled_lr == ()
    const_scope = U.new_scope(const)
    const_split.init_scope(const_scope)
    assert len(PlanRunner(const_plan, const_scope).step(U.batch(case, 0, len(feed["x"])))) == M


def test_builders_take_the_training_options():
    from pipesplit.ir_utils import build_gpt, build_mlp, run_unsplit_baseline

    model = build_gpt(2, optimizer="adamw", lr_schedule="cosine", clip_global_norm=0.5,
                      tied_embeddings=True)
    names = [op.name() for op in model.main.global_block().ops]
    assert "pd_op.adamw_" in names and "pd_op.squared_l2_norm" in names
    assert model.lr_scheduler is model.main.lr_scheduler is not None
    # the tied LM head adds no weight of its own
    assert len(model.param_names) == len(build_gpt(2).param_names) - 2
    before = model.lr_scheduler.last_epoch
    run_unsplit_baseline(model, 2, 2)
    assert model.lr_scheduler.last_epoch == before  # the baseline leaves the scheduler as found
    for bad in (dict(optimizer="lamb"), dict(lr_schedule="linear"), dict(clip_global_norm=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            build_mlp(2, **bad)


def test_demo_training_flags_are_checked():
    from pipesplit.tools import demo

    parse = demo.make_parser().parse_args
    args = parse(["--clip-global-norm", "0.5", "--tied-embeddings", "--lr-schedule", "step",
                  "--optimizer", "adamw"])
    demo._check(args)
    model = demo.build_model(args)
    assert model.lr_scheduler is not None
    with pytest.raises(ValueError, match="--clip-global-norm must be > 0"):
        demo._check(parse(["--clip-global-norm", "0"]))
    with pytest.raises(ValueError, match="--tied-embeddings needs --model gpt"):
        demo._check(parse(["--tied-embeddings", "--model", "mlp"]))


def test_program_without_a_loss_sink_keeps_its_forward_jobs():
    """What ``minimize`` leaves (the loss fetched by nobody in the program): the backward's
    seed full_like(loss) reads only the loss's shape, so the forward stays forward."""
    from pipesplit.ir_utils import PlanRunner
    from pipesplit.passes import apply_pipeline

    case = U.Case(model="mlp", optimizer="momentum", clip="global_norm")
    prog = U.build(case, 2, name_loss=False)
    pipeline = apply_pipeline(prog.main, prog.startup, "1F1B",
                              dict(num_micro_batches=M, pp_degree=2))
    for c in range(2):
        ops = [op.name() for op in pipeline.split.programs[f"forward{c}"].global_block().ops]
        assert "pd_op.matmul" in ops and "pd_op.tanh" in ops, (c, ops)
    scope = U.new_scope(prog)
    pipeline.init_scope(scope)
    runner = PlanRunner(pipeline.plan, scope, program=prog.main)
    for step in range(U.STEPS):
        runner.step(U.batch(case, step, M * U.MICRO_BATCH_SIZE))
    _, ref_params = U.train_unsplit(case, 2, M)
    params = U.read(scope, prog.param_names)
    assert max(float(np.max(np.abs(params[n] - ref_params[n]))) for n in params) <= TOL


def _input_reads(programs):
    """name -> [(job type, op name, reads only its shape)] for every use of a program input."""
    from pipesplit.ir_utils.runner import _inputs

    reads = {}
    for t, prog in programs.items():
        for name, value in _inputs(prog):
            for op in value.all_used_ops():
                reads.setdefault(name, []).append((t, op.name(), op.is_no_need_buffer(value)))
    return reads


@pytest.mark.parametrize("model,split_backward", [("lm", True), ("mlp", False)])
def test_producers_free_only_handoffs_read_for_their_shape(model, split_backward):
    """A job frees a value it hands over only when every later read is of its shape (as
    ``add_grad`` reads its ``x``).  On a TransformerEncoderLayer split into B and W, B reads such
    a handoff for its shape and W for its data: Paddle's ``get_no_need_buffer_values`` lets the
    last use decide and called it "no need buffer", so the forward freed it and W found no
    memory.  The MLP's shape-only handoffs (the matmul outputs ``add_grad`` only measures)
    must still be freed, or every forward keeps them alive until its backward."""
    from paddle.base import core

    from pipesplit.ir_utils import required_vars_of
    from pipesplit.ir_utils.runner import shape_only_handoffs, written_names
    from pipesplit.passes import apply_pipeline

    prog = U.build(U.Case(model=model), 4)
    programs = apply_pipeline(prog.main, prog.startup, "FThenB",
                              dict(num_micro_batches=M, pp_degree=4, vpp_degree=1,
                                   split_backward=split_backward)).split.programs
    reads = _input_reads(programs)
    freed = shape_only_handoffs(programs)
    required = required_vars_of(programs)
    for t, names in freed.items():
        assert names <= written_names(programs[t])
        assert not names & required[t], t
        for name in names:
            assert reads[name] and all(shape for _, _, shape in reads[name]), (t, name, reads[name])
    freed_anywhere = set().union(*freed.values())
    # read for their shape by one op and for their data by another (B and W)
    mixed = {n for n, r in reads.items()
             if any(shape for _, _, shape in r) and not all(shape for _, _, shape in r)}
    assert mixed and not freed_anywhere & mixed
    # what is freed, Paddle's own rule frees too; and the shape-only handoffs are freed
    paddle_no_need = set().union(*map(set, core.get_no_need_buffer_values(programs).values()))
    assert freed_anywhere and freed_anywhere <= paddle_no_need

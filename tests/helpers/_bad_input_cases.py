"""Bad-input cases that reach Paddle, run in a child process by ``test_bad_input.py``.

Run as ``python _bad_input_cases.py NAME ...``: for each case it prints ``START NAME`` and then
one JSON line with the exception raised (type, first line of the message) and whether the input
programs kept their text.  A case that kills the process (a signal from Paddle's C++) leaves a
``START`` without its result, which the test reports as that case's failure.

Each case is a function returning ``(action, programs)``: ``action()`` is what a user would
call; ``programs`` are the inputs that must come out unchanged.  Expectations live in
:data:`EXPECTED`: the exception type name (None: must succeed) and strings its first line holds.
"""
from __future__ import annotations

import functools
import json
import sys

import numpy as np

M = 2           # micro-batches of every runner case
BATCH = 8       # rows of the full batch
HIDDEN = 16     # build_mlp's default width


@functools.lru_cache(maxsize=None)
def _mlp():
    """A 2-stage MLP and its 1F1B pipeline (built once per child process)."""
    import pipesplit.passes as passes
    from pipesplit.ir_utils import build_mlp

    model = build_mlp(num_stages=2, batch_size=BATCH)
    pipeline = passes.apply_pipeline(model.main, model.startup, "1F1B",
                                     {"num_micro_batches": M, "pp_degree": 2})
    return model, pipeline


def _runner():
    from pipesplit.ir_utils import PlanRunner, init_scope

    model, pipeline = _mlp()
    return PlanRunner(pipeline.plan, init_scope(model, pipeline.split)), model


def _batch(step=0):
    return _mlp()[0].make_batch(step)


def _two_stage_nn(twice=False, backflow=False, optimizer="sgd"):
    """A 2-stage model of paddle.nn layers, built as users build one (no fetched loss)."""
    import paddle
    from paddle.base.framework import pir_chunk_id_guard

    paddle.enable_static()
    paddle.seed(0)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 8], "float32")
        with pir_chunk_id_guard(0):
            h0 = paddle.tanh(paddle.nn.Linear(8, 8)(x))
        with pir_chunk_id_guard(1):
            h1 = paddle.tanh(paddle.nn.Linear(8, 8)(h0))
        if backflow:
            with pir_chunk_id_guard(0):
                h1 = h0 + h1  # stage 0 reads stage 1's output
        with pir_chunk_id_guard(1):
            loss = paddle.mean(h1 * h1)
        if optimizer == "adamw":
            opt = paddle.optimizer.AdamW(1e-3, weight_decay=0.01,
                                         grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
        else:
            opt = paddle.optimizer.SGD(0.1)
        opt.minimize(loss)
        if twice:
            paddle.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss


def _apply(main, startup, schedule="1F1B", **attrs):
    import pipesplit.passes as passes

    attrs.setdefault("num_micro_batches", M)
    attrs.setdefault("pp_degree", 2)
    return lambda: passes.apply_pass(main, startup, schedule, attrs)


# --------------------------------------------------------------------------- runner (crashes)

def runner_scope_none():
    from pipesplit.ir_utils import PlanRunner

    plan = _mlp()[1].plan
    return (lambda: PlanRunner(plan, None).step(_batch())), []


def run_plan_scope_none():
    from pipesplit.ir_utils import run_plan

    plan = _mlp()[1].plan
    return (lambda: run_plan(plan, None, _batch())), []


def runner_plan_none():
    from pipesplit.ir_utils import PlanRunner, init_scope

    model, pipeline = _mlp()
    return (lambda: PlanRunner(None, init_scope(model, pipeline.split))), []


def runner_place_string():
    from pipesplit.ir_utils import PlanRunner, init_scope

    model, pipeline = _mlp()
    return (lambda: PlanRunner(pipeline.plan, init_scope(model, pipeline.split), "cpu")), []


def erased_parameter_after_a_step():
    runner, model = _runner()
    runner.step(_batch(0))
    runner.scope.erase([model.param_names[0]])

    def again():
        try:
            runner.step(_batch(1))
        except ValueError:
            pass
        runner.step(_batch(1))  # the kept executor must not be tried a second time either
    return again, []


def erased_accumulator_after_a_step():
    runner, model = _runner()
    runner.step(_batch(0))
    acc = next(n for n in _mlp()[1].split.accumulation.buffers if n.endswith("@PS_ACC"))
    runner.scope.erase([acc])
    return (lambda: runner.step(_batch(1))), []


def init_scope_not_called():
    from pipesplit.ir_utils import PlanRunner, init_scope

    model, pipeline = _mlp()
    return (lambda: PlanRunner(pipeline.plan, init_scope(model)).step(_batch())), []


def erased_fetch_and_feed_variables_rebuild_the_executor():
    """The executor also holds the scope's fetch and feed variables: erasing one after a step
    must rebuild it, not crash, and the step must match an untouched runner."""
    runner, _ = _runner()
    reference, _ = _runner()

    def steps():
        for step, name in enumerate(["loss@fetch", "x", "y"]):
            runner.step(_batch(step))
            reference.step(_batch(step))
            runner.scope.erase([name])
        got, want = runner.step(_batch(3)), reference.step(_batch(3))
        if not np.array_equal(got, want):
            raise AssertionError(f"losses {got} != {want}")
    return steps, []


def init_scope_of_none():
    return (lambda: _mlp()[1].init_scope(None)), []


def recreated_variable_rebuilds_the_executor():
    """Erase a parameter after a step and set it again: the next step runs (no dangling
    pointer) and gives the losses of an untouched runner."""
    runner, model = _runner()
    reference, _ = _runner()
    runner.step(_batch(0))
    reference.step(_batch(0))
    name = model.param_names[0]
    value = np.array(runner.scope.find_var(name).get_tensor())
    runner.scope.erase([name])

    def step():
        import paddle

        runner.scope.var(name).get_tensor().set(value, paddle.CPUPlace())
        got, want = runner.step(_batch(1)), reference.step(_batch(1))
        if not np.array_equal(got, want):
            raise AssertionError(f"losses {got} != {want}")
    return step, []


# --------------------------------------------------------------------------- runner (feeds)

def _feed_case(make_feed, warm_up=False):
    runner, _ = _runner()
    if warm_up:
        runner.step(_batch(0))
    return (lambda: runner.step(make_feed(_batch(1)))), []


def feed_missing_on_second_step():
    return _feed_case(lambda b: {"x": b["x"]}, warm_up=True)


def feed_missing_on_first_step():
    return _feed_case(lambda b: {"x": b["x"]})


def feed_batch_sizes_differ():
    return _feed_case(lambda b: {"x": b["x"], "y": b["y"][:4]})


def feed_wrong_dtype():
    return _feed_case(lambda b: {"x": b["x"].astype(np.float64), "y": b["y"]})


def feed_wrong_trailing_shape():
    return _feed_case(lambda b: {"x": b["x"][:, :5], "y": b["y"]})


def feed_zero_rows():
    return _feed_case(lambda b: {"x": b["x"][:0], "y": b["y"][:0]})


def feed_not_divisible():
    return _feed_case(lambda b: {"x": b["x"][:7], "y": b["y"][:7]})


def feed_scalar():
    return _feed_case(lambda b: {"x": np.float32(1.0), "y": b["y"]})


def feed_unknown_name():
    return _feed_case(lambda b: dict(b, z=b["x"]))


def feed_is_a_list():
    return _feed_case(lambda b: [b["x"], b["y"]])


# --------------------------------------------------------------------------- the pass

def main_none():
    _, startup, _ = _two_stage_nn()
    return _apply(None, startup), [startup]


def startup_not_a_program():
    main, _, _ = _two_stage_nn()
    return _apply(main, 5), [main]


def attrs_a_list():
    import pipesplit.passes as passes

    main, startup, _ = _two_stage_nn()
    return (lambda: passes.apply_pass(main, startup, "1F1B", [("num_micro_batches", 2)])), \
        [main, startup]


def new_pass_main_none():
    from paddle.distributed.passes import new_pass

    _, startup, _ = _two_stage_nn()
    p = new_pass("pipeline_scheduler_ZBV", {"num_micro_batches": 2, "pp_degree": 1,
                                            "vpp_degree": 2})
    return (lambda: p.apply([None], [startup])), [startup]


def pp_vpp_do_not_match_chunk_ids():
    main, startup, _ = _two_stage_nn()
    return _apply(main, startup, vpp_degree=2), [main, startup]


def two_minimize_calls():
    main, startup, _ = _two_stage_nn(twice=True)
    return _apply(main, startup), [main, startup]


def two_minimize_calls_per_rank():
    main, startup, _ = _two_stage_nn(twice=True)
    return _apply(main, startup, pp_stage=0), [main, startup]


def data_flows_back_a_stage():
    main, startup, _ = _two_stage_nn(backflow=True)
    return _apply(main, startup), [main, startup]


def gradient_flows_to_a_later_stage():
    """The last grad op of stage 0 tagged as stage 1: a stage-1 backward reads stage-0
    gradients, which exist only after stage 1's backward ran."""
    main, startup, _ = _two_stage_nn()
    last_grad = [op for op in main.global_block().ops if op.name() == "pd_op.matmul_grad"][-1]
    last_grad.set_int_attr("chunk_id", 1)
    return _apply(main, startup), [main, startup]


def memory_limit_for_fixed_schedule():
    main, startup, _ = _two_stage_nn()
    return _apply(main, startup, memory_limit=1), [main, startup]


def memory_limit_nan():
    main, startup, _ = _two_stage_nn()
    return _apply(main, startup, "auto", memory_limit=float("nan")), [main, startup]


def memory_limit_inf():
    main, startup, _ = _two_stage_nn()
    return _apply(main, startup, "auto", memory_limit=float("inf")), [main, startup]


def memory_limit_bool():
    main, startup, _ = _two_stage_nn()
    return _apply(main, startup, "auto", memory_limit=True), [main, startup]


def memory_limit_one_per_rank_of_three_ranks():
    """Two pipeline ranks, three limits."""
    main, startup, _ = _two_stage_nn()
    return _apply(main, startup, "auto", memory_limit=[2, 2, 2]), [main, startup]


def costs_comm_nan():
    main, startup, _ = _two_stage_nn()
    costs = {"forward": 1, "backward_b": 1, "backward_w": 1, "comm": float("nan")}
    return _apply(main, startup, costs=costs), [main, startup]


def costs_w_memory_nan():
    from pipesplit.job_list import Costs

    main, startup, _ = _two_stage_nn()
    return (lambda: _apply(main, startup, "ZBH1", costs=Costs(w_memory=float("nan")))()), \
        [main, startup]


def costs_a_list():
    main, startup, _ = _two_stage_nn()
    return _apply(main, startup, costs=[1, 2]), [main, startup]


def costs_wrong_stage_count():
    main, startup, _ = _two_stage_nn()
    costs = {"forward": [1, 1, 1], "backward_b": 1, "backward_w": 1}
    return _apply(main, startup, costs=costs), [main, startup]


def split_program_num_chunks():
    from pipesplit.ir_utils import split_program

    main, startup, _ = _two_stage_nn()
    return (lambda: split_program(main, 3)), [main, startup]


# --------------------------------------------------------------------------- valid programs

def unfetched_loss_trains_like_unsplit():
    """No shadow_output on the loss: completion must keep the forward in forward jobs, and one
    pipelined step must give the unsplit step's parameters."""
    import paddle

    import pipesplit.passes as passes
    from pipesplit.ir_utils import PlanRunner, read_params

    main, startup, _ = _two_stage_nn()
    x = np.random.default_rng(0).standard_normal((BATCH, 8)).astype(np.float32)
    names = [p.name for p in main.global_block().all_parameters()]

    def train():
        pipeline = passes.apply_pipeline(main, startup, "1F1B",
                                         {"num_micro_batches": M, "pp_degree": 2})
        forward_ops = [op.name() for op in pipeline.split.programs["forward0"].global_block().ops]
        if "pd_op.tanh" not in forward_ops:
            raise AssertionError(f"forward0 lost the forward: {forward_ops}")
        exe = paddle.static.Executor(paddle.CPUPlace())
        ours, ref = paddle.static.Scope(), paddle.static.Scope()
        for scope in (ours, ref):
            with paddle.static.scope_guard(scope):
                exe.run(startup)
        for name, value in read_params(ref, names).items():  # startup draws fresh randoms
            ours.find_var(name).get_tensor().set(value, paddle.CPUPlace())
        pipeline.init_scope(ours)
        PlanRunner(pipeline.plan, ours).step({"x": x})
        with paddle.static.scope_guard(ref):
            exe.run(main, feed={"x": x})
        a, b = read_params(ours, names), read_params(ref, names)
        diff = max(float(np.max(np.abs(a[n] - b[n]))) for n in names)
        if diff > 1e-6:
            raise AssertionError(f"parameters differ from unsplit training by {diff}")
    return train, [main, startup]


def adamw_with_global_norm_clipping_is_accepted():
    main, startup, _ = _two_stage_nn(optimizer="adamw")
    return _apply(main, startup, "ZBH1"), [main, startup]


def lr_scheduler_unknown_to_the_runner():
    """Sub-programs made elsewhere read an LR scheduler's learning rate and nothing names the
    scheduler: refused, rather than trained at the initial rate."""
    from pipesplit.ir_utils import (PlanRunner, build_mlp, fthenb_order, init_scope, make_plan,
                                    split_program)

    model = build_mlp(num_stages=2, batch_size=BATCH, lr_schedule="step")
    split = split_program(model.main, 2, num_micro_batches=M)
    for program in split.programs.values():
        if hasattr(program, "lr_scheduler"):
            del program.lr_scheduler, program.lr_name
    plan = make_plan(fthenb_order(2, M), split.programs, M)
    return (lambda: PlanRunner(plan, init_scope(model, split))), [model.main, model.startup]


CASES = {f.__name__: f for f in [
    runner_scope_none, run_plan_scope_none, runner_plan_none, runner_place_string,
    erased_parameter_after_a_step, erased_accumulator_after_a_step, init_scope_not_called,
    init_scope_of_none, erased_fetch_and_feed_variables_rebuild_the_executor,
    recreated_variable_rebuilds_the_executor,
    feed_missing_on_second_step, feed_missing_on_first_step, feed_batch_sizes_differ,
    feed_wrong_dtype, feed_wrong_trailing_shape, feed_zero_rows, feed_not_divisible,
    feed_scalar, feed_unknown_name, feed_is_a_list,
    main_none, startup_not_a_program, attrs_a_list, new_pass_main_none,
    pp_vpp_do_not_match_chunk_ids, two_minimize_calls, two_minimize_calls_per_rank,
    data_flows_back_a_stage, gradient_flows_to_a_later_stage, memory_limit_for_fixed_schedule,
    memory_limit_nan,
    memory_limit_inf, memory_limit_bool, memory_limit_one_per_rank_of_three_ranks,
    costs_comm_nan, costs_w_memory_nan, costs_a_list,
    costs_wrong_stage_count, split_program_num_chunks,
    unfetched_loss_trains_like_unsplit, adamw_with_global_norm_clipping_is_accepted,
    lr_scheduler_unknown_to_the_runner,
]}

#: case -> (exception type name or None, strings the message's first line contains)
EXPECTED = {
    "runner_scope_none": ("TypeError", ["scope must be", "NoneType"]),
    "run_plan_scope_none": ("TypeError", ["scope must be", "NoneType"]),
    "runner_plan_none": ("TypeError", ["plan must be", "NoneType"]),
    "runner_place_string": ("TypeError", ["place must be", "str"]),
    "erased_parameter_after_a_step": ("ValueError", ["scope lacks", "ps_param_0",
                                                     "startup program"]),
    "erased_accumulator_after_a_step": ("ValueError", ["scope lacks", "@PS_ACC", "init_scope"]),
    "init_scope_not_called": ("ValueError", ["scope lacks", "@PS_ACC", "init_scope"]),
    "init_scope_of_none": ("TypeError", ["scope must be a paddle.static.Scope", "NoneType"]),
    "recreated_variable_rebuilds_the_executor": (None, []),
    "erased_fetch_and_feed_variables_rebuild_the_executor": (None, []),
    "feed_missing_on_second_step": ("ValueError", ["feed lacks ['y']", "every step"]),
    "feed_missing_on_first_step": ("ValueError", ["feed lacks ['y']"]),
    "feed_batch_sizes_differ": ("ValueError", ["feed 'y' has 4 rows but feed 'x' has 8"]),
    "feed_wrong_dtype": ("ValueError", ["feed 'x' has dtype float64", "float32[?, 16]"]),
    "feed_wrong_trailing_shape": ("ValueError", ["feed 'x' has shape [8, 5]", "float32[?, 16]"]),
    "feed_zero_rows": ("ValueError", ["feed 'x' has 0 rows", "num_micro_batches=2"]),
    "feed_not_divisible": ("ValueError", ["feed 'x'", "7 is not divisible by num_micro_batches=2"]),
    "feed_scalar": ("ValueError", ["feed 'x' has shape []", "float32[?, 16]"]),
    "feed_unknown_name": ("ValueError", ["feed has ['z']", "does not read"]),
    "feed_is_a_list": ("TypeError", ["feed must be a dict", "list"]),
    "main_none": ("TypeError", ["main_program must be a paddle.pir.Program", "NoneType"]),
    "startup_not_a_program": ("TypeError", ["startup_program must be", "int"]),
    "attrs_a_list": ("TypeError", ["attrs must be a dict", "list"]),
    "new_pass_main_none": ("TypeError", ["main_program must be a paddle.pir.Program"]),
    "pp_vpp_do_not_match_chunk_ids": ("ValueError", ["pp_degree x vpp_degree = 2 x 2 = 4 stages",
                                                     "chunk ids are [0, 1]"]),
    "two_minimize_calls": ("ValueError", ["more than one optimizer step", "minimize()"]),
    "two_minimize_calls_per_rank": ("ValueError", ["more than one optimizer step"]),
    "data_flows_back_a_stage": ("ValueError", ["against the pipeline, from stage 1 to stage 0",
                                               "forward op pd_op.add", "pd_op.tanh"]),
    "gradient_flows_to_a_later_stage": ("ValueError", [
        "against the pipeline, from stage 0 to stage 1", "backward op pd_op.matmul_grad"]),
    "memory_limit_for_fixed_schedule": ("ValueError", ["memory_limit is not used by schedule "
                                                       "1F1B", "auto"]),
    "memory_limit_nan": ("ValueError", ["memory_limit must be a finite number", "nan"]),
    "memory_limit_inf": ("ValueError", ["memory_limit must be a finite number", "inf"]),
    "memory_limit_bool": ("TypeError", ["memory_limit must be a number"]),
    "memory_limit_one_per_rank_of_three_ranks": ("ValueError", [
        "memory_limit must be one number or one per pipeline rank (2)", "got 3 numbers"]),
    "costs_comm_nan": ("ValueError", ["costs.comm must be a finite number", "nan"]),
    "costs_w_memory_nan": ("ValueError", ["costs.w_memory must be a finite number", "nan"]),
    "costs_a_list": ("TypeError", ["costs must be a Costs or a dict", "list"]),
    "costs_wrong_stage_count": ("ValueError", ["costs.forward has 3 entries", "2 virtual stages"]),
    "split_program_num_chunks": ("ValueError", ["num_chunks=3", "chunk ids are [0, 1]"]),
    "unfetched_loss_trains_like_unsplit": (None, []),
    "adamw_with_global_norm_clipping_is_accepted": (None, []),
    "lr_scheduler_unknown_to_the_runner": ("ValueError", [
        "learning rate ['learning_rate_0'] of an LR scheduler", "program=main"]),
}


def run_case(name: str) -> dict:
    action, programs = CASES[name]()
    before = [str(p) for p in programs]
    error = None
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - the result is reported, not handled
        error = exc
    unchanged = [str(p) for p in programs] == before
    lines = str(error).splitlines() if error is not None else []
    return {"case": name, "type": type(error).__name__ if error is not None else None,
            "first_line": lines[0] if lines else "", "unchanged": unchanged}


def main(names) -> None:
    for name in names:
        print(f"START {name}", flush=True)
        print(json.dumps(run_case(name)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

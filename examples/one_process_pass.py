"""Split a model built with ``paddle.nn`` layers into a pipeline and train it in one process.

    python examples/one_process_pass.py

Every pipeline rank is emulated in this one process (``pp_stage`` not set): pipesplit's pass
turns the static training program into per-chunk sub-programs and one ``core.Plan`` in the
schedule's order, and Paddle's standalone executor runs it.  The script trains 4 stages with
the zero-bubble ZB-V schedule (2 ranks x 2 chunks, 4 micro-batches) beside the same program
run unsplit, and prints both losses and the largest parameter difference.
"""
import os

os.environ.setdefault("GLOG_minloglevel", "2")  # keep Paddle's C++ info logs quiet

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle.base.framework import pir_chunk_id_guard  # noqa: E402

import pipesplit.passes as pipesplit  # noqa: E402
from pipesplit.ir_utils import PlanRunner, read_params  # noqa: E402

STAGES = 4            # global virtual stages = pp_degree * vpp_degree
MICRO_BATCHES = 4
BATCH, HIDDEN, STEPS = 16, 32, 3
ATTRS = {"num_micro_batches": MICRO_BATCHES, "pp_degree": 2, "vpp_degree": 2}


def build_program():
    """An MLP regression model, one Linear + GELU per stage, Momentum optimizer.  The ops of a
    stage are created under ``pir_chunk_id_guard(stage)``; the optimizer comes after, untagged
    (the pass completes roles and chunks itself)."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, HIDDEN], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        h = x
        for stage in range(STAGES):
            with pir_chunk_id_guard(stage):
                h = paddle.nn.functional.gelu(paddle.nn.Linear(HIDDEN, HIDDEN)(h))
        with pir_chunk_id_guard(STAGES - 1):
            loss = paddle.nn.functional.mse_loss(paddle.nn.Linear(HIDDEN, 1)(h), y)
        # a named value is what the plan fetches, once per micro-batch
        paddle._C_ops.set_persistable_value(loss, "loss")
        paddle.optimizer.Momentum(learning_rate=0.05, momentum=0.9).minimize(loss)
    params = [p.name for p in main.global_block().all_parameters()]
    return main, startup, params


def batch(step):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((BATCH, HIDDEN)).astype(np.float32)
    return {"x": x, "y": np.tanh(x[:, :1] - x[:, 1:2]).astype(np.float32)}


def new_scope(startup, params_from=None, params=()):
    """A scope with the startup program run; ``params_from``: copy these parameters from that
    scope (each run of the startup program draws new random initial values)."""
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    for name in params if params_from is not None else ():
        value = np.array(params_from.find_var(name).get_tensor())
        scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())
    return scope


def loss_of(program):
    """The value named ``loss`` (``set_persistable_value``), for the unsplit run's fetch."""
    for op in program.global_block().ops:
        if op.name() == "builtin.shadow_output" and op.attrs()["output_name"] == "loss":
            return op.operand_source(0)
    raise ValueError("the program names no value 'loss'")


def main():
    program, startup, params = build_program()

    pipeline = pipesplit.apply_pipeline(program, startup, "ZBV", ATTRS)
    print(pipeline.schedule)  # every rank's job list
    sim = pipeline.simulate()
    print(f"simulated makespan {sim.makespan:g}, bubble {sim.bubble_ratio:.1%}")
    scope = new_scope(startup)
    pipeline.init_scope(scope)  # zeroes the gradient accumulators
    # the same program unsplit, on the full batch (the pass never modifies its input)
    reference_scope = new_scope(startup, params_from=scope, params=params)

    runner = PlanRunner(pipeline.plan, scope)
    losses = [float(np.mean(runner.step(batch(step)))) for step in range(STEPS)]
    exe = paddle.static.Executor(paddle.CPUPlace())
    reference = []
    with paddle.static.scope_guard(reference_scope):
        for step in range(STEPS):
            (value,) = exe.run(program, feed=batch(step), fetch_list=[loss_of(program)])
            reference.append(float(value))

    print(f"{'step':>4}  {'loss (pipeline)':>15}  {'loss (unsplit)':>14}")
    for step, (ours, ref) in enumerate(zip(losses, reference)):
        print(f"{step:>4}  {ours:>15.7f}  {ref:>14.7f}")
    ours, ref = read_params(scope, params), read_params(reference_scope, params)
    diff = max(float(np.max(np.abs(ours[n] - ref[n]))) for n in params)
    print(f"max parameter difference after {STEPS} steps: {diff:.2e}")
    return 0 if diff < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""A schedule of your own, written in PyTorch's pipelining CSV format, checked, simulated and
used to train a model.

    python examples/custom_schedule_csv.py [SCHEDULE.csv]

The CSV (torchtitan's ``_dump_csv`` / ``_load_csv`` format) has one row per rank, one cell per
action ``{stage}{op}{micro-batch}`` with the global stage; ``F`` forward, ``B`` full backward,
``I`` / ``W`` input / weight gradient.  Without an argument the script uses the one below: 1F1B
on 2 ranks whose first rank runs one more warm-up forward.  It

1. parses it (:func:`pipesplit.job_list.views.from_csv`) and validates it (dependencies,
   rendezvous order: a schedule that would deadlock is refused here, naming the jobs),
2. simulates it beside the built-in 1F1B,
3. registers it as a schedule and trains the small MLP with it, beside an unsplit run.
"""
import os
import sys

os.environ.setdefault("GLOG_minloglevel", "2")  # keep Paddle's C++ info logs quiet

import numpy as np  # noqa: E402

from pipesplit.job_list import build_schedule, register_schedule  # noqa: E402
from pipesplit.job_list.simulate import Costs, simulate  # noqa: E402
from pipesplit.job_list.validate import validate  # noqa: E402
from pipesplit.job_list.views import ascii_grid, from_csv  # noqa: E402

NAME = "MyEager1F1B"
CSV = """\
0F0,0F1,0F2,0B0,0F3,0B1,0B2,0B3
1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3
"""
COSTS = Costs(forward=1, backward=2, comm=0.1)


def load(text: str):
    schedule = from_csv(text, name=NAME)
    validate(schedule)
    return schedule


def register(schedule) -> None:
    """Make ``schedule`` a named schedule, so ``apply_pipeline`` (and Paddle's pass registry
    through pipesplit) can use it; it serves exactly its own pp / vpp / m."""

    @register_schedule(NAME, description="imported from CSV")
    def generator(pp, vpp, m):
        if (pp, vpp, m) != (schedule.pp, schedule.vpp, schedule.m):
            raise ValueError(f"{NAME} is written for pp={schedule.pp} vpp={schedule.vpp} "
                             f"m={schedule.m}, got pp={pp} vpp={vpp} m={m}")
        return [list(jobs) for jobs in schedule.ranks]


def train(schedule, steps: int = 3) -> float:
    """Train a small MLP (one stage per chunk, 2 samples per micro-batch) with the imported
    schedule; the largest parameter difference to an unsplit run of the same program."""
    from pipesplit.ir_utils import PlanRunner, build_mlp, init_scope, read_params, run_unsplit_baseline
    from pipesplit.passes import apply_pipeline

    pp, vpp, m = schedule.pp, schedule.vpp, schedule.m
    model = build_mlp(num_stages=pp * vpp, batch_size=2 * m)
    pipeline = apply_pipeline(model.main, model.startup, NAME,
                              {"num_micro_batches": m, "pp_degree": pp, "vpp_degree": vpp})
    scope = init_scope(model, pipeline.split)
    runner = PlanRunner(pipeline.plan, scope)
    for step in range(steps):
        runner.step(model.make_batch(step))
    _, reference = run_unsplit_baseline(model, steps, m)
    ours = read_params(scope, model.param_names)
    return max(float(np.max(np.abs(ours[n] - reference[n]))) for n in model.param_names)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = open(argv[0]).read() if argv else CSV
    try:
        schedule = load(text)
    except ValueError as exc:  # a malformed cell, a missing job, a deadlock (ScheduleError)
        print(f"{argv[0] if argv else 'CSV'}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(schedule)
    sim = simulate(schedule, COSTS)
    print(ascii_grid(sim))
    reference = simulate(build_schedule("1F1B", schedule.pp, schedule.vpp, schedule.m), COSTS)
    print(f"{NAME}: makespan {sim.makespan:g}, peak memory {sim.max_peak_memory:g}; "
          f"1F1B: makespan {reference.makespan:g}, peak memory {reference.max_peak_memory:g} "
          f"(tF=1, tB=2, comm=0.1)")
    register(schedule)
    diff = train(schedule)
    print(f"trained 3 steps with {NAME}: max parameter difference to unsplit {diff:.2e}")
    return 0 if diff < 1e-6 else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The engine's re-plan, on 2 processes in ONE launch: ``engine_replan.py OUT_DIR`` trains the
GPT example through ``dist.to_static`` in several scenarios (all, or those named after
OUT_DIR) and writes
``OUT_DIR/<scenario>.rank<r>.json``; ``tests/multiprocess/test_replan.py`` checks them.

* ``measured``: ``auto`` with no costs measures step 1 and re-plans once;
* ``injected``: ``auto`` with measuring off, re-planned by hand after step 0 with fixed costs
  (the schedule they give is known in advance: deterministic);
* ``given``: ``auto`` with a cost file (``use_costs``) measures nothing.

Each scenario records the re-plan, the job order the executor ran in the step after it (from
Paddle's profiler) and the losses and parameters against the example's one-process reference.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import auto_parallel_pipeline as example  # noqa: E402

from pipesplit.job_list import Costs  # noqa: E402
from pipesplit.passes import cpu_support, strategy as ps_strategy  # noqa: E402
from pipesplit.passes.engine.session import engine_state  # noqa: E402
from pipesplit.passes.measure.profile import record_jobs  # noqa: E402

COST_FILE = Path(__file__).resolve().parents[1] / "data" / "profiled_mlp_pp2_vpp1.json"
#: costs whose auto schedule differs from the default one (stage 0's I almost free, its W
#: dear; once measured on this model): the last rank receives a micro-batch ahead, the first
#: rank fetches no loss, so it shows whether each rank really runs the new plan
INJECTED = Costs(forward=(2.94, 3.08), backward_b=(0.01, 1.98), backward_w=(4.7, 2.92),
                 comm=0.377, comm_mode="rendezvous")
STEPS = 4


def scenario(name, out: Path):
    args = example.parse_args(["--schedule", "auto", "-m", "4", "--steps", str(STEPS),
                               "--tag", name])
    strategy = example.make_strategy(args)
    if name == "injected":
        ps_strategy.measure_costs(strategy, None)
    if name == "given":
        ps_strategy.use_costs(strategy, str(COST_FILE))
    world = dist.get_world_size()
    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
    model = example.build(args, [meshes[i * world // args.layers] for i in range(args.layers)])
    opt = example.make_optimizer(args, model.parameters())
    data = example.TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
    loader = paddle.io.DataLoader(data, batch_size=args.batch, shuffle=False)
    dist_model = dist.to_static(model, loader, example.lm_loss, opt, strategy)
    dist_model.train()
    losses, executed = [], None
    for step, (x, y) in enumerate(loader()):
        if step == 1 and name == "injected":
            ps_strategy.replan(dist_model, INJECTED)
        done = ps_strategy.replanned(dist_model)
        if done is not None and executed is None:  # the first step after the re-plan
            loss, jobs = record_jobs(lambda: dist_model(x, y))
            executed = [[t, mb] for t, mb, _ in jobs]
        else:
            loss = dist_model(x, y)
        if loss is not None:
            losses.append(np.asarray(loss, np.float64).reshape(-1).tolist())
    done = ps_strategy.replanned(dist_model)
    trained_with = engine_state(dist_model._engine).pipeline_of("train").config.costs
    ref, ref_params = example.reference(args)
    params = example.local_parameters(dist_model)
    record = {
        "rank": dist.get_rank(), "losses": losses, "reference_losses": ref["losses"],
        "max_param_diff": max(float(np.max(np.abs(v - ref_params[k])))
                              for k, v in params.items() if k in ref_params),
        "replanned": None if done is None else {
            "step": done.step, "costs": done.costs.to_dict(),
            "before_order": [list(j) for j in done.before.job_order],
            "after_order": [list(j) for j in done.after.job_order],
            "after_ranks": [[str(j) for j in jobs] for jobs in done.after.schedule.ranks],
            "timings": done.timings},
        "executed_after": executed,
        "plan_costs": None if trained_with is None else trained_with.to_dict()}
    (out / f"{name}.rank{dist.get_rank()}.json").write_text(json.dumps(record))


def main() -> int:
    os.environ.pop("POD_NAME", None)  # (DistModel's fleet.init: see engine_grid.py)
    out = Path(sys.argv[1])
    dist.init_parallel_env()
    ps_strategy.enable_strategy()
    cpu_support.enable()
    for name in sys.argv[2:] or ("measured", "injected", "given"):
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            scenario(name, out)
    example.exchange(dist.get_rank(), dist.get_world_size(), {}, key="replan/done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

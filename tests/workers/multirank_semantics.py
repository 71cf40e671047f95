"""Worker of ``test_multirank_semantics``: every row of the semantics grid trained with this
rank's programs (``pp_stage``) on two gloo processes, compared by the last rank with the
unsplit full-batch run; then the evaluation programs.  Usage: ``multirank_semantics.py OUT``."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = str(Path(__file__).resolve().parents[2])
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import _user_programs as U  # noqa: E402
from _semantics import GRID, LAYOUTS, M, case_of  # noqa: E402


def _worker(out_path):
    """Train every GRID row with this rank's programs; the last rank compares with unsplit."""
    import paddle
    import paddle.distributed as dist

    sys.path.insert(0, REPO)
    from pipesplit.ir_utils import PlanRunner
    from pipesplit.passes.transport.p2p import PROGRESS_VAR
    from pipesplit.passes import apply_pipeline
    from pipesplit.tools.train import _exchange

    dist.init_parallel_env()
    paddle.enable_static()
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for i, row in enumerate(GRID):
        case, vpp = case_of(row), LAYOUTS[row["schedule"]]
        prog = U.build(case, world * vpp)
        pipeline = apply_pipeline(prog.main, prog.startup, row["schedule"], dict(
            num_micro_batches=M, pp_degree=world, vpp_degree=vpp, pp_stage=rank,
            split_backward=row["split_backward"]))
        info = pipeline.rank_info
        scope = U.new_scope(prog)
        pipeline.init_scope(scope)
        progress = scope.var(PROGRESS_VAR).get_tensor()  # the comm programs' step counter
        runner = PlanRunner(pipeline.plan, scope, program=prog.main)
        losses = []
        for step in range(U.STEPS):
            progress.set(np.zeros([1], np.float32), paddle.CPUPlace())
            full = U.batch(case, step, M * U.MICRO_BATCH_SIZE)
            out = runner.step({k: v for k, v in full.items() if k in info.feed_names})
            if info.fetch_names:
                losses.append([float(x) for x in out])
            if prog.scheduler is not None:
                prog.scheduler.step()
        params = U.read(scope, info.param_names)
        payload = {"losses": losses if info.fetch_names else None,
                   "params": {n: v.tolist() for n, v in params.items()}}
        gathered = _exchange(rank, world, f"semantics{i}", payload, gather_to=world - 1)
        if gathered is not None:
            ref_losses, ref_params = U.train_unsplit(case, world * vpp, M)
            got = next(g["losses"] for g in gathered if g["losses"] is not None)
            by_rank = [{n: np.asarray(v, np.float32) for n, v in g["params"].items()}
                       for g in gathered]
            shared = set(by_rank[0]) & set(by_rank[1])
            merged = {n: v for p in by_rank for n, v in p.items()}
            loss_diff, param_diff = U.max_diffs(got, merged, ref_losses, ref_params)
            results.append({"row": row, "loss_diff": loss_diff, "param_diff": param_diff,
                            "shared_equal": all(np.array_equal(by_rank[0][n], by_rank[1][n])
                                                for n in shared)})
        _exchange(rank, world, f"semantics{i}/done", {}, gather_to=0)
    evaluations = []
    for name, vpp in LAYOUTS.items():  # evaluation programs: forward-only per-rank plans
        case = U.Case(tied=True)
        prog = U.build(case, world * vpp, train=False)
        pipeline = apply_pipeline(prog.main, prog.startup, name, dict(
            num_micro_batches=M, pp_degree=world, vpp_degree=vpp, pp_stage=rank))
        info = pipeline.rank_info
        scope = U.new_scope(prog)
        scope.var(PROGRESS_VAR).get_tensor().set(np.zeros([1], np.float32), paddle.CPUPlace())
        full = U.batch(case, 0, M * U.MICRO_BATCH_SIZE)
        out = PlanRunner(pipeline.plan, scope).step(
            {k: v for k, v in full.items() if k in info.feed_names})
        if info.fetch_names:
            ref = U.unsplit_forward(prog, U.new_scope(prog), full, M)
            evaluations.append({"schedule": name, "job_types": sorted(pipeline.plan.job_types()),
                                "diff": float(np.max(np.abs(np.array(out) - ref)))})
    with open(f"{out_path}.eval{rank}", "w") as f:  # from the rank holding the last stage
        json.dump(evaluations, f)
    if rank == world - 1:
        with open(out_path, "w") as f:
            json.dump(results, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _worker(sys.argv[1])

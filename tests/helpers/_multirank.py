"""Helpers of the multi-process tests (``test_multirank*``, ``test_engine_bad_input``): the
paths, the launch of a worker script under ``paddle.distributed.launch`` (or without it), the
one-process emulation a run is compared with, and the per-rank plans of the fast tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from _ledger import timed
from _paths import REPO as _REPO, WORKERS

REPO = str(_REPO)
TRAIN = os.path.join(REPO, "tools", "train.py")
#: the worker that trains a list of ``tools/train.py`` configurations in one launch
GRID_WORKER = str(WORKERS / "multirank_grid.py")
TOL = 1e-6
STEPS = ["--steps", "2"]


def launch_script(args, log_dir, timeout=240, nproc=2):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(log_dir)] + [str(a) for a in args]
    env = dict(os.environ, GLOG_minloglevel="2")
    with timed(nproc):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=str(log_dir))
    logs = {}
    for r in range(nproc):
        path = os.path.join(str(log_dir), f"workerlog.{r}")
        logs[r] = open(path).read() if os.path.exists(path) else ""
    return proc, logs


def spawn(args, log_dir, timeout=240, nproc=2):
    """Start ``nproc`` ranks without the launcher (same environment as it gives them), so that no
    rank is stopped because another one ended: the survivors' own reports are what is checked."""
    import socket

    from pipesplit.passes.transport import GLOO

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    ports = [free_port() for _ in range(nproc)]
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    master = f"127.0.0.1:{free_port()}"
    procs, files = [], []
    for r in range(nproc):
        env = dict(os.environ, GLOG_minloglevel="2", PADDLE_MASTER=master, PADDLE_NNODES="1",
                   PADDLE_GLOBAL_SIZE=str(nproc), PADDLE_LOCAL_SIZE=str(nproc),
                   PADDLE_TRAINERS_NUM=str(nproc), PADDLE_GLOBAL_RANK=str(r),
                   PADDLE_LOCAL_RANK=str(r), PADDLE_RANK_IN_NODE=str(r), PADDLE_TRAINER_ID=str(r),
                   PADDLE_TRAINER_ENDPOINTS=endpoints, PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{ports[r]}",
                   PADDLE_DISTRI_BACKEND=GLOO)
        files.append(open(os.path.join(str(log_dir), f"workerlog.{r}"), "w"))
        procs.append(subprocess.Popen([sys.executable] + [str(a) for a in args], env=env,
                                      stdout=files[-1], stderr=subprocess.STDOUT, cwd=str(log_dir)))
    try:
        with timed(nproc, how="spawned"):
            codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p, f in zip(procs, files):
            if p.poll() is None:
                p.kill()
            f.close()
    logs = {r: open(os.path.join(str(log_dir), f"workerlog.{r}")).read() for r in range(nproc)}
    return codes, logs


def emulate(argv, pp=2):
    """Losses and parameters of the one-process emulation (pp_stage=None) for demo args."""
    from pipesplit.ir_utils import PlanRunner, init_scope, read_params
    from pipesplit.passes import apply_pipeline
    from pipesplit.tools.demo import build_model, make_parser

    args = make_parser().parse_args(argv + ["--pp", str(pp)])
    model = build_model(args)
    pipeline = apply_pipeline(model.main, model.startup, args.schedule,
                              dict(num_micro_batches=args.m, pp_degree=pp, vpp_degree=args.vpp,
                                   split_backward=args.split_backward))
    scope = init_scope(model, pipeline.split)
    runner = PlanRunner(pipeline.plan, scope)
    losses = [[float(x) for x in runner.step(model.make_batch(s))] for s in range(args.steps)]
    return np.array(losses), read_params(scope, model.param_names)


def rank_plans(schedule, pp, vpp, m, split_backward=False, device="cpu", model="gpt"):
    from pipesplit.ir_utils import build_gpt, build_mlp
    from pipesplit.job_list.request import PipelineConfig
    from pipesplit.passes.split.per_rank import build_rank_plan

    build = build_gpt if model == "gpt" else build_mlp
    built = build(num_stages=pp * vpp, hidden=16, batch_size=2 * m)
    plans = []
    for r in range(pp):
        config = PipelineConfig.from_attrs(schedule, dict(
            num_micro_batches=m, pp_degree=pp, vpp_degree=vpp, pp_stage=r,
            split_backward=split_backward))
        plans.append(build_rank_plan(built.main, built.startup, config, device=device))
    return built, plans


def check_grid_results(out, grid, pp):
    """Each configuration's losses and every parameter (written by the workers under ``out``)
    equal the one-process emulation within TOL."""
    for i, cfg in enumerate(grid):
        where = f"pp={pp} " + " ".join(cfg)
        rec = json.loads((out / f"cfg{i}.json").read_text())
        params = np.load(out / f"cfg{i}.npz")
        losses, ref_params = emulate(cfg + STEPS, pp=pp)
        got = np.array(rec["losses"])
        assert got.shape == losses.shape, where
        assert float(np.max(np.abs(got - losses))) <= TOL, where
        assert set(params.files) == set(ref_params), where
        diff = max(float(np.max(np.abs(params[n] - ref_params[n]))) for n in ref_params)
        assert diff <= TOL, f"{where}: parameters differ from the emulation by {diff:.3g}"
        assert rec["max_param_diff"] <= TOL, where

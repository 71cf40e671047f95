"""Per-rank programs (pp_stage) and real multi-process runs on CPU (gloo, 2 ranks).

The fast tests check the per-rank programs in one process.  The ``slow`` ones launch two
processes with ``paddle.distributed.launch`` (this file is also the worker script: ``--worker``)
and compare each run with the one-process emulation (pp_stage=None) within 1e-6.

Multi-process grid, pp = 2, 2 steps each, gpt unless noted: 1F1B and VPP (vpp=2), with and
without split_backward, ZBH1, ZBV and ZBVPP (vpp=2), each for m in {2, 3, 4}; ZBVPP m=4 (mlp).
All configurations run in one launch (the worker loops over them).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "tools", "train.py")
TOL = 1e-6

# the grid: 1F1B and VPP (vpp=2) with and without split_backward, the zero-bubble
# schedules (split implied), m in {2, 3, 4}; plus one MLP run
GRID = [["--schedule", name, "--vpp", str(vpp), "-m", str(m)] + split
        for name, vpp in (("1F1B", 1), ("VPP", 2)) for m in (2, 3, 4)
        for split in ([], ["--split-backward"])] + \
       [["--schedule", name, "--vpp", str(vpp), "-m", str(m)]
        for name, vpp in (("ZBH1", 1), ("ZBV", 2), ("ZBVPP", 2)) for m in (2, 3, 4)] + \
       [["--schedule", "ZBVPP", "--vpp", "2", "-m", "4", "--model", "mlp"]]
STEPS = ["--steps", "2"]


# --------------------------------------------------------------------------- helpers

def _launch(args, log_dir, timeout=240, nproc=2):
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(log_dir)] + [str(a) for a in args]
    env = dict(os.environ, GLOG_minloglevel="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(log_dir))
    logs = {}
    for r in range(nproc):
        path = os.path.join(str(log_dir), f"workerlog.{r}")
        logs[r] = open(path).read() if os.path.exists(path) else ""
    return proc, logs


def _spawn(args, log_dir, timeout=240, nproc=2):
    """Start ``nproc`` ranks without the launcher (same environment as it gives them), so that no
    rank is stopped because another one ended: the survivors' own reports are what is checked."""
    import socket

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
                   PADDLE_DISTRI_BACKEND="gloo")
        files.append(open(os.path.join(str(log_dir), f"workerlog.{r}"), "w"))
        procs.append(subprocess.Popen([sys.executable] + [str(a) for a in args], env=env,
                                      stdout=files[-1], stderr=subprocess.STDOUT, cwd=str(log_dir)))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p, f in zip(procs, files):
            if p.poll() is None:
                p.kill()
            f.close()
    logs = {r: open(os.path.join(str(log_dir), f"workerlog.{r}")).read() for r in range(nproc)}
    return codes, logs


def _emulate(argv, pp=2):
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


# --------------------------------------------------------------------------- fast (1 process)

def _rank_plans(schedule, pp, vpp, m, split_backward=False, device="cpu", model="gpt"):
    from pipesplit.ir_utils import build_gpt, build_mlp
    from pipesplit.passes.config import PipelineConfig
    from pipesplit.passes.per_rank import build_rank_plan

    build = build_gpt if model == "gpt" else build_mlp
    built = build(num_stages=pp * vpp, hidden=16, batch_size=2 * m)
    plans = []
    for r in range(pp):
        config = PipelineConfig.from_attrs(schedule, dict(
            num_micro_batches=m, pp_degree=pp, vpp_degree=vpp, pp_stage=r,
            split_backward=split_backward))
        plans.append(build_rank_plan(built.main, built.startup, config, device=device))
    return built, plans


@pytest.mark.parametrize("schedule,vpp", [("VPP", 2), ("ZBV", 2)])
def test_rank_programs_partition_the_model(schedule, vpp):
    built, plans = _rank_plans(schedule, 2, vpp, 4)
    held = [set(p.rank_info.param_names) for p in plans]
    assert not held[0] & held[1]
    assert held[0] | held[1] == set(built.param_names)
    for r, p in enumerate(plans):
        info = p.rank_info
        placement = p.schedule.placement
        assert info.stages == {c: placement.stage(r, c) for c in range(vpp)}
        types = set(p.plan.job_types())
        assert types <= {f"{k}{c}" for c in range(vpp) for k in (
            "forward", "backward", "backward_b", "backward_w", "send_forward", "recv_forward",
            "send_backward", "recv_backward")} | {"optimizer"}
        assert p.job_order[-1] == ("optimizer", 0)
        # the optimizer updates exactly this rank's parameters
        opt = p.plan.ir_program("optimizer")
        updated = {op.operand_source(0).get_defining_op().attrs()["parameter_name"]
                   for op in opt.global_block().ops if op.name() == "pd_op.sgd_"}
        assert updated == held[r]
        # the loss is fetched on the rank holding the last stage only
        last = placement.rank_of(placement.num_stages - 1)
        assert (info.fetch_names == ["loss"]) == (r == last)


def test_v_turn_hands_over_in_memory():
    _, plans = _rank_plans("ZBV", 2, 2, 4)
    # rank 1 holds stages 1 and 2: nothing crosses between its chunks
    info = plans[1].rank_info
    assert info.stages == {0: 1, 1: 2}
    assert not info.comm["send_forward0"].transfers
    assert not info.comm["recv_forward1"].transfers
    assert not info.comm["send_backward1"].transfers
    assert not info.comm["recv_backward0"].transfers
    assert info.comm["recv_forward0"].transfers and info.comm["send_forward1"].transfers


def test_comm_sequences_pair_up():
    """Both ranks issue their comm jobs in one global order: the k-th comm job of rank 0 and
    of rank 1 are the two ends of one transfer."""
    for schedule, vpp, m, sb in (("VPP", 2, 3, False), ("ZBV", 2, 4, True), ("1F1B", 1, 3, True)):
        _, plans = _rank_plans(schedule, 2, vpp, m, sb)
        seqs = [p.rank_info.comm_sequence for p in plans]
        assert len(seqs[0]) == len(seqs[1]) > 0
        for (t0, mb0, peer0), (t1, mb1, peer1) in zip(*seqs):
            assert (peer0, peer1) == (1, 0)
            assert t0.startswith("send") != t1.startswith("send")
            c0 = plans[0].rank_info.comm[t0].transfers
            c1 = plans[1].rank_info.comm[t1].transfers
            assert [t.name for t in c0] == [t.name for t in c1]


def test_gloo_programs_use_broadcast_rooted_at_sender():
    from pipesplit.ir_utils.p2p import comm_peers

    _, plans = _rank_plans("VPP", 2, 2, 4)
    for r, p in enumerate(plans):
        for t, info in p.rank_info.comm.items():
            ops = comm_peers(p.split.programs[t])
            if not info.transfers:
                assert not ops
                continue
            root = r if t.startswith("send") else 1 - r
            assert ops and all(name == "pd_op.broadcast_" and ring == 0 and peer == root
                               for name, ring, peer in ops)


# --------------------------------------------------------------------------- slow (2 processes)

@pytest.mark.slow
def test_two_ranks_match_emulation(tmp_path):
    spec = tmp_path / "grid.json"
    spec.write_text(json.dumps([cfg + STEPS for cfg in GRID]))
    out = tmp_path / "out"
    out.mkdir()
    proc, logs = _launch([os.path.abspath(__file__), "--worker", spec, out], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs[0][-3000:] \
        + logs[1][-3000:]
    check_grid_results(out, GRID, pp=2)


def check_grid_results(out, grid, pp):
    """Each configuration's losses and every parameter (written by the workers under ``out``)
    equal the one-process emulation within TOL."""
    for i, cfg in enumerate(grid):
        where = f"pp={pp} " + " ".join(cfg)
        rec = json.loads((out / f"cfg{i}.json").read_text())
        params = np.load(out / f"cfg{i}.npz")
        losses, ref_params = _emulate(cfg + STEPS, pp=pp)
        got = np.array(rec["losses"])
        assert got.shape == losses.shape, where
        assert float(np.max(np.abs(got - losses))) <= TOL, where
        assert set(params.files) == set(ref_params), where
        diff = max(float(np.max(np.abs(params[n] - ref_params[n]))) for n in ref_params)
        assert diff <= TOL, f"{where}: parameters differ from the emulation by {diff:.3g}"
        assert rec["max_param_diff"] <= TOL, where


@pytest.mark.slow
def test_train_launcher_matches_demo(tmp_path):
    from pipesplit.tools import demo

    out = tmp_path / "out.json"
    proc, logs = _launch([TRAIN, "--schedule", "VPP", "--vpp", "2", "-m", "4", "--steps", "2",
                          "--json", out], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + logs[0][-3000:] + logs[1][-3000:]
    rec = json.loads(out.read_text())
    assert rec["max_param_diff"] <= TOL
    # the last rank's results reach the launcher's console (it shows rank 0's output)
    assert "rank 1 (results):" in proc.stdout and "max parameter difference" in proc.stdout
    ref = tmp_path / "demo.json"
    assert demo.main(["--schedule", "VPP", "--pp", "2", "--vpp", "2", "-m", "4", "--steps", "2",
                      "--json", str(ref)]) == 0
    ref = json.loads(ref.read_text())
    assert np.max(np.abs(np.array(rec["losses"]) - np.array(ref["losses"]))) <= TOL
    assert np.max(np.abs(np.array(rec["baseline_losses"]) - np.array(ref["baseline_losses"]))) \
        <= TOL


@pytest.mark.slow
def test_dead_rank_is_reported(tmp_path):
    # without the launcher, which would stop rank 0 (SIGTERM) as soon as rank 1 ends, possibly
    # before rank 0 has seen the closed connection and said so
    codes, logs = _spawn([TRAIN, "--schedule", "1F1B", "--vpp", "1", "-m", "4", "--steps", "3",
                          "--fail-at", "1:1", "--watchdog", "60"], tmp_path, timeout=120)
    assert codes[0] != 0 and codes[1] != 0, codes
    assert "rank 0 failed in step 1, waiting in send_forward0 micro-batch 0 with rank 1" \
        in logs[0], logs[0][-2000:]
    error = next(line for line in logs[0].splitlines() if "rank 0 failed in step 1" in line)
    assert not error.rstrip().endswith("std::exception"), error


@pytest.mark.slow
def test_stuck_rank_is_reported_by_watchdog(tmp_path):
    proc, logs = _launch([TRAIN, "--schedule", "ZBV", "--vpp", "2", "-m", "4", "--steps", "3",
                          "--fail-at", "0:1:hang", "--watchdog", "5"], tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "rank 1 no progress for 5 s in step 1, waiting in recv_forward0 micro-batch 0 " \
           "with rank 0" in logs[1], logs[1][-2000:]


# --------------------------------------------------------------------------- worker

def _worker(spec_path, out_dir):
    """Run every config of ``spec_path`` in this process group (one launch for the grid)."""
    import paddle.distributed as dist

    sys.path.insert(0, REPO)
    from pipesplit.tools.train import make_parser, run

    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    for i, argv in enumerate(json.loads(open(spec_path).read())):
        args = make_parser().parse_args(argv)
        args.pp = world
        record = run(args, rank, world, tag=f"cfg{i}")
        if record is not None:
            params = record.pop("params")
            np.savez(os.path.join(out_dir, f"cfg{i}.npz"), **params)
            with open(os.path.join(out_dir, f"cfg{i}.json"), "w") as f:
                json.dump(record, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], sys.argv[3])

"""tools/bench/bench_multirank.py end to end on a small GPT (two real processes, gloo).

Timing is the benchmark's business, not a test's: this checks what does not depend on the
machine's load -- the JSON's structure, that every schedule trained the same as an unsplit run
(losses recomputed here, independently of the workers), that each row's simulated time is the
simulator's for the profiled costs written beside it, that the fitted overhead is a least-
squares minimum, and that each goal carries a verdict (the ratio goals with their intervals).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _paths import REPO as _REPO

REPO = str(_REPO)
TOOL = os.path.join(REPO, "tools", "bench", "bench_multirank.py")
ARGS = ["--hidden", "64", "--seq-len", "8", "--micro-batch-size", "2", "--layers", "4",
        "-m", "4", "--steps", "2", "--warmup", "1", "--repeats", "1"]
NAMES = ["FThenB", "1F1B", "ZBH1", "ZBH2", "VPP", "ZBV", "DualPipeV"]
LOSS_TOL = 1e-5
VERDICTS = ("met", "missed", "unresolved")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_multirank") / "out.json"
    proc = subprocess.run([sys.executable, TOOL, "--json", str(out)] + ARGS,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, GLOG_minloglevel="2"))
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert "fitted per-job overhead" in proc.stdout and "goal auto" in proc.stdout
    with open(out) as f:
        return json.load(f)


@pytest.mark.slow
def test_rows_structure(report):
    rows = report["rows"]
    assert [r["schedule"] for r in rows[:-1]] == NAMES
    assert rows[-1]["schedule"] in ("auto (vpp 1)", "auto (vpp 2)")
    for r in rows:
        assert r["measured_ms"] > 0 and r["simulated_ms"] > 0 and r["fitted_ms"] > 0
        assert len(r["step_ms"]) == 2
        assert r["measured_ms"] == pytest.approx(float(np.median(r["step_ms"])))
        assert r["fitted_ratio"] == pytest.approx(r["measured_ms"] / r["fitted_ms"])
        assert len(r["optimizer_ms"]) == 2
        assert sum(r["optimizer_ms"]) == pytest.approx(report["optimizer_ms"])
    for key in ("measured_rank", "simulated_rank"):
        assert sorted(r[key] for r in rows) == list(range(1, len(rows) + 1))
    assert set(report["goals"]) == {"order", "ratio", "auto"}
    assert all(g["verdict"] in VERDICTS for g in report["goals"].values())


@pytest.mark.slow
def test_ratio_goals_carry_intervals(report):
    """The auto goal from the paired steps of auto and the fastest other schedule, the ratio
    goal from every row's steps over its fitted simulation; medians inside their intervals."""
    goals = report["goals"]
    assert goals["order"]["verdict"] == ("missed" if goals["order"]["conflicts"] else "met")
    for g in (goals["ratio"], goals["auto"]):
        low, high = g["ratio_ci"]
        assert low <= g["ratio"] <= high and g["steps"] == 2
        assert (g["steps_to_resolve"] is None) == (g["verdict"] != "unresolved"), g
    assert goals["auto"]["bound"] == pytest.approx(1.03)
    assert goals["ratio"]["bound"] == pytest.approx([0.85, 1.15])
    rows = {r["schedule"]: r for r in report["rows"]}
    assert goals["ratio"]["ratio"] == pytest.approx(rows[goals["ratio"]["worst"]]["fitted_ratio"])
    parts = [r["fitted_goal"]["verdict"] for r in rows.values()]
    assert goals["ratio"]["verdict"] == ("missed" if "missed" in parts else "unresolved"
                                         if "unresolved" in parts else "met")


@pytest.mark.slow
def test_losses_match_unsplit_run(report):
    """Every schedule's per-micro-batch losses over all steps = an unsplit run of the model."""
    from pipesplit.ir_utils import run_unsplit_baseline
    from pipesplit.tools.bench.bench_multirank import build, make_parser

    args = make_parser().parse_args(ARGS)
    steps = args.warmup + args.steps
    reference = {}
    for stages in (2, 4):
        losses, _ = run_unsplit_baseline(build(args, stages, args.m), steps, args.m)
        reference[stages] = np.array(losses, np.float64)
    for r in report["rows"]:
        ours = np.array(r["losses"], np.float64)
        assert ours.shape == (steps, args.m), r["schedule"]
        assert np.max(np.abs(ours - reference[2 * r["vpp"]])) <= LOSS_TOL, r["schedule"]
        assert r["loss_diff"] <= LOSS_TOL


@pytest.mark.slow
def test_simulated_times_are_the_simulators(report):
    """Rebuilt from the written costs, each schedule simulates to the row's figures, and the
    fitted overhead is the least-squares one within its bounds."""
    from pipesplit.job_list import Costs
    from pipesplit.job_list.request import PipelineConfig
    from pipesplit.job_list.request import make_schedule
    from pipesplit.tools.bench.bench_multirank import simulated_step

    schedules = []
    assert report["comm_mode"] == "rendezvous"  # gloo transfers block both ranks
    for r in report["rows"]:
        costs = Costs.from_dict(report["costs"][str(r["vpp"])])
        assert costs.rendezvous
        name = "auto" if r["schedule"].startswith("auto") else r["schedule"]
        config = PipelineConfig.from_attrs(name, dict(num_micro_batches=report["m"],
                                                      pp_degree=2, vpp_degree=r["vpp"],
                                                      costs=costs))
        schedule = make_schedule(config)
        schedules.append((schedule, costs, r))
        assert simulated_step(schedule, costs, r["optimizer_ms"]) == \
            pytest.approx(r["simulated_ms"])
        c = report["overhead_ms"]
        assert simulated_step(schedule, costs, r["optimizer_ms"], c) == \
            pytest.approx(r["fitted_ms"])

    def loss(c):
        return sum((r["measured_ms"] - simulated_step(s, costs, r["optimizer_ms"], c)) ** 2
                   for s, costs, r in schedules)

    # the fit is the least-squares c within its bounds: no point of a grid over them is lower
    c = report["overhead_ms"]
    lo, hi = report["overhead_bounds_ms"]
    assert lo <= c <= hi
    grid = [lo + (hi - lo) * i / 200 for i in range(201)]
    assert loss(c) <= min(loss(x) for x in grid) + 1e-9


def test_bad_arguments_are_refused():
    proc = subprocess.run([sys.executable, TOOL, "--layers", "6"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "--layers must be a multiple of 4" in proc.stderr

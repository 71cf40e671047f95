"""tools/bench/bench_engine.py end to end on the GPT example's tiny sizes (two real processes, gloo).

Timing is the benchmark's business, not a test's: this checks what does not depend on the
machine's load -- the rows' fields, both impls of 1F1B, positive times and memory, and that
pipesplit's runs trained as Paddle's own 1F1B did (the losses).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _paths import REPO as _REPO

REPO = str(_REPO)
TOOL = os.path.join(REPO, "tools", "bench", "bench_engine.py")
ARGS = ["--quick", "--steps", "2", "--warmup", "3", "--schedules", "1F1B,ZBV,auto"]
FIELDS = ("schedule", "impl", "step_ms", "step_ms_spread", "peak_bytes", "pass_ms",
          "max_loss_diff")
#: fp32, the same model and batches: the engines' losses agree to rounding
LOSS_TOL = 1e-5
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_engine") / "out.json"
    proc = subprocess.run([sys.executable, TOOL, "--json", str(out)] + ARGS,
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=dict(os.environ, GLOG_minloglevel="2"))
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    with open(out) as f:
        return json.load(f), proc.stdout


@pytest.mark.slow
def test_rows_carry_the_fields(run):
    report, _ = run
    rows = report["rows"]
    assert [(r["schedule"], r["impl"]) for r in rows] == [
        ("1F1B", "paddle"), ("1F1B", "pipesplit"), ("ZBV", "pipesplit"), ("auto", "pipesplit")]
    for r in rows:
        assert all(key in r for key in FIELDS), sorted(set(FIELDS) - set(r))
        assert r["step_ms"] > 0 and r["step_ms_spread"] >= 0 and r["pass_ms"] > 0
        assert len(r["step_ms_all"]) == 2
        assert len(r["peak_bytes"]) == 2 and all(b > 0 for b in r["peak_bytes"])


@pytest.mark.slow
def test_losses_agree_with_paddle_1f1b(run):
    report, _ = run
    for r in report["rows"]:
        assert r["loss_reference"] == "paddle 1F1B"
        assert r["max_loss_diff"] is not None and r["max_loss_diff"] <= LOSS_TOL, r
        assert len(r["losses"]) == 6  # warm-up, timed and profiled steps


@pytest.mark.slow
def test_auto_runs_as_a_user_gets_it_measured_and_replanned(run):
    """No cost file: auto measured step 1 (both stages' costs in its row and printed)."""
    report, stdout = run
    rows = {r["schedule"]: r for r in report["rows"] if r["impl"] == "pipesplit"}
    done = rows["auto"]["replanned"]
    assert done["step"] == 1 and len(done["costs"]["forward"]) == 2
    assert rows["ZBV"]["replanned"] is None
    assert f"auto measured in step 1 (ms per stage): F {done['costs']['forward']}" in stdout


@pytest.mark.slow
def test_each_schedule_shows_its_own_job_times(run):
    """One more step per engine under Paddle's profiler: pipesplit's forward / B / W / comm
    jobs per rank, Paddle's own jobs by their names; the table printed."""
    report, stdout = run
    for r in report["rows"]:
        assert len(r["job_ms"]) == 2 and r["profiled_step_ms"] > 0
        kinds = set().union(*(s["total"] for s in r["job_ms"]))
        assert "forward" in kinds and ("optimizer" in kinds or "optimize" in kinds), kinds
        if r["impl"] == "pipesplit":
            assert {"send_forward", "recv_forward"} <= kinds, kinds
    assert "each schedule's own jobs in one more step" in stdout


@pytest.mark.slow
def test_goals_printed(run):
    report, stdout = run
    assert set(report["goals"]) == {"1f1b", "best", "pass", "auto"}
    assert all(g["met"] in (True, False) for g in report["goals"].values())
    for goal in report["goals"].values():
        assert ("PASS  " if goal["met"] else "MISS  ") + goal["text"] in stdout

"""tools/bench/bench_pass_growth.py: its pure pieces, its refusals, and one run end to end at
the GPT example's tiny sizes (two real launches of bench_engine.py).  How fast either pass is
is the benchmark's business; this checks the figures are there and consistent."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from _paths import REPO

from pipesplit.tools.bench.bench_pass_growth import main, parse_layers, slope, summarize

TOOL = os.path.join(str(REPO), "tools", "bench", "bench_pass_growth.py")


def test_slope_is_the_log_log_growth():
    assert slope([1, 2, 4, 8], [3, 6, 12, 24]) == pytest.approx(1.0)
    assert slope([1, 2, 4], [5, 20, 80]) == pytest.approx(2.0)


def test_summary_pairs_both_impls_per_layer_count():
    points = {n: {"paddle": {"pass_ms": 10.0 * n, "step_ms": 100.0 * n, "program_ops": 50 * n},
                  "pipesplit": {"pass_ms": 5.0 * n, "step_ms": 90.0 * n, "program_ops": 50 * n}}
              for n in (4, 8, 16)}
    summary = summarize(points)
    assert summary["layers"] == [4, 8, 16] and summary["program_ops"] == [200, 400, 800]
    assert summary["pass_ratio"] == [0.5, 0.5, 0.5]
    assert summary["impls"]["pipesplit"]["pass_slope_vs_ops"] == pytest.approx(1.0)


@pytest.mark.parametrize("argv,named", [
    (["--layers", "4"], "--layers needs two or more"),
    (["--layers", "4,7"], "--layers needs two or more even counts"),
    (["--layers", "4,x"], "--layers must be a comma list"),
    (["--steps", "1"], "--steps must be >= 2"),
])
def test_bad_input_is_refused_by_name(argv, named, capsys):
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def test_layers_are_sorted_once_each():
    assert parse_layers("8,4,8,16") == [4, 8, 16]


@pytest.mark.slow
def test_a_quick_run_reports_both_impls_at_every_layer_count(tmp_path):
    out, png = tmp_path / "growth.json", tmp_path / "growth.png"
    done = subprocess.run([sys.executable, TOOL, "--quick", "--layers", "2,4", "--steps", "2",
                           "--json", str(out), "--plot", str(png)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["layers"] == [2, 4] and report["program_ops"][1] > report["program_ops"][0]
    for impl in ("paddle", "pipesplit"):
        figures = report["impls"][impl]
        assert all(v > 0 for v in figures["pass_ms"] + figures["step_ms"])
        assert math.isfinite(figures["pass_slope_vs_ops"])
    assert "log-log slope" in done.stdout and png.stat().st_size > 0

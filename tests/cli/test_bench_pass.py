"""Smoke test of ``python -m pipesplit.tools.bench.bench_pass --quick``: runs, writes the keys, numbers
are finite.  (Timings themselves are not checked: 2 shared cores make them noisy.)"""
import json
import math
import subprocess
import sys

import pytest


def _finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.slow
def test_bench_pass_quick(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "pipesplit.tools.bench.bench_pass", "--quick",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(a) pass time" in proc.stdout and "(c) one training step" in proc.stdout
    r = json.loads(out.read_text())
    for key in ("ours_ms", "paddle_vpp_ms", "ratio", "per_op_us", "step_ratio"):
        assert key in r, key
    for key in ("ours_ms", "paddle_vpp_ms", "ratio", "step_ratio"):
        assert _finite(r[key]) and r[key] > 0, (key, r[key])
    assert isinstance(r["per_op_us"], list) and len(r["per_op_us"]) >= 2
    assert all(_finite(x) and x > 0 for x in r["per_op_us"])
    assert r["pass_time"]["paddle_error"] is None
    assert r["pass_time"]["ops"] > 0 and r["step"]["ours_jobs"] > 0

"""tools/bench/machine_noise.py: the noise floor table (a real run, short phases)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from _paths import REPO as _REPO

REPO = str(_REPO)
TOOL = os.path.join(REPO, "tools", "bench", "machine_noise.py")


def test_prints_both_phases_and_writes_them(tmp_path):
    out = tmp_path / "noise.json"
    proc = subprocess.run([sys.executable, TOOL, "--seconds", "0.5", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["processes"] for r in rows] == [1, os.cpu_count()]
    for r in rows:
        assert r["units"] >= r["processes"] and r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert 0 <= r["steal_ticks"] and r["iqr_ms"] >= 0
    assert f"all CPUs at once / alone: {report['slowdown']:.3f}" in proc.stdout


def test_bad_seconds_are_refused():
    proc = subprocess.run([sys.executable, TOOL, "--seconds", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--seconds must be > 0, got 0.0" in proc.stderr

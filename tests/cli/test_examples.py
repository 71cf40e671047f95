"""Every script under ``examples/`` that this file lists runs as a user runs it: a fresh
interpreter, from a folder outside the clone, exit status 0, and prints what its docstring
promises (each script itself compares its training with an unsplit run and fails otherwise)."""
import os
import subprocess
import sys

import pytest
from _paths import EXAMPLES as _EXAMPLES

EXAMPLES = str(_EXAMPLES)
EXPECTED = {
    "one_process_pass.py": ["ZBV pp=2 vpp=2 m=4", "loss (unsplit)",
                            "max parameter difference after 3 steps"],
    "custom_schedule_csv.py": ["MyEager1F1B pp=2 vpp=1 m=4", "time step 1 per column",
                               "max parameter difference to unsplit"],
}


def _run(script, *args, cwd):
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script, tmp_path):
    proc = _run(script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for text in EXPECTED[script]:
        assert text in proc.stdout, (text, proc.stdout[-2000:])
    assert "Traceback" not in proc.stderr


def test_custom_csv_example_reads_a_file_and_refuses_a_bad_order(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")  # 1F1B, pp=2, m=2
    proc = _run("custom_schedule_csv.py", str(good), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MyEager1F1B pp=2 vpp=1 m=2" in proc.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0B0,0F1,0B1\n1B0,1F0,1F1,1B1\n")  # rank 1 runs 1B0 before 1F0
    proc = _run("custom_schedule_csv.py", str(bad), cwd=tmp_path)
    assert proc.returncode == 2
    assert "1B0) comes before its 1F0" in proc.stderr and "Traceback" not in proc.stderr

"""A command in a process group of its own, killed whole on a timeout: the benchmarks'
launches (``subprocess.run``'s timeout killed the launcher alone, and its workers lived on,
orphaned, holding the CPUs)."""
from __future__ import annotations

import os
import signal
import subprocess


def run_in_own_group(cmd, env, cwd, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)`` whose ``timeout`` kills
    every process the command started (then raises ``subprocess.TimeoutExpired``)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

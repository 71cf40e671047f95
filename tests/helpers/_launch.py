"""Launching worker scripts under ``paddle.distributed.launch`` for the multi-process tests,
and reading their logs back rank by rank: a failing launch is reported with each rank's first
error line and its last lines, not a tail of the joined logs (whose last rank's traceback hides
the first rank's cause)."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

from _ledger import timed

#: a line that states an error: Python's ``XxxError: ...`` / ``XxxException``, Paddle's
#: ``(Unimplemented) ...`` and gloo's ``... raises an exception ...``
_ERROR_LINE = re.compile(r"(\b\w*(Error|Exception)\b\s*:|^\s*\(\w+\) |raises an exception)")
_LAST_LINES = 15


@dataclass
class Launch:
    """What a launch left: the launcher's exit status, its own output, each worker's log."""

    returncode: int
    output: str
    logs: List[Path]

    def worker_text(self) -> str:
        """Every worker's log, joined in rank order (for assertions on what they printed)."""
        return "".join(log.read_text(errors="replace") for log in self.logs)

    def report(self) -> str:
        """Each rank's first error line and last lines, then the launcher's last lines."""
        parts = []
        for log in self.logs:
            lines = log.read_text(errors="replace").splitlines()
            first = next((line.strip() for line in lines if _ERROR_LINE.search(line)), "none")
            parts.append(f"--- {log.parent.name}/{log.name}: first error: {first}\n" + "\n".join(
                lines[-_LAST_LINES:]))
        tail = "\n".join(self.output.splitlines()[-_LAST_LINES:])
        return "\n".join(parts + [f"--- launcher (exit {self.returncode}):\n{tail}"])


def _command(script: Path, args: Sequence, log_dir: Path, nproc: int,
             extra: Sequence[str] = ()) -> List[str]:
    return [sys.executable, "-m", "paddle.distributed.launch", *extra, "--nproc_per_node",
            str(nproc), "--log_dir", str(log_dir), str(script), *map(str, args)]


def _env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def launch(workdir: Path, script: Path, *args, nproc: int = 2, timeout: int = 1200) -> Launch:
    """``nproc`` processes of ``script args`` on this machine."""
    log_dir = workdir / "log"
    with timed(nproc):
        proc = subprocess.run(_command(script, args, log_dir, nproc), cwd=workdir,
                              capture_output=True, text=True, timeout=timeout, env=_env())
    return Launch(proc.returncode, proc.stdout + proc.stderr,
                  sorted(log_dir.glob("workerlog.*")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_nodes(workdir: Path, script: Path, *args, nodes: int = 2, nproc: int = 2,
                 timeout: int = 1200) -> Launch:
    """``nodes`` launchers on this machine joined as the nodes of one job (``--nnodes N
    --master 127.0.0.1:PORT``), ``nproc`` processes each, as users launch across machines."""
    master = f"127.0.0.1:{free_port()}"
    with timed(nodes * nproc, how=f"{nodes} launchers"):
        return _launch_nodes(workdir, script, args, nodes, nproc, timeout, master)


def _launch_nodes(workdir, script, args, nodes, nproc, timeout, master) -> Launch:
    procs = []
    for node in range(nodes):
        log_dir = workdir / f"node{node}"
        cmd = _command(script, args, log_dir, nproc, ["--nnodes", str(nodes), "--master", master])
        procs.append(subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=_env()))
    outputs, codes = [], []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
        outputs.append(out)
        codes.append(proc.returncode)
    logs = sorted(workdir.glob("node*/workerlog.*"))
    return Launch(max(codes, key=abs), "\n".join(outputs), logs)


def launch_for_json(workdir: Path, script: Path, *args, nproc: int = 2, timeout: int = 1200):
    """``script OUT.json *args`` launched on ``nproc`` processes; what it wrote to OUT.json (a
    failed launch fails the caller with each rank's first error)."""
    import json

    out = workdir / "out.json"
    done = launch(workdir, script, out, *args, nproc=nproc, timeout=timeout)
    assert done.returncode == 0, done.report()
    return json.loads(out.read_text())

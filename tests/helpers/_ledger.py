"""Where the multi-process tests' time goes: every launch of worker processes is written down
(the test that made it, how many processes, its seconds), and the session's end says how many
launches there were, their seconds by world size, and what one launch costs before any work
(a probe: the launcher, Paddle's import and the group's rendezvous in each process).

The controller names a folder in ``PIPESPLIT_LAUNCH_LEDGER`` before the xdist workers start
(they inherit it); each process appends one JSON line per launch to a file of its own there."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import List, Optional

ENV = "PIPESPLIT_LAUNCH_LEDGER"
PROBE = Path(__file__).resolve().parents[1] / "workers" / "launch_probe.py"


def open_ledger() -> Path:
    """A fresh folder for this session's launches, named in the environment."""
    folder = Path(tempfile.mkdtemp(prefix="pipesplit-launches-"))
    os.environ[ENV] = str(folder)
    return folder


def record(nproc: int, seconds: float, how: str = "launch") -> None:
    """One launch of ``nproc`` processes that took ``seconds`` (nothing outside a session)."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    line = json.dumps({"test": test, "nproc": nproc, "seconds": round(seconds, 2), "how": how})
    with open(Path(folder) / f"launches.{os.getpid()}.jsonl", "a") as f:
        f.write(line + "\n")


class timed:
    """``with timed(nproc): ...``: records the block as one launch of ``nproc`` processes."""

    def __init__(self, nproc: int, how: str = "launch"):
        self.nproc, self.how = nproc, how

    def __enter__(self):
        self.start = time.monotonic()
        return self

    def __exit__(self, *exc):
        record(self.nproc, time.monotonic() - self.start, self.how)
        return False


def read(folder: Path) -> List[dict]:
    return [json.loads(line) for path in sorted(folder.glob("launches.*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def probe_seconds(nproc: int = 2, timeout: int = 120) -> Optional[float]:
    """Seconds of one launch of ``nproc`` processes that only import Paddle and join the
    group (None if it failed)."""
    from _launch import _command  # (it imports this module)

    with tempfile.TemporaryDirectory(prefix="pipesplit-probe-") as work:
        start = time.monotonic()
        done = subprocess.run(_command(PROBE, (), Path(work) / "log", nproc), cwd=work,
                              capture_output=True, text=True, timeout=timeout)
        seconds = time.monotonic() - start
    return seconds if done.returncode == 0 else None


def summary_lines(folder: Path, slowest: int = 5) -> List[str]:
    """What the session's launches cost, for the terminal summary (empty: no launch)."""
    launches = read(folder)
    if not launches:
        return []
    by_world = defaultdict(list)
    for entry in launches:
        by_world[entry["nproc"]].append(entry["seconds"])
    total = sum(e["seconds"] for e in launches)
    lines = [f"{len(launches)} launches of worker processes, {total:.0f} s in all (the tests' "
             "wall time in them; xdist workers run them side by side)"]
    for nproc in sorted(by_world):
        seconds = by_world[nproc]
        lines.append(f"  {nproc} processes: {len(seconds)} launches, {sum(seconds):.0f} s")
    probe = probe_seconds()
    if probe is not None:
        lines.append(f"  start-up of one 2-process launch (launcher, Paddle's import, the group's "
                     f"rendezvous; measured now): {probe:.1f} s, about "
                     f"{probe * len(launches):.0f} s of the {total:.0f} s")
    lines.append("  slowest launches:")
    for entry in sorted(launches, key=lambda e: -e["seconds"])[:slowest]:
        lines.append(f"    {entry['seconds']:7.1f} s  {entry['nproc']} processes  {entry['test']}")
    return lines

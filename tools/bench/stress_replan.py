"""Stress check of ``auto``'s measured step and re-plan through the engine on a loaded machine
(not part of CI): ``--runs`` two-process launches of ``examples/llama_auto_parallel.py`` (a
Llama on 2-D stage meshes, ``auto`` and ``autoV`` in turn: step 1 is measured and the plan
rebuilt) while ``--load-jobs`` other two-process training jobs run beside them the whole time.

    python tools/bench/stress_replan.py --runs 10 --json stress.json

Per run it reports pass / fail, the wall time, each rank's re-plan phases (profiler start, the
waits at the rendezvous, the step, the exchange, the search and build: the line pipesplit
prints) and, for a failure, each rank's first error line; then the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "llama_auto_parallel.py"
LOAD = ROOT / "examples" / "auto_parallel_pipeline.py"
_PHASES = re.compile(r"pipesplit: rank (\d+) measured training step \d+ and re-planned: (.*)")
_ERROR = re.compile(r"\b\w*(Error|Exception)\b\s*:")


def _launch_cmd(script: Path, log_dir: Path, args) -> list:
    return [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
            "--log_dir", str(log_dir), str(script), *map(str, args)]


def _phases(log_dir: Path) -> dict:
    """rank -> {phase: seconds} from the line each rank prints after its re-plan."""
    out = {}
    for log in sorted(log_dir.glob("workerlog.*")):
        for match in _PHASES.finditer(log.read_text(errors="replace")):
            out[int(match.group(1))] = {k: float(v) for k, v in
                                        (part.rsplit(" ", 1) for part in
                                         match.group(2).split(", "))}
    return out


def _first_errors(log_dir: Path) -> dict:
    out = {}
    for log in sorted(log_dir.glob("workerlog.*")):
        lines = log.read_text(errors="replace").splitlines()
        out[log.name] = next((line.strip() for line in lines if _ERROR.search(line)), None)
    return out


class Load:
    """Another two-process training job beside the stress runs, restarted whenever it ends."""

    def __init__(self, work: Path, steps: int, name: str):
        self.work, self.steps, self.name, self.proc, self.started = work, steps, name, None, 0

    def keep_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.started += 1
            log_dir = self.work / f"{self.name}_{self.started}"
            self.proc = subprocess.Popen(
                _launch_cmd(LOAD, log_dir, ["--schedule", "1F1B", "-m", "8", "--steps",
                                            self.steps, "--tag", log_dir.name]),
                cwd=self.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def stress(runs: int, load_jobs: int, load_steps: int, timeout: int, work: Path) -> dict:
    loads_running = [Load(work, load_steps, f"load{j}") for j in range(load_jobs)]
    rows, loads = [], []
    try:
        for i in range(runs):
            for load in loads_running:
                load.keep_running()
            time.sleep(2)  # the load job is past its start-up, training
            schedule = ("auto", "autoV")[i % 2]
            log_dir = work / f"run{i}"
            started = time.monotonic()
            proc = subprocess.Popen(
                _launch_cmd(LLAMA, log_dir, ["--schedule", schedule, "--steps", 3, "--tag",
                                             f"stress{i}", "--json", work / f"run{i}.json"]),
                cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            samples = []
            while proc.poll() is None and time.monotonic() - started < timeout:
                samples.append(os.getloadavg()[0])
                for load in loads_running:
                    load.keep_running()
                time.sleep(1)
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            record_path = work / f"run{i}.json"
            record = json.loads(record_path.read_text()) if record_path.exists() else None
            ok = proc.returncode == 0 and record is not None \
                and record["max_loss_diff"] <= 1e-5 and record["max_param_diff"] <= 1e-5
            rows.append({"run": i, "schedule": schedule, "ok": ok, "returncode": proc.returncode,
                         "wall_s": round(time.monotonic() - started, 1),
                         "phases": _phases(log_dir),
                         "errors": None if ok else _first_errors(log_dir)})
            loads.extend(samples)
            print(_row_text(rows[-1]), flush=True)
    finally:
        for load in loads_running:
            load.stop()
    return {"runs": rows, "passed": sum(r["ok"] for r in rows), "of": runs,
            "load_average_1min": {"median": _median(loads), "max": max(loads, default=None)},
            "load_jobs": load_jobs,
            "load_jobs_started": sum(load.started for load in loads_running),
            "cpus": os.cpu_count()}


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def _row_text(row: dict) -> str:
    phases = "; ".join(f"rank {r}: " + ", ".join(f"{k} {v:.2f}" for k, v in p.items())
                       for r, p in sorted(row["phases"].items()))
    text = f"run {row['run']} {row['schedule']}: {'ok' if row['ok'] else 'FAILED'} " \
           f"({row['wall_s']} s) {phases}"
    if row["errors"]:
        text += "\n  " + "\n  ".join(f"{k}: {v}" for k, v in row["errors"].items())
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--load-jobs", type=int, default=1,
                   help="two-process training jobs running beside the stress runs")
    p.add_argument("--load-steps", type=int, default=300,
                   help="training steps of each load job (restarted when it ends)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per stress run")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    if args.load_jobs < 0:
        p.error(f"--load-jobs must be >= 0, got {args.load_jobs}")
    with tempfile.TemporaryDirectory(prefix="pipesplit_stress_") as work:
        report = stress(args.runs, args.load_jobs, args.load_steps, args.timeout, Path(work))
    print(f"{report['passed']} / {report['of']} passed; 1-minute load average median "
          f"{report['load_average_1min']['median']}, max {report['load_average_1min']['max']} "
          f"on {report['cpus']} CPUs; {report['load_jobs']} load job(s) beside, "
          f"{report['load_jobs_started']} started")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if report["passed"] == report["of"] else 1


if __name__ == "__main__":
    sys.exit(main())

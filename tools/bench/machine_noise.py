"""How steady this machine's CPUs are: the noise floor under every measured step time.

    python tools/bench/machine_noise.py [--seconds 10] [--json PATH]

A fixed unit of work (single-threaded float32 matmuls, about 30 ms) runs back to back for
``--seconds``, first in one process alone, then in one process per CPU at once (as the
benchmarks' ranks run: ``tools/bench/bench_multirank.py``, ``tools/bench/bench_engine.py``).  Printed per
phase: the unit's median, interquartile range (also as a share of the median), fastest and
slowest, and the CPU time the hypervisor took (``steal`` in ``/proc/stat``).  Two schedules
whose steps differ by less than the IQR share cannot be ranked from a handful of steps; the
slowdown of "all CPUs" against "alone" is what profiling one rank while the other idles
would miss.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from typing import List

UNIT_MATMULS = 60
#: units each process measures however short the phase (the IQR needs two)
MIN_UNITS = 2
SIZE = 256


def _steal_ticks() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def _units(seconds: float, out) -> None:
    """Unit times (ms) for ``seconds``, at least :data:`MIN_UNITS` of them, put on ``out``
    (one compute thread)."""
    import numpy as np

    a = np.random.default_rng(0).random((SIZE, SIZE), dtype=np.float32)
    times: List[float] = []
    end = time.monotonic() + seconds
    # (a process started late on a loaded machine still measures: quantiles need two points)
    while len(times) < MIN_UNITS or time.monotonic() < end:
        t0 = time.perf_counter()
        for _ in range(UNIT_MATMULS):
            a @ a
        times.append((time.perf_counter() - t0) * 1e3)
    out.put(times)


def phase(processes: int, seconds: float) -> dict:
    """Every process's unit times, run at once; with the steal ticks over the phase."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_units, args=(seconds, queue)) for _ in range(processes)]
    steal = _steal_ticks()
    for w in workers:
        w.start()
    times = [t for _ in workers for t in queue.get()]
    for w in workers:
        w.join()
    q1, _, q3 = statistics.quantiles(times, n=4)
    median = statistics.median(times)
    return {"processes": processes, "units": len(times), "median_ms": median,
            "iqr_ms": q3 - q1, "iqr_share": (q3 - q1) / median, "min_ms": min(times),
            "max_ms": max(times), "steal_ticks": _steal_ticks() - steal,
            "ticks": int(seconds * os.sysconf("SC_CLK_TCK")) * processes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools/bench/machine_noise.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="per phase")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if not args.seconds > 0:
        p.error(f"--seconds must be > 0, got {args.seconds}")
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows = [phase(1, args.seconds), phase(os.cpu_count() or 1, args.seconds)]
    print(f"{UNIT_MATMULS} matmuls {SIZE}x{SIZE} float32 per unit, one thread per process, "
          f"{args.seconds:g} s per phase")
    print(f"{'processes':>9}  {'units':>5}  {'median ms':>9}  {'IQR ms':>6}  {'IQR/median':>10}  "
          f"{'min ms':>6}  {'max ms':>6}  steal")
    for r in rows:
        print(f"{r['processes']:>9}  {r['units']:>5}  {r['median_ms']:>9.2f}  {r['iqr_ms']:>6.2f}  "
              f"{r['iqr_share']:>10.1%}  {r['min_ms']:>6.2f}  {r['max_ms']:>6.2f}  "
              f"{r['steal_ticks']}/{r['ticks']} ticks")
    slowdown = rows[1]["median_ms"] / rows[0]["median_ms"]
    print(f"all CPUs at once / alone: {slowdown:.3f} (median unit)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "slowdown": slowdown}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

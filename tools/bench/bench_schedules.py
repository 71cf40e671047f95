"""Simulated comparison of every registered schedule over a grid of configurations.

    python -m pipesplit.tools.bench.bench_schedules [--json PATH] [--schedules 1F1B,VPP,...]
                                              [--pp 2,4,8] [--vpp 1,2,4] [--validate]

Grid: pp in {2, 4, 8}, vpp in {1, 2, 4}, m in {pp, pp+1, 2pp, 2pp+2, 4pp}, and three cost models
``tF,tB,tI,tW[,comm]``: 1,2,1,1 / 1,1,.5,.5 / 1,2,1,1 with comm 0.1.  Schedules that split the
backward themselves (``spec.splits_backward``, the W-filling zero-bubble family) run split;
classic ones run as they are.  Per row: makespan, makespan / lower bound, bubble ratio and peak
activation memory (max over ranks), beside the closed form ``(m*v + p - 1)(tF + tB)``
(GPipe / 1F1B for v = 1, interleaved for v > 1; communication-free) and
:func:`~pipesplit.job_list.bounds.lower_bound`.  Ends with the best schedule per configuration.
Pure Python (no paddle); the full grid runs in well under two minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

from pipesplit.job_list.text import text_table
from pipesplit.tools._console import Progress, add_quiet_option, prepare_output, quiet_pipe_main

COST_MODELS = (
    ("1,2,1,1", (1.0, 2.0, 1.0, 1.0), 0.0),
    ("1,1,.5,.5", (1.0, 1.0, 0.5, 0.5), 0.0),
    ("1,2,1,1 c=.1", (1.0, 2.0, 1.0, 1.0), 0.1),
)
PP_VALUES = (2, 4, 8)
#: the report's name columns (cost model, schedule), aligned left; the numbers right
_NAMES = (3, 4)
VPP_VALUES = (1, 2, 4)


def m_values(pp: int) -> List[int]:
    return [pp, pp + 1, 2 * pp, 2 * pp + 2, 4 * pp]


def closed_form(pp: int, vpp: int, m: int, t_f: float, t_b: float) -> float:
    """(m*v + p - 1)(tF + tB): GPipe / 1F1B makespan for v = 1, interleaved 1F1B for v > 1."""
    return (m * vpp + pp - 1) * (t_f + t_b)


def _config_rows(names: Sequence[str], pp: int, vpp: int, m: int,
                 validate_each: bool) -> List[dict]:
    """Rows of every schedule and cost model for one (pp, vpp, m); runs in a worker process."""
    from pipesplit.job_list import build_schedule, get_spec
    from pipesplit.job_list.bounds import lower_bound
    from pipesplit.job_list.simulate import Costs, simulate
    from pipesplit.job_list.validate import validate
    from pipesplit.tools.cli import accepts, load_schedules

    load_schedules()  # idempotent; needed when workers are spawned rather than forked
    rows = []
    for cost_name, (t_f, t_b, t_i, t_w), comm in COST_MODELS:
        costs = Costs(t_f, t_b, t_i, t_w, comm=comm)
        bound = lower_bound(pp, vpp, m, costs)
        closed = closed_form(pp, vpp, m, t_f, t_b)
        for name in names:
            spec = get_spec(name)
            row = {"pp": pp, "vpp": vpp, "m": m, "cost": cost_name, "comm": comm,
                   "schedule": spec.name, "split_backward": spec.splits_backward,
                   "lower_bound": bound, "closed_form": closed}
            options = {"costs": costs} if accepts(spec.generator, "costs") else {}
            started = time.perf_counter()
            try:
                schedule = build_schedule(spec.name, pp, vpp, m,
                                          split_backward=spec.splits_backward, **options)
                if validate_each:
                    validate(schedule)
                sim = simulate(schedule, costs)
            except ValueError as exc:  # the config is not served (or deadlocks)
                row["error"] = " ".join(str(exc).split())
                rows.append(row)
                continue
            row.update(makespan=sim.makespan, ratio=sim.makespan / bound,
                       bubble=sim.bubble_ratio, peak_memory=sim.max_peak_memory,
                       seconds=time.perf_counter() - started)
            rows.append(row)
    return rows


def run(schedules: Optional[Sequence[str]] = None, pps: Sequence[int] = PP_VALUES,
        vpps: Sequence[int] = VPP_VALUES, validate_each: bool = False,
        jobs: Optional[int] = None, progress=None) -> List[dict]:
    """One dict per (config, schedule); refused configs carry ``error`` instead of numbers.

    ``jobs`` worker processes share the configurations (default: the CPU count, at most 8;
    1 runs in this process).  ``progress`` (a :class:`~pipesplit.tools._console.Progress`)
    hears of every finished configuration."""
    from pipesplit.job_list import get_spec, schedule_names
    from pipesplit.tools.cli import load_schedules

    load_schedules()
    names = [get_spec(n).name for n in schedules] if schedules else schedule_names()
    configs = [(pp, vpp, m) for pp in pps for vpp in vpps for m in m_values(pp)]
    jobs = min(8, os.cpu_count() or 1) if jobs is None else jobs
    if progress is not None:
        progress.total = len(configs)

    def done(pp, vpp, m):
        if progress is not None:
            progress.step(f"pp={pp} vpp={vpp} m={m}")

    if jobs <= 1 or len(configs) == 1:
        chunks = []
        for c in configs:
            chunks.append(_config_rows(names, *c, validate_each))
            done(*c)
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # biggest configs first so the pool ends evenly
        order = sorted(range(len(configs)), key=lambda i: -configs[i][0] * configs[i][1] * configs[i][2])
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {i: pool.submit(_config_rows, names, *configs[i], validate_each) for i in order}
            index = {future: i for i, future in futures.items()}
            for future in as_completed(index):
                done(*configs[index[future]])
            chunks = [futures[i].result() for i in range(len(configs))]
    return [row for chunk in chunks for row in chunk]


def best_per_config(rows: Sequence[dict]) -> List[dict]:
    """The fastest schedule per (pp, vpp, m, cost); ties go to the lower peak memory."""
    best: Dict[tuple, dict] = {}
    for row in rows:
        if "error" in row:
            continue
        key = (row["pp"], row["vpp"], row["m"], row["cost"])
        rank = (round(row["makespan"], 9), row["peak_memory"])
        if key not in best or rank < (round(best[key]["makespan"], 9), best[key]["peak_memory"]):
            best[key] = row
    return list(best.values())


def report(rows: Sequence[dict]) -> str:
    g = "{:.4g}".format
    lines = [("pp", "vpp", "m", "cost", "schedule", "makespan", "/LB", "bubble", "peak mem",
              "closed", "LB")]
    for r in rows:
        head = (str(r["pp"]), str(r["vpp"]), str(r["m"]), r["cost"],
                r["schedule"] + (" (split)" if r["split_backward"] else ""))
        if "error" in r:
            reason = r["error"] if len(r["error"]) <= 60 else r["error"][:57] + "..."
            lines.append(head + (f"refused: {reason}", "", "", "", "", ""))
            continue
        lines.append(head + (g(r["makespan"]), f"{r['ratio']:.3f}", f"{r['bubble']:.1%}",
                             g(r["peak_memory"]), g(r["closed_form"]), g(r["lower_bound"])))
    best = best_per_config(rows)
    summary = [("pp", "vpp", "m", "cost", "best", "makespan", "/LB", "bubble", "peak mem")]
    for r in best:
        summary.append((str(r["pp"]), str(r["vpp"]), str(r["m"]), r["cost"], r["schedule"],
                        g(r["makespan"]), f"{r['ratio']:.3f}", f"{r['bubble']:.1%}",
                        g(r["peak_memory"])))
    wins: Dict[str, int] = {}
    for r in best:
        wins[r["schedule"]] = wins.get(r["schedule"], 0) + 1
    return "\n".join([
        "All schedules (closed = (m*v+p-1)(tF+tB), GPipe/1F1B for v=1, interleaved for v>1; "
        "LB = simulate.lower_bound)",
        text_table(lines, left=_NAMES), "",
        "Best schedule per configuration (ties: lower peak memory)",
        text_table(summary, left=_NAMES), "",
        "wins: " + ", ".join(f"{n} {k}" for n, k in sorted(wins.items(), key=lambda x: -x[1])),
    ])


def _int_list(text: str) -> List[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected ints >= 1, got {text!r}")
    return values


@quiet_pipe_main
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipesplit.tools.bench.bench_schedules",
                                     description=__doc__.strip().splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write every row as JSON")
    parser.add_argument("--schedules", nargs="+", metavar="NAME",
                        help="schedule names (space- or comma-separated; default: all registered)")
    parser.add_argument("--pp", type=_int_list, default=list(PP_VALUES), help="default 2,4,8")
    parser.add_argument("--vpp", type=_int_list, default=list(VPP_VALUES), help="default 1,2,4")
    parser.add_argument("--validate", action="store_true", help="also validate every schedule")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help="worker processes (default: CPU count, at most 8; 1 = serial)")
    add_quiet_option(parser)
    args = parser.parse_args(argv)
    names = [n for item in args.schedules or [] for n in item.split(",") if n.strip()] or None
    started = time.perf_counter()
    try:
        prepare_output(args.json, "--json")
        rows = run(names, args.pp, args.vpp, args.validate, args.jobs,
                   progress=Progress("bench_schedules", quiet=args.quiet))
    except ValueError as exc:  # unknown schedule name, bad --json path
        print(f"bench_schedules: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(report(rows))
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cost_models": [{"name": n, "tF": c[0], "tB": c[1], "tI": c[2], "tW": c[3],
                                        "comm": comm} for n, c, comm in COST_MODELS],
                       "rows": rows, "best": best_per_config(rows)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

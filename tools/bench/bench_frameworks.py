"""pipesplit's best schedule versus the best PyTorch / Paddle schedule, in pipesplit's simulator.

    python -m pipesplit.tools.bench.bench_frameworks [--pp 2,4,8] [--vpp 1,2,4] [--always-auto]

Grid: pp in {2,4,8}, vpp in {1,2,4}, m in {pp, pp+1, 2pp, 2pp+2, 4pp}; cost models (tF,tB,tI,tW)
(1,2,1,1), (1,1,.5,.5) and (1,2,1,1) with p2p latency c = 0.1 (as ``bench_schedules``).

References: the committed orders under ``tools/bench/reference_orders/`` (see its README) -- PyTorch
2.13's schedule classes and Paddle 3.3.1's scheduler passes, dumped as CSV; no torch is needed
here.  Each is validated (an order that deadlocks is recorded as such) and simulated; a
framework's best is its fastest valid schedule for the configuration (least peak on ties).

pipesplit: every registered fixed schedule (zero-bubble ones split, classic ones as they are) and,
when none of them is at least as fast as the reference within the reference's peak, ``auto`` /
``autoV`` searched with ``memory_limit`` = the reference's peak (``--always-auto``: always).
A row compares pipesplit's fastest schedule whose peak is <= the reference's peak.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from pipesplit.job_list import build_schedule, get_spec, schedule_names
from pipesplit.job_list.auto import auto_search
from pipesplit.job_list.placement import LOOPED, V_SHAPE
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.validate import ScheduleError, validate
from pipesplit.job_list.views import from_csv

REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_orders")
EPS = 1e-9
#: (label, costs, tag used in Paddle ZBVPP file names)
COST_MODELS = (
    ("1,2,1,1", Costs(1.0, 2.0, 1.0, 1.0), "1-2-1-1"),
    ("1,1,.5,.5", Costs(1.0, 1.0, 0.5, 0.5), "1-1-.5-.5"),
    ("1,2,1,1 c=.1", Costs(1.0, 2.0, 1.0, 1.0, comm=0.1), "1-2-1-1-c.1"),
)
PP_VALUES = (2, 4, 8)
VPP_VALUES = (1, 2, 4)
#: reference schedule name -> placement of its stages
V_PLACED = {"ZBVZeroBubble", "DualPipeV", "ZBVPP"}
FRAMEWORKS = ("torch", "paddle")


def grid_ms(pp: int) -> List[int]:
    return sorted({pp, pp + 1, 2 * pp, 2 * pp + 2, 4 * pp})


@dataclass
class Measured:
    name: str
    makespan: float
    peak: float
    error: str = ""          # non-empty: invalid / deadlocked order


def reference_files(framework: str, pp: int, vpp: int, m: int, cost_tag: str) -> Dict[str, str]:
    """name -> CSV path of every reference order for the configuration (and cost model)."""
    folder = os.path.join(REFERENCE_DIR, framework)
    suffix = f"_pp{pp}_v{vpp}_m{m}.csv"
    out = {}
    for file in sorted(os.listdir(folder)):
        if not file.endswith(suffix):
            continue
        name = file[: -len(suffix)]
        if name.startswith("ZBVPP_"):
            if name != f"ZBVPP_{cost_tag}":
                continue
            name = "ZBVPP"
        out[name] = os.path.join(folder, file)
    return out


def measure_reference(path: str, name: str, pp: int, vpp: int, m: int, costs: Costs) -> Measured:
    with open(path) as f:
        text = f.read()
    placement = V_SHAPE if name in V_PLACED else LOOPED
    try:
        schedule = from_csv(text, pp=pp, vpp=vpp, m=m, placement=placement, name=name)
        validate(schedule)
    except (ScheduleError, ValueError) as exc:
        return Measured(name, float("inf"), float("inf"), str(exc).splitlines()[0][:160])
    result = simulate(schedule, costs)
    return Measured(name, result.makespan, result.max_peak_memory)


def best_of(items: Sequence[Measured]) -> Optional[Measured]:
    valid = [x for x in items if not x.error]
    return min(valid, key=lambda x: (x.makespan, x.peak)) if valid else None


def pipesplit_fixed(pp: int, vpp: int, m: int, costs: Costs) -> List[Measured]:
    out = []
    for name in schedule_names():
        spec = get_spec(name)
        if spec.searches:
            continue
        try:
            schedule = build_schedule(name, pp, vpp, m)
        except ValueError:
            continue
        result = simulate(schedule, costs)
        out.append(Measured(name + ("" if spec.placement == LOOPED else "@v"), result.makespan,
                            result.max_peak_memory))
    return out


def pipesplit_best(fixed: Sequence[Measured], ref: Measured, pp: int, vpp: int, m: int,
                   costs: Costs, always_auto: bool) -> Tuple[Optional[Measured], float]:
    """pipesplit's fastest schedule within ``ref``'s peak, and the auto search time spent."""
    fitting = [x for x in fixed if x.peak <= ref.peak + EPS]
    best = best_of(fitting)
    seconds = 0.0
    if always_auto or best is None or best.makespan > ref.makespan + EPS:
        began = time.perf_counter()
        res = auto_search(pp, vpp, m, costs, ref.peak, (LOOPED, V_SHAPE))
        seconds = time.perf_counter() - began
        found = Measured("auto" if res.placement == LOOPED else "autoV", res.makespan, res.peak)
        if best is None or (found.makespan, found.peak) < (best.makespan - EPS, best.peak):
            best = found
    return best, seconds


def run(pps: Sequence[int] = PP_VALUES, vpps: Sequence[int] = VPP_VALUES,
        always_auto: bool = False, out=sys.stdout) -> dict:
    """Print the tables; return {(framework, cost label): {"win": n, "tie": n, "loss": n,
    "none": n, "rows": [...], "invalid": [...]}} ."""
    summary = {}
    worst_auto = 0.0
    for label, costs, tag in COST_MODELS:
        for framework in FRAMEWORKS:
            stats = {"win": 0, "tie": 0, "loss": 0, "none": 0, "rows": [], "invalid": []}
            print(f"\n== {framework} vs pipesplit, costs {label} ==", file=out)
            print(f"{'pp':>3} {'vpp':>3} {'m':>3}  {'reference best':>28} {'peak':>5}  "
                  f"{'pipesplit best':>28} {'peak':>5} {'gain%':>6}  result", file=out)
            for pp in pps:
                for vpp in vpps:
                    fixed = None
                    for m in grid_ms(pp):
                        refs = [measure_reference(path, name, pp, vpp, m, costs) for name, path
                                in reference_files(framework, pp, vpp, m, tag).items()]
                        stats["invalid"] += [(pp, vpp, m, r.name, r.error) for r in refs if r.error]
                        ref = best_of(refs)
                        if ref is None:
                            stats["none"] += 1
                            print(f"{pp:3d} {vpp:3d} {m:3d}  {'(no valid schedule)':>28}", file=out)
                            continue
                        fixed = pipesplit_fixed(pp, vpp, m, costs)
                        ours, seconds = pipesplit_best(fixed, ref, pp, vpp, m, costs, always_auto)
                        worst_auto = max(worst_auto, seconds)
                        if ours.makespan < ref.makespan - EPS:
                            verdict = "win"
                        elif ours.makespan <= ref.makespan + EPS:
                            verdict = "tie"
                        else:
                            verdict = "loss"
                        stats[verdict] += 1
                        stats["rows"].append((pp, vpp, m, ref, ours, verdict))
                        gain = 100.0 * (ref.makespan - ours.makespan) / ref.makespan
                        print(f"{pp:3d} {vpp:3d} {m:3d}  {ref.name + '=' + format(ref.makespan, '.2f'):>28}"
                              f" {ref.peak:5.1f}  {ours.name + '=' + format(ours.makespan, '.2f'):>28}"
                              f" {ours.peak:5.1f} {gain:6.1f}  {verdict}", file=out)
            print(f"pipesplit vs {framework} ({label}): {stats['win']} faster, {stats['tie']} equal, "
                  f"{stats['loss']} slower; {stats['none']} configs without a valid {framework} "
                  f"schedule", file=out)
            for pp, vpp, m, name, error in stats["invalid"]:
                print(f"  invalid {framework} order {name} pp={pp} vpp={vpp} m={m}: {error}", file=out)
            summary[(framework, label)] = stats
    print(f"\nslowest auto search: {worst_auto:.2f} s", file=out)
    return summary


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", default="2,4,8")
    parser.add_argument("--vpp", default="1,2,4")
    parser.add_argument("--always-auto", action="store_true",
                        help="also search auto / autoV when a fixed schedule already ties")
    args = parser.parse_args(argv)
    summary = run(_ints(args.pp), _ints(args.vpp), args.always_auto)
    return 1 if any(s["loss"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the ``auto`` / ``autoV`` search against the best fixed schedule.

    python -m pipesplit.tools.bench.bench_auto [--pp 2,4,8] [--vpp 1,2,4] [--placement looped|v|both]

For each cost model (c = 0.1 with (tF,tI,tW) = (1,1,1); and unequal costs (1,1.5,0.5), c = 0) and
each grid point pp x vpp x m (m in pp, pp+1, 2pp, 2pp+2, 4pp) it prints the best fixed schedule
of the same placement whose simulated peak fits the memory limit (default: 1F1B's peak,
``min(pp, m) * vpp`` units), the auto result, :func:`memory_lower_bound` (where the fixed
schedule meets it, no schedule can beat it), its peak and source, and the search time.
Configurations where no fixed schedule fits the limit are counted apart, not as wins.

    python -m pipesplit.tools.bench.bench_auto --split-grid

instead compares ``auto`` / ``autoV`` with every registered schedule of the placement, split and
unsplit (``name/B``), for the profiled cost files under ``tests/data`` (``pipesplit profile``;
there tI + tW is 1.1-2.2x tB) and the three cost models of ``bench_frameworks``: the best
registered makespan at no more peak than auto's, auto's, the split pattern auto chose (``B``:
no stage split, ``split``: every stage, ``split{...}``: those stages) and the search time.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

from pipesplit.job_list.auto import auto_search, default_memory_limit
from pipesplit.job_list.placement import LOOPED, V_SHAPE
from pipesplit.job_list.simulate import Costs

COST_MODELS = (
    ("c=0.1", Costs(1.0, None, 1.0, 1.0, comm=0.1)),
    ("tF=1,tI=1.5,tW=0.5", Costs(1.0, None, 1.5, 0.5)),
)


def grid_ms(pp: int) -> List[int]:
    return sorted({pp, pp + 1, 2 * pp, 2 * pp + 2, 4 * pp})


def _ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run(pps: Sequence[int], vpps: Sequence[int], placements: Sequence[str],
        memory_limit: Optional[float] = None, out=sys.stdout) -> dict:
    """Print the tables; return {cost label: counts} with keys ``faster`` / ``equal`` (auto vs
    the best fitting fixed schedule), ``optimal`` (of the equal ones, the fixed schedule already
    meets :func:`memory_lower_bound`, so nothing can beat it), ``no_fixed`` (no fixed schedule
    fits the limit: reported apart, not as wins), ``total`` and ``max_seconds``."""
    summary = {}
    for label, costs in COST_MODELS:
        print(f"\n== costs {label} ==", file=out)
        print(f"{'placement':9} {'pp':>3} {'vpp':>3} {'m':>3} {'limit':>6} {'best fixed':>22} "
              f"{'auto':>8} {'bound':>8} {'peak':>5} {'gain%':>6} {'time s':>7}  source", file=out)
        counts = dict(faster=0, equal=0, optimal=0, no_fixed=0, total=0, max_seconds=0.0)
        for placement in placements:
            for pp in pps:
                for vpp in vpps:
                    if placement == V_SHAPE and vpp % 2:
                        continue
                    for m in grid_ms(pp):
                        limit = memory_limit if memory_limit is not None else \
                            default_memory_limit(pp, vpp, m)
                        res = auto_search(pp, vpp, m, costs, limit, (placement,))
                        counts["total"] += 1
                        counts["max_seconds"] = max(counts["max_seconds"], res.search_seconds)
                        gain = 0.0
                        if res.baseline is None:
                            counts["no_fixed"] += 1
                            fixed, verdict = "-", "no fixed fits"
                        else:
                            fixed = f"{res.baseline}={res.baseline_makespan:.2f}"
                            gain = 100.0 * (res.baseline_makespan - res.makespan) / res.baseline_makespan
                            if res.makespan < res.baseline_makespan - 1e-9:
                                counts["faster"] += 1
                                verdict = "faster"
                            elif res.baseline_makespan <= res.bound + 1e-9:
                                counts["equal"] += 1
                                counts["optimal"] += 1
                                verdict = "fixed optimal"
                            else:
                                counts["equal"] += 1
                                verdict = "equal"
                        print(f"{placement:9} {pp:3d} {vpp:3d} {m:3d} {limit:6.1f} {fixed:>22} "
                              f"{res.makespan:8.2f} {res.bound:8.2f} {res.peak:5.1f} {gain:6.1f} "
                              f"{res.search_seconds:7.2f}  {verdict}; {res.source}", file=out)
        fitted = counts["total"] - counts["no_fixed"]
        print(f"auto strictly faster than the best fitting fixed schedule on {counts['faster']}/"
              f"{fitted} configs where one fits (equal on {counts['equal']}, of which the fixed "
              f"schedule meets the memory lower bound on {counts['optimal']}); no fixed schedule "
              f"fits the limit on {counts['no_fixed']} more; slowest search "
              f"{counts['max_seconds']:.2f} s", file=out)
        summary[label] = counts
    return summary


#: the repository's profiled cost files (a source checkout; pass --costs-dir otherwise)
PROFILED_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests", "data")


def profiled_costs(cost_dir: str) -> List[tuple]:
    """(label, Costs) of every profiled cost file (``profiled_*.json``) in ``cost_dir``."""
    if not os.path.isdir(cost_dir):
        raise ValueError(f"costs dir {cost_dir!r} is not a directory (profiled_*.json files "
                         "from `pipesplit profile --json`)")
    return [(name[len("profiled_"):-len(".json")], Costs.load(os.path.join(cost_dir, name)))
            for name in sorted(os.listdir(cost_dir))
            if name.startswith("profiled_") and name.endswith(".json")]


def _pattern(schedule) -> str:
    from pipesplit.job_list.auto import split_stages_of
    split = split_stages_of(schedule)
    if not split:
        return "B"
    if len(split) == schedule.num_stages:
        return "split"
    return "split{" + ",".join(map(str, sorted(split))) + "}"


def run_split_grid(cost_dir: str = PROFILED_DIR, out=sys.stdout) -> dict:
    """Print auto vs the best registered schedule (split or not) at no more memory; return
    {"rows": n, "slower": n (must be 0), "max_seconds": s, "patterns": {pattern: n}}."""
    import time
    from pipesplit.job_list import build_schedule
    from pipesplit.job_list.auto import AUTO_NAMES, fixed_candidates
    from pipesplit.job_list.simulate import simulate
    from pipesplit.tools.bench.bench_frameworks import COST_MODELS as FRAMEWORK_MODELS
    models = profiled_costs(cost_dir) + [(label, costs) for label, costs, _ in FRAMEWORK_MODELS]
    summary = {"rows": 0, "slower": 0, "max_seconds": 0.0, "patterns": {}}
    print(f"{'costs':22} {'sched':6} {'pp':>3} {'vpp':>3} {'m':>3} {'best registered':>22} "
          f"{'auto':>8} {'gain%':>6} {'pattern':>12} {'time s':>7}", file=out)
    for label, costs in models:
        for pp in (2, 4):
            for vpp in (1, 2):
                stages = pp * vpp
                if any(isinstance(getattr(costs, f), (list, tuple)) and
                       len(getattr(costs, f)) != stages
                       for f in ("forward", "backward_b", "backward_w")):
                    continue
                for name, placement in zip(AUTO_NAMES, (LOOPED, V_SHAPE)):
                    if placement == V_SHAPE and vpp % 2:
                        continue
                    for m in (pp, 2 * pp, 4 * pp):
                        began = time.perf_counter()
                        mine = build_schedule(name, pp, vpp, m, costs=costs)
                        seconds = time.perf_counter() - began
                        sim = simulate(mine, costs)
                        fits = [(span, lab) for lab, _, span, peak in
                                fixed_candidates(pp, vpp, m, placement, costs)
                                if max(peak) <= sim.max_peak_memory + 1e-9]
                        best = min(fits) if fits else None
                        gain = 100.0 * (best[0] - sim.makespan) / best[0] if best else 0.0
                        pattern = _pattern(mine)
                        summary["rows"] += 1
                        summary["slower"] += bool(best and sim.makespan > best[0] + 1e-9)
                        summary["max_seconds"] = max(summary["max_seconds"], seconds)
                        kind = "mixed" if "{" in pattern else pattern
                        summary["patterns"][kind] = summary["patterns"].get(kind, 0) + 1
                        shown = f"{best[1]}={best[0]:.4g}" if best else "-"
                        print(f"{label:22} {name:6} {pp:3d} {vpp:3d} {m:3d} {shown:>22} "
                              f"{sim.makespan:8.4g} {gain:6.1f} {pattern:>12} {seconds:7.2f}",
                              file=out)
    print(f"{summary['rows']} configurations; auto slower than a registered schedule at no more "
          f"memory on {summary['slower']}; patterns chosen {summary['patterns']}; slowest "
          f"search {summary['max_seconds']:.2f} s", file=out)
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", default="2,4,8")
    parser.add_argument("--vpp", default="1,2,4")
    parser.add_argument("--placement", default="both", choices=("looped", "v", "both"))
    parser.add_argument("--memory-limit", type=float, default=None)
    parser.add_argument("--split-grid", action="store_true",
                        help="auto vs every registered schedule, split or not, on profiled costs")
    parser.add_argument("--costs-dir", default=PROFILED_DIR,
                        help="profiled_*.json cost files for --split-grid (default tests/data)")
    args = parser.parse_args(argv)
    if args.split_grid:
        return 1 if run_split_grid(args.costs_dir)["slower"] else 0
    placements = {"looped": (LOOPED,), "v": (V_SHAPE,), "both": (LOOPED, V_SHAPE)}[args.placement]
    run(_ints(args.pp), _ints(args.vpp), placements, args.memory_limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How the pipeline pass and the step grow with the model: Paddle's passes and pipesplit's
through the engine at 4, 8, 16 and 32 layers, in one run.

    python tools/bench/bench_pass_growth.py [--layers 4,8,16,32] [--schedule 1F1B] [-m 4]
        [--hidden 128] [--steps 4] [--json PATH] [--plot PATH] [--quick]

For each layer count, one launch of ``tools/bench/bench_engine.py`` (two CPU processes; the
GPT example at its compute-bound sizes, ``--hidden`` smaller so 32 layers step in seconds)
with ``--schedules SCHEDULE``: Paddle's pass and pipesplit's on the same model, same batches,
stepped in turn.  Per layer count and impl: the pass time (``pass_ms``: to_static's pipeline
pass and pipesplit's strategy check, one preparation each, see bench_engine's doc), the median
step and the ops of the program the pass splits (pipesplit's ``source_program``).  The growth
is the log-log slope of pass time against ops (1: linear), fitted by least squares over the
layer counts; ``--plot`` draws both impls' pass and step times against the layers.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_engine.py")
DEFAULT_LAYERS = "4,8,16,32"
#: the launch's limit per layer count (32 layers build and step in a few minutes on 2 cores)
LAUNCH_TIMEOUT_S = 1800


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tools/bench/bench_pass_growth.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--layers", default=DEFAULT_LAYERS, help="comma list of layer counts")
    p.add_argument("--schedule", default="1F1B", choices=("FThenB", "1F1B"),
                   help="a schedule both impls serve")
    p.add_argument("-m", type=int, default=4, help="micro-batches per step")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--steps", type=int, default=4, help="timed steps per engine")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plot", metavar="PATH", help="a PNG of pass and step time per layers")
    p.add_argument("--quick", action="store_true",
                   help="bench_engine's tiny sizes (tests; --hidden not used)")
    return p


def parse_layers(text: str) -> List[int]:
    try:
        layers = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--layers must be a comma list of integers, got {text!r}") from None
    if len(layers) < 2 or any(n < 2 or n % 2 for n in layers):
        raise ValueError(f"--layers needs two or more even counts (pp 2), got {text!r}")
    return layers


def run_one(args, layers: int) -> Dict[str, dict]:
    """impl -> {pass_ms, step_ms, program_ops} at ``layers`` (one bench_engine launch)."""
    with tempfile.TemporaryDirectory(prefix="pipesplit-growth-") as work:
        out = os.path.join(work, "out.json")
        size = ["--quick"] if args.quick else ["--hidden", str(args.hidden)]
        cmd = [sys.executable, TOOL, "--layers", str(layers), *size, "--schedules", args.schedule,
               "-m", str(args.m), "--steps", str(args.steps), "--warmup", "2", "--budget-s", "0",
               "--profiled-steps", "2", "--json", out]
        env = dict(os.environ, GLOG_minloglevel="2")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                              env=env)
        if done.returncode != 0:
            raise RuntimeError(f"bench_engine at {layers} layers exited {done.returncode}:\n"
                               f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        with open(out) as f:
            rows = json.load(f)["rows"]
    ops = next(max(r["program_ops"]) for r in rows if r["impl"] == "pipesplit")
    return {r["impl"]: {"pass_ms": r["pass_ms"], "step_ms": r["step_ms"], "program_ops": ops}
            for r in rows}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) on log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def summarize(points: Dict[int, Dict[str, dict]]) -> dict:
    layers = sorted(points)
    ops = [points[n]["pipesplit"]["program_ops"] for n in layers]
    out = {"layers": layers, "program_ops": ops, "impls": {}}
    for impl in ("paddle", "pipesplit"):
        passes = [points[n][impl]["pass_ms"] for n in layers]
        steps = [points[n][impl]["step_ms"] for n in layers]
        out["impls"][impl] = {"pass_ms": passes, "step_ms": steps,
                              "pass_slope_vs_ops": slope(ops, passes)}
    out["pass_ratio"] = [p / q for p, q in zip(out["impls"]["pipesplit"]["pass_ms"],
                                               out["impls"]["paddle"]["pass_ms"])]
    return out


def format_summary(summary: dict, schedule: str) -> str:
    lines = [f"{'layers':>6}  {'ops':>6}  {'Paddle pass ms':>14}  {'pipesplit pass ms':>17}  "
             f"{'ratio':>5}  {'Paddle step ms':>14}  {'pipesplit step ms':>17}"]
    paddle, ours = summary["impls"]["paddle"], summary["impls"]["pipesplit"]
    for i, n in enumerate(summary["layers"]):
        lines.append(f"{n:>6}  {summary['program_ops'][i]:>6}  {paddle['pass_ms'][i]:>14.1f}  "
                     f"{ours['pass_ms'][i]:>17.1f}  {summary['pass_ratio'][i]:>5.2f}  "
                     f"{paddle['step_ms'][i]:>14.1f}  {ours['step_ms'][i]:>17.1f}")
    lines.append(f"{schedule}: pass time's log-log slope against the program's ops: Paddle "
                 f"{paddle['pass_slope_vs_ops']:.2f}, pipesplit {ours['pass_slope_vs_ops']:.2f} "
                 "(1 = linear)")
    return "\n".join(lines)


def plot(summary: dict, schedule: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for impl, style in (("paddle", "o--"), ("pipesplit", "s-")):
        figures = summary["impls"][impl]
        left.plot(summary["program_ops"], figures["pass_ms"], style, label=impl)
        right.plot(summary["layers"], figures["step_ms"], style, label=impl)
    left.set(xscale="log", yscale="log", xlabel="ops of the program the pass splits",
             ylabel="pass ms (to_static, one preparation)", title=f"{schedule}: pass time")
    right.set(xlabel="layers", ylabel="step ms (median)", title=f"{schedule}: step time")
    for axes in (left, right):
        axes.grid(True, alpha=0.3)
        axes.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        layers = parse_layers(args.layers)
        if args.steps < 2 or args.m < 1 or args.hidden < 8:
            raise ValueError(f"--steps must be >= 2, -m >= 1 and --hidden >= 8, got "
                             f"{args.steps}, {args.m}, {args.hidden}")
    except ValueError as exc:
        print(f"bench_pass_growth: error: {exc}", file=sys.stderr)
        return 2
    points = {}
    for n in layers:
        points[n] = run_one(args, n)
        print(f"{n} layers: " + ", ".join(f"{impl} pass {f['pass_ms']:.1f} ms, step "
                                          f"{f['step_ms']:.1f} ms" for impl, f in
                                          sorted(points[n].items())), file=sys.stderr, flush=True)
    summary = summarize(points)
    print(format_summary(summary, args.schedule))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schedule": args.schedule, "m": args.m, "hidden": args.hidden, **summary},
                      f, indent=1)
    if args.plot:
        plot(summary, args.schedule, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

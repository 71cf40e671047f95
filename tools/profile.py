"""``pipesplit profile``: measure a model's per-job times and memory for the simulator.

    pipesplit profile --model gpt|mlp [--hidden H --layers-per-stage L --micro-batch-size B]
                      --pp P [--vpp V] -m M [--repeats R] [--inner K] [--json PATH]

Every job type of the split program (forward, backward_b, backward_w, full backward, send /
recv, optimizer; one chunk per global stage) runs in Paddle's executor, all ranks in one
process.  Prints per-stage median times (ms) and live-memory deltas, and writes a cost file
``{"costs": ..., "memory": ..., "meta": ...}`` that ``pipesplit schedule ... --costs FILE``,
``Costs.load`` and ``build_schedule(..., costs=...)`` accept.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from pipesplit.tools._console import (HelpFormatter, Progress, add_quiet_option, prepare_output,
                                      quiet_paddle, run_reporting_errors)

MODEL_DEFAULTS = dict(model="gpt", hidden=32, layers_per_stage=1, micro_batch_size=2,
                      optimizer="sgd", seed=0)


def add_model_options(p: argparse.ArgumentParser, defaults: Optional[dict] = None) -> None:
    d = dict(MODEL_DEFAULTS, **(defaults or {}))
    p.add_argument("--model", choices=("gpt", "mlp"), default=d["model"])
    p.add_argument("--hidden", type=int, default=d["hidden"])
    p.add_argument("--layers-per-stage", type=int, default=d["layers_per_stage"])
    p.add_argument("--micro-batch-size", type=int, default=d["micro_batch_size"],
                   help="samples per micro-batch")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default=d["optimizer"])
    p.add_argument("--seed", type=int, default=d["seed"])


def add_config_options(p: argparse.ArgumentParser, pp: int = 2, vpp: int = 1,
                       m: Optional[int] = None) -> None:
    p.add_argument("--pp", type=int, default=pp, help="pipeline ranks (emulated)")
    p.add_argument("--vpp", type=int, default=vpp, help="chunks per rank")
    p.add_argument("-m", "--micro-batches", dest="m", type=int, default=m,
                   help="micro-batches per step (default 2*pp)")


def model_options(args) -> dict:
    return dict(hidden=args.hidden, layers_per_stage=args.layers_per_stage,
                micro_batch_size=args.micro_batch_size, optimizer=args.optimizer, seed=args.seed)


def check_args(args, names=("pp", "vpp", "m", "hidden", "layers_per_stage", "micro_batch_size",
                            "repeats", "inner")) -> None:
    if getattr(args, "m", 0) is None:
        args.m = 2 * args.pp
    for name in names:
        if hasattr(args, name) and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipesplit profile",
                                description=__doc__.splitlines()[0].replace("``", ""),
                                formatter_class=HelpFormatter)
    add_model_options(p)
    add_config_options(p)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per plan (median)")
    p.add_argument("--inner", type=int, default=4,
                   help="how often the probed job type runs per micro-batch in its plan")
    p.add_argument("--json", metavar="PATH", help="write the cost file here")
    add_quiet_option(p)
    return p


def run_profile(args, log=None):
    """profile_jobs for the parsed ``args`` (model built from the model options)."""
    from pipesplit.passes.measure.profile import profile_jobs

    return profile_jobs(args.model, args.pp, args.vpp, args.m, repeats=args.repeats,
                        inner=args.inner, log=log, **model_options(args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    quiet_paddle()
    return run_reporting_errors("pipesplit profile", lambda: _profile_and_report(args))


def _profile_and_report(args) -> int:
    check_args(args)
    prepare_output(args.json, "--json")
    profile = run_profile(args, log=Progress("pipesplit profile", quiet=args.quiet).log)
    meta = profile.meta
    print(f"{args.model}: pp={args.pp} vpp={args.vpp} m={args.m} ({meta['num_stages']} stages, "
          f"micro-batch {meta['micro_batch_size']}, {args.repeats} repeats, "
          f"{meta['profile_seconds']:g} s; all ranks in one process: send/recv are empty)")
    print(profile.table())
    if args.json:
        profile.save(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

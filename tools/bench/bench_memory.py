"""Measured peak memory and step time of every schedule beside the simulator's figures.

    python -m pipesplit.tools.bench.bench_memory [--model mlp --hidden 256 --layers-per-stage 4
        --micro-batch-size 512] [--pp 4 --vpp 1 -m 8] [--schedules FThenB,1F1B,...]
        [--repeats 3] [--json PATH]

Profiles the model first (:func:`pipesplit.passes.measure.profile.profile_jobs`: per-job times and
live-memory deltas), then runs one whole step of each schedule, every rank in one process, and
reads the allocator's peak.  See
:func:`pipesplit.passes.measure.calibration.calibration_table` for the columns.  JSON: one
record per schedule with ``schedule``, ``peak_bytes`` (measured), ``sim_peak_units``
(simulator, max over ranks), ``step_ms`` (measured median), ``sim_makespan`` (simulator,
measured costs, ms) and the derived figures.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from pipesplit.tools._console import (Progress, add_quiet_option, prepare_output, quiet_paddle,
                                      quiet_pipe_main, run_reporting_errors)
from pipesplit.tools.cli import load_schedules
from pipesplit.tools.profile import add_config_options, add_model_options, check_args, model_options

DEFAULTS = dict(model="mlp", hidden=256, layers_per_stage=4, micro_batch_size=512)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_memory", description=__doc__.splitlines()[0])
    add_model_options(p, DEFAULTS)
    add_config_options(p, pp=4, vpp=1, m=8)
    p.add_argument("--schedules", help="comma-separated names (default: every registered one)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per schedule (median)")
    p.add_argument("--profile-repeats", type=int, default=5)
    p.add_argument("--reference", default="1F1B", help="schedule the ratios are taken to")
    p.add_argument("--json", metavar="PATH")
    add_quiet_option(p)
    return p


@quiet_pipe_main
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    quiet_paddle()
    return run_reporting_errors("bench_memory", lambda: _bench(args))


def _bench(args) -> int:
    check_args(args, ("pp", "vpp", "m", "hidden", "layers_per_stage", "micro_batch_size",
                      "repeats", "profile_repeats"))
    prepare_output(args.json, "--json")
    from pipesplit.passes.measure.calibration import calibrate, calibration_table
    from pipesplit.job_list.text import format_bytes
    from pipesplit.passes.measure.profile import build_model, profile_jobs

    model = build_model(args.model, args.pp * args.vpp, args.m, **model_options(args))
    profiling = Progress("bench_memory: profiling", quiet=args.quiet)
    profile = profile_jobs(model, args.pp, args.vpp, args.m, repeats=args.profile_repeats,
                           log=profiling.log)
    print(f"{args.model} hidden={args.hidden} layers/stage={args.layers_per_stage} "
          f"micro-batch={args.micro_batch_size}: pp={args.pp} vpp={args.vpp} m={args.m}")
    print(profile.table())
    names = [n.strip() for n in args.schedules.split(",")] if args.schedules else None
    if names is None:  # every schedule: those of every job_list module
        load_schedules()
    running = Progress("bench_memory: one step per schedule", quiet=args.quiet)
    records, refused = calibrate(model, args.pp, args.vpp, args.m, profile, names,
                                 repeats=args.repeats, log=running.log)
    print()
    print(calibration_table(records, args.reference))
    for name, reason in refused:
        print(f"  {name}: skipped: {reason}")
    print(f"activation unit (mean over stages): {format_bytes(records[0]['unit_bytes'])}"
          if records else "no schedule ran")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())

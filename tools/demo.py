"""``pipesplit demo``: train a small model with a pipeline schedule on CPU, beside an unsplit run.

Every rank of the pipeline is emulated in one process (see :mod:`pipesplit.passes.split.pipeline`).
Prints the schedule grid, the simulated bubble ratio and peak activation memory, each step's
loss beside the unsplit run's, and the largest parameter difference.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Optional, Sequence

from pipesplit.tools._console import (HelpFormatter, Progress, add_quiet_option, prepare_output,
                                      quiet_paddle, run_reporting_errors)

DEFAULTS = dict(schedule="ZBVPP", pp=2, vpp=None, m=4, steps=3, model="gpt")
#: chunks per rank when --vpp is not given: interleave this many where the schedule can
PREFERRED_VPP = 2
#: how the parser's options are spelled on the command line, for error messages
_FLAGS = {"m": "-m"}


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipesplit demo",
                                description=__doc__.splitlines()[0].replace("``", ""),
                                formatter_class=HelpFormatter)
    p.add_argument("--schedule", default=DEFAULTS["schedule"], help="schedule name (any registered)")
    p.add_argument("--pp", type=int, default=DEFAULTS["pp"], help="pipeline ranks (emulated)")
    p.add_argument("--vpp", type=int, default=DEFAULTS["vpp"],
                   help=f"chunks per rank (default: {PREFERRED_VPP} where the schedule serves "
                        f"it, else 1, e.g. 1 for ZBH1 / ZBH2)")
    p.add_argument("-m", "--micro-batches", dest="m", type=int, default=DEFAULTS["m"],
                   help="micro-batches per step")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="training steps")
    p.add_argument("--model", choices=("gpt", "mlp"), default=DEFAULTS["model"],
                   help="the small GPT or an MLP (pipesplit.ir_utils.build_gpt / build_mlp)")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam", "adamw"), default="sgd",
                   help="adamw uses weight decay 0.01; Adam amplifies fp32 rounding of near-zero "
                        "gradients, so its parameters match the unsplit run to ~1e-5, not 1e-6")
    p.add_argument("--clip-global-norm", type=float, default=None, metavar="X",
                   help="clip gradients to global norm X (paddle.nn.ClipGradByGlobalNorm)")
    p.add_argument("--tied-embeddings", action="store_true",
                   help="gpt: the LM head uses the token embedding's weight")
    p.add_argument("--lr-schedule", choices=("constant", "step", "cosine", "warmup"),
                   default="constant",
                   help="learning-rate schedule, stepped after every step: step (halved every "
                        "step), cosine (period 4 steps), warmup (linear, 3 steps)")
    p.add_argument("--layers-per-stage", type=int, default=1, help="layers per pipeline stage")
    p.add_argument("--hidden", type=int, default=32, help="hidden size")
    p.add_argument("--micro-batch-size", type=int, default=2, help="samples per micro-batch")
    p.add_argument("--split-backward", action="store_true",
                   help="split backward into backward_b / backward_w (implied by zero-bubble schedules)")
    p.add_argument("--seed", type=int, default=0, help="seed of the parameters and the data")
    p.add_argument("--json", metavar="PATH", help="write losses, baseline_losses, max_param_diff")
    p.add_argument("--profile", action="store_true",
                   help="profile the model's jobs first (pipesplit profile) and schedule with the "
                        "measured costs")
    p.add_argument("--memory-limit", default=None, metavar="X",
                   help="activation-memory limit per rank for schedules that take one (auto): "
                        "bytes with a suffix (KB/MB/GB; needs --profile, converted with the "
                        "measured activation size per stage per micro-batch) or simulator units "
                        "(a plain number)")
    p.add_argument("--profile-repeats", type=int, default=3,
                   help="timed runs per profiled plan (with --profile)")
    p.add_argument("--profile-json", metavar="PATH", help="with --profile: write the cost file")
    add_quiet_option(p)
    return p


def flag(name: str) -> str:
    """The command-line spelling of option ``name`` (``m`` -> ``-m``)."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def default_vpp(schedule: str, pp: int, m: int) -> int:
    """:data:`PREFERRED_VPP` chunks per rank where ``schedule`` serves them, else 1."""
    return _preferred_vpp(schedule, pp, m)[0]


def _preferred_vpp(schedule: str, pp: int, m: int, split_backward: bool = False):
    """(vpp, the request resolved to learn it, or None): the plan opening takes its schedule
    instead of building it again."""
    from pipesplit.job_list.request import CannotServe, request_schedule
    from pipesplit.tools.cli import load_schedules

    load_schedules()
    try:  # (an unknown name: ValueError with "did you mean")
        return PREFERRED_VPP, request_schedule(schedule, dict(
            num_micro_batches=m, pp_degree=pp, vpp_degree=PREFERRED_VPP,
            split_backward=split_backward))
    except CannotServe:  # its constraint: one chunk per rank
        return 1, None


def _check(args) -> None:
    """Checks the numbers and fills in the defaults that follow the schedule (``vpp``)."""
    for name in ("pp", "m", "steps", "layers_per_stage", "hidden", "micro_batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"{flag(name)} must be >= 1, got {getattr(args, name)}")
    if args.vpp is None:
        args.vpp, args.requested = _preferred_vpp(args.schedule, args.pp, args.m,
                                                       bool(args.split_backward))
    if args.vpp < 1:
        raise ValueError(f"--vpp must be >= 1, got {args.vpp}")
    clip = getattr(args, "clip_global_norm", None)
    if clip is not None and not clip > 0:
        raise ValueError(f"--clip-global-norm must be > 0, got {clip}")
    if getattr(args, "tied_embeddings", False) and args.model != "gpt":
        raise ValueError(f"--tied-embeddings needs --model gpt (the {args.model} model has no "
                         "embedding)")


def build_model(args):
    from pipesplit.ir_utils import build_gpt, build_mlp

    common = dict(num_stages=args.pp * args.vpp, layers_per_stage=args.layers_per_stage,
                  hidden=args.hidden, batch_size=args.m * args.micro_batch_size,
                  optimizer=args.optimizer,
                  lr=1e-3 if args.optimizer in ("adam", "adamw") else 0.1, seed=args.seed,
                  lr_schedule=getattr(args, "lr_schedule", "constant"),
                  clip_global_norm=getattr(args, "clip_global_norm", None))
    if args.model == "gpt":
        return build_gpt(tied_embeddings=getattr(args, "tied_embeddings", False), **common)
    return build_mlp(**common)


@contextlib.contextmanager
def schedule_restored(model):
    """Put the model's LR scheduler back where it was on leaving the block."""
    scheduler = model.lr_scheduler
    state = scheduler.state_dict() if scheduler is not None else None
    try:
        yield
    finally:
        if scheduler is not None:
            scheduler.set_state_dict(state)


def train_steps(runner, model, steps, feed_of=None):
    """``steps`` plan steps on the model's batches, stepping its LR scheduler after each (as a
    training loop does with ``Executor.run``); returns what each step fetched."""
    out = []
    for step in range(steps):
        batch = model.make_batch(step)
        out.append(runner.step(feed_of(batch) if feed_of else batch))
        if model.lr_scheduler is not None:
            model.lr_scheduler.step()
    return out


def run(args) -> dict:
    """Train with the schedule and unsplit; return the demo's JSON record (and print)."""
    import numpy as np

    from pipesplit.ir_utils import PlanRunner, init_scope, read_params, run_unsplit_baseline
    from pipesplit.job_list.views import ascii_grid
    from pipesplit.passes import PipelineConfig, split_and_schedule
    from pipesplit.tools._console import grid_width

    model = build_model(args)
    attrs = dict(num_micro_batches=args.m, pp_degree=args.pp, vpp_degree=args.vpp,
                 split_backward=args.split_backward)
    attrs.update(_profiled_attrs(args, model))
    config = PipelineConfig.from_attrs(args.schedule, attrs)
    requested = getattr(args, "requested", None)  # (when --vpp was left to the demo)
    pipeline = split_and_schedule(model.main, model.startup, config,
                                  requested if requested and requested.config == config else None)
    sim = pipeline.simulate()
    print(f"{pipeline.schedule.name}: pp={args.pp} vpp={args.vpp} m={args.m} "
          f"({args.model}, {len(model.param_names)} parameters, {args.steps} steps, "
          f"all ranks emulated in one process)")
    print(ascii_grid(sim, width=grid_width()))
    print(f"simulated makespan {sim.makespan:g}, bubble ratio {sim.bubble_ratio:.3f}, "
          f"peak activations per rank {[round(x, 2) for x in sim.peak_memory]}")

    progress = Progress("pipesplit demo", quiet=getattr(args, "quiet", False))
    progress.note(f"training {args.steps} steps through the plan, then unsplit")
    scope = init_scope(model, pipeline.split)
    runner = PlanRunner(pipeline.plan, scope, program=model.main)
    with schedule_restored(model):  # the unsplit baseline starts from the same LR
        losses = [[float(x) for x in out] for out in train_steps(runner, model, args.steps)]
    params = read_params(scope, model.param_names)
    baseline_losses, baseline_params = run_unsplit_baseline(model, args.steps, args.m)
    baseline_losses = [[float(x) for x in row] for row in baseline_losses]
    max_param_diff = max(float(np.max(np.abs(params[n] - baseline_params[n]))) for n in params)

    print(f"{'step':>4}  {'loss (pipeline)':>16}  {'loss (unsplit)':>15}  {'max |diff| per mb':>17}")
    for step, (ours, ref) in enumerate(zip(losses, baseline_losses)):
        diff = max(abs(a - b) for a, b in zip(ours, ref))
        print(f"{step:>4}  {np.mean(ours):>16.7f}  {np.mean(ref):>15.7f}  {diff:>17.2e}")
    print(f"max parameter difference after {args.steps} steps: {max_param_diff:.2e}")
    return {"losses": losses, "baseline_losses": baseline_losses, "max_param_diff": max_param_diff}


def _profiled_attrs(args, model) -> dict:
    """``costs`` / ``memory_limit`` pass attrs from ``--profile`` / ``--memory-limit``."""
    limit = getattr(args, "memory_limit", None)
    if not getattr(args, "profile", False) and limit is None:
        return {}
    from pipesplit.job_list.text import format_bytes
    from pipesplit.passes.measure.profile import parse_memory

    attrs = {}
    if limit is not None:
        value, is_bytes = parse_memory(limit)
        if is_bytes and not args.profile:
            raise ValueError(f"--memory-limit {limit} is in bytes: add --profile to measure the "
                             f"activation size that converts it to simulator units")
    if args.profile:
        from pipesplit.passes.measure.profile import profile_jobs

        if args.profile_repeats < 1:
            raise ValueError(f"--profile-repeats must be >= 1, got {args.profile_repeats}")
        progress = Progress("profiling", quiet=getattr(args, "quiet", False))
        progress.note(f"timing every job type of {args.pp * args.vpp} stages "
                      f"(--profile-repeats {args.profile_repeats})")
        profile = profile_jobs(model, args.pp, args.vpp, args.m, repeats=args.profile_repeats,
                               log=progress.log)
        print(f"profiled {args.model} in {profile.meta['profile_seconds']:g} s (ms per job, "
              f"one process):")
        print(profile.table())
        if args.profile_json:
            profile.save(args.profile_json)
            print(f"wrote {args.profile_json}")
        attrs["costs"] = profile.costs
        if limit is not None and is_bytes:
            units = profile.bytes_to_units(value)
            print(f"memory limit {format_bytes(value)} = {units:.3g} units of "
                  f"{format_bytes(profile.unit_bytes)} (largest stage's activations per "
                  f"micro-batch)")
            value = units
    if limit is not None:
        attrs["memory_limit"] = value
    return attrs


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    quiet_paddle()

    def body() -> int:
        _check(args)
        prepare_output(args.json, "--json")
        prepare_output(args.profile_json, "--profile-json")
        record = run(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
        return 0

    return run_reporting_errors("pipesplit demo", body)


if __name__ == "__main__":
    sys.exit(main())

"""The ``pipesplit`` command line.

    pipesplit schedule list
    pipesplit schedule show    --schedule VPP --pp 4 --vpp 2 -m 8
    pipesplit schedule export  --schedule 1F1B --pp 4 -m 8 --format csv|json [--lowered]
    pipesplit schedule compare --pp 4 -m 8 [--schedules 1F1B,VPP,...]
    pipesplit schedule trace   --schedule VPP --pp 4 --vpp 2 -m 8 -o trace.json
    pipesplit schedule plot    --schedule VPP --pp 4 --vpp 2 -m 8 -o schedule.png
    pipesplit demo ...         (pipesplit.tools.demo, imported only when asked for)
    pipesplit profile ...      (pipesplit.tools.profile, imported only when asked for)

Common schedule options: ``--split-backward``, ``--cost tF,tB,tI,tW`` (or ``tF,tB``), ``--comm C``,
``--costs FILE.json`` (a :meth:`Costs.load` file), ``--memory-limit X``.  ``costs`` and
``memory_limit`` reach a generator only when given and only if its signature accepts them.

The ``schedule`` commands import nothing but :mod:`pipesplit.job_list` (pure Python, no paddle),
so they start fast.  Bad arguments exit with status 2 and one line on stderr; a configuration the
schedule cannot serve (its ``ValueError``) exits with status 1.  ``PIPESPLIT_DEBUG=1`` shows
tracebacks.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import pkgutil
import sys
from typing import List, Optional, Sequence, Tuple

from pipesplit.tools._console import (DEFAULT_WIDTH, HelpFormatter, exit_quietly_on_closed_pipe,
                                      grid_width, prepare_output)

PROG = "pipesplit"
#: subcommands that live in their own module and are imported only when invoked
LAZY_COMMANDS = {
    "demo": ("pipesplit.tools.demo", "build, split and run a small model with a pipeline schedule"),
    "profile": ("pipesplit.tools.profile", "measure per-job costs of a model for the simulator"),
}


class CliError(Exception):
    """A bad argument or configuration: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line (no usage block) through :class:`CliError`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # noqa: D401 - argparse API
        where = self.prog[len(PROG):].strip()
        raise CliError(f"{where}: {message}" if where else message)


# --------------------------------------------------------------------------- helpers

def load_schedules() -> None:
    """Import every module of :mod:`pipesplit.job_list` so their ``@register_schedule`` run
    (classic, zero-bubble, auto, ... whichever exist).  All of them are pure Python."""
    import pipesplit.job_list as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def accepts(function, name: str) -> bool:
    """True if ``function`` takes a keyword argument ``name`` (the registry's rule)."""
    from pipesplit.job_list.registry import accepts_option

    return accepts_option(function, name)


def parse_costs(args) -> Tuple["Costs", bool]:
    """(Costs, whether the user gave any) from ``--cost`` / ``--costs`` / ``--comm``."""
    from pipesplit.job_list.simulate import Costs

    if args.cost and args.costs:
        raise CliError("give either --cost or --costs, not both")
    given = bool(args.cost or args.costs or args.comm is not None)
    comm = args.comm if args.comm is not None else None
    if args.costs:
        try:
            costs = Costs.load(args.costs)
        except (OSError, json.JSONDecodeError) as exc:
            raise CliError(f"--costs {args.costs}: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise CliError(f"--costs {args.costs}: {exc}") from None
        if comm is not None:
            costs = dataclasses.replace(costs, comm=comm)
    elif args.cost:
        try:
            costs = Costs.from_string(args.cost, comm=comm or 0.0)
        except ValueError as exc:
            raise CliError(f"--cost: {exc}") from None
    else:
        costs = Costs(comm=comm or 0.0)
    return costs, given


def build(name: str, args, costs, costs_given: bool, quiet: bool = False):
    """``build_schedule`` with only the options the user gave and the generator accepts."""
    from pipesplit.job_list import build_schedule, get_spec

    try:
        spec = get_spec(name)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    options = {}
    if args.split_backward:
        options["split_backward"] = True
    for key, value, given in (("costs", costs, costs_given),
                              ("memory_limit", args.memory_limit, args.memory_limit is not None)):
        if not given:
            continue
        if accepts(spec.generator, key):
            options[key] = value
        elif key == "memory_limit" and not quiet:
            print(f"{PROG}: note: {spec.name} does not take memory_limit; ignored", file=sys.stderr)
    return build_schedule(spec.name, args.pp, args.vpp, _m(args), **options)


def _m(args) -> int:
    return args.m if args.m is not None else 2 * args.pp


def summary_numbers(sim) -> dict:
    from pipesplit.job_list.bounds import lower_bound

    s = sim.schedule
    bound = lower_bound(s.pp, s.vpp, s.m, sim.costs)
    return {"makespan": sim.makespan, "lower_bound": bound,
            "ratio": sim.makespan / bound if bound else float("nan"),
            "bubble": sim.bubble_ratio, "peak": sim.max_peak_memory}


def _lowered(schedule, costs):
    try:
        from pipesplit.job_list.lower import lower_comm
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("pipesplit.job_list"):
            raise CliError("--lowered needs pipesplit.job_list.lower (lower_comm), which is not "
                           "available in this installation", code=1) from None
        raise
    return lower_comm(schedule, costs=costs)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


# --------------------------------------------------------------------------- commands

def cmd_list(args) -> int:
    from pipesplit.job_list import get_spec, schedule_names

    rows = [("schedule", "aliases", "placement", "splits B", "description")]
    for name in schedule_names():
        spec = get_spec(name)
        rows.append((spec.name, ",".join(spec.aliases) or "-", spec.placement,
                     "yes" if spec.splits_backward else "no", spec.description))
    _print_table(rows)
    return 0


def _simulated(args):
    from pipesplit.job_list.simulate import simulate
    from pipesplit.job_list.validate import validate

    costs, given = parse_costs(args)
    schedule = build(args.schedule, args, costs, given)
    validate(schedule)
    return schedule, simulate(schedule, costs)


def cmd_show(args) -> int:
    from pipesplit.job_list.views import ascii_grid

    schedule, sim = _simulated(args)
    n = summary_numbers(sim)
    print(schedule)
    print()
    print(ascii_grid(sim, width=grid_width(args.width)))
    print()
    print(f"makespan {_fmt(n['makespan'])}  lower bound {_fmt(n['lower_bound'])}  "
          f"ratio {n['ratio']:.3f}  bubble {n['bubble']:.1%}")
    print("peak memory (stage activations of one micro-batch) per rank: "
          + " ".join(_fmt(p) for p in sim.peak_memory) + f"  (max {_fmt(n['peak'])})")
    return 0


def cmd_export(args) -> int:
    from pipesplit.job_list.simulate import simulate
    from pipesplit.job_list.views import to_csv, to_json

    costs, given = parse_costs(args)
    schedule = build(args.schedule, args, costs, given)
    if args.lowered:
        schedule = _lowered(schedule, costs)
    if args.format == "csv":
        sys.stdout.write(to_csv(schedule))
    else:
        sys.stdout.write(to_json(schedule, simulate(schedule, costs)) + "\n")
    return 0


def cmd_compare(args) -> int:
    from pipesplit.job_list import get_spec, schedule_names
    from pipesplit.job_list.bounds import lower_bound
    from pipesplit.job_list.simulate import simulate

    costs, given = parse_costs(args)
    if args.schedules:
        names = [n.strip() for n in args.schedules.split(",") if n.strip()]
        for name in names:
            try:
                get_spec(name)
            except ValueError as exc:  # unknown names are a usage error
                raise CliError(str(exc)) from None
    else:
        names = schedule_names()
    rows = [("schedule", "makespan", "/ lower bound", "bubble", "peak memory")]
    refused = []
    for name in names:
        try:
            sim = simulate(build(name, args, costs, given, quiet=True), costs)
        except ValueError as exc:  # includes ScheduleError (deadlock)
            refused.append((get_spec(name).name, str(exc).splitlines()[0]))
            continue
        n = summary_numbers(sim)
        rows.append((sim.schedule.name, _fmt(n["makespan"]), f"{n['ratio']:.3f}",
                     f"{n['bubble']:.1%}", _fmt(n["peak"])))
    bound = lower_bound(args.pp, args.vpp, _m(args), costs)
    c = costs
    print(f"pp={args.pp} vpp={args.vpp} m={_m(args)}  costs F={c.forward} "
          f"B={'I+W' if c.backward is None else c.backward} I={c.backward_b} W={c.backward_w} "
          f"comm={c.comm}  lower bound {_fmt(bound)}"
          + ("  split_backward" if args.split_backward else ""))
    _print_table(rows)
    for name, reason in refused:
        print(f"  {name}: cannot serve this config: {reason}")
    return 0 if len(rows) > 1 else 1


def cmd_trace(args) -> int:
    from pipesplit.job_list.views import chrome_trace

    _checked_output(args.output)
    _, sim = _simulated(args)
    text = json.dumps(chrome_trace(sim))
    if args.output in (None, "-"):
        sys.stdout.write(text + "\n")
    else:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output} ({sum(len(r) for r in sim.timeline)} jobs, "
              f"{sim.schedule.pp} ranks); open it in https://ui.perfetto.dev")
    return 0


def cmd_plot(args) -> int:
    from pipesplit.job_list.views import plot_timeline

    _checked_output(args.output)
    _, sim = _simulated(args)
    plot_timeline(sim, args.output)
    print(f"wrote {args.output}")
    return 0


def _checked_output(path: Optional[str]) -> None:
    """Parent folders of ``-o`` created before any work (a bad path is a usage error)."""
    try:
        prepare_output(path, "-o")
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _print_table(rows: Sequence[Sequence[str]]) -> None:
    """``rows`` (a header first) as text, every column aligned left."""
    from pipesplit.job_list.text import text_table

    print(text_table(rows, left=range(len(rows[0]))))


# --------------------------------------------------------------------------- parser

def _add_config(p: argparse.ArgumentParser, need_schedule: bool = True) -> None:
    if need_schedule:
        p.add_argument("--schedule", "-s", required=True, help="schedule name or alias (case-insensitive)")
    p.add_argument("--pp", type=_positive_int, default=4, help="pipeline ranks")
    p.add_argument("--vpp", type=_positive_int, default=1, help="chunks per rank")
    p.add_argument("-m", "--micro-batches", dest="m", type=_positive_int, default=None,
                   help="micro-batches (default 2*pp)")
    p.add_argument("--split-backward", action="store_true",
                   help="split every backward into I (input grad) + W (weight grad)")
    p.add_argument("--cost", help="job times 'tF,tB,tI,tW' or 'tF,tB' (default 1,2,1,1)")
    p.add_argument("--comm", type=_non_negative_float, default=None, help="p2p latency (default 0)")
    p.add_argument("--costs", metavar="FILE.json", help="costs file (Costs.to_dict form, "
                   "optionally under a 'costs' key)")
    p.add_argument("--memory-limit", type=_non_negative_float, default=None,
                   help="activation-memory limit, for generators that take memory_limit")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="pipesplit: pipeline-parallel schedules for Paddle "
                     "static graphs.")
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    sched = commands.add_parser("schedule", help="inspect, export, compare and draw schedules")
    actions = sched.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", help="registered schedules")
    show = actions.add_parser("show", help="job lists, ASCII grid, makespan / bubble / memory")
    _add_config(show)
    show.add_argument("--width", type=_positive_int, default=None,
                      help="characters per grid line; the time step grows until a line fits "
                           f"(default: the terminal's width, {DEFAULT_WIDTH} when stdout is not "
                           "a terminal)")
    export = actions.add_parser("export", help="CSV (PyTorch format) or JSON to stdout")
    _add_config(export)
    export.add_argument("--format", choices=("csv", "json"), default="csv")
    export.add_argument("--lowered", action="store_true", help="include send / recv jobs (lower_comm)")
    compare = actions.add_parser("compare", help="makespan, bubble, peak memory of several schedules")
    _add_config(compare, need_schedule=False)
    compare.add_argument("--schedules", help="comma-separated names (default: every registered one)")
    trace = actions.add_parser("trace", help="Chrome trace JSON (Perfetto)")
    _add_config(trace)
    trace.add_argument("-o", "--output", default=None, help="file (default: stdout)")
    plot = actions.add_parser("plot", help="PNG timeline (needs matplotlib)")
    _add_config(plot)
    plot.add_argument("-o", "--output", required=True, help="PNG file")
    for name, (module, text) in LAZY_COMMANDS.items():
        commands.add_parser(name, help=f"{text} ({module})", add_help=False)
    return parser


COMMANDS = {"list": cmd_list, "show": cmd_show, "export": cmd_export, "compare": cmd_compare,
            "trace": cmd_trace, "plot": cmd_plot}


def _run_lazy(name: str, argv: List[str]) -> int:
    module_name = LAZY_COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            print(f"{PROG}: error: '{PROG} {name}' is not available ({module_name} is not "
                  f"installed)", file=sys.stderr)
        else:
            print(f"{PROG}: error: '{PROG} {name}' needs module {exc.name!r}: {exc}",
                  file=sys.stderr)
        return 2
    result = module.main(argv)
    return int(result or 0)


def version() -> str:
    """pipesplit's version: ``pipesplit.__version__`` (the same as the installed metadata)."""
    import pipesplit

    return pipesplit.__version__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``pipesplit`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with exit_quietly_on_closed_pipe():
            return _main(argv)
    except SystemExit as exc:  # closed pipe
        return exc.code if isinstance(exc.code, int) else 0


def _main(argv: List[str]) -> int:
    if argv and argv[0] in LAZY_COMMANDS:
        return _run_lazy(argv[0], argv[1:])
    debug = os.environ.get("PIPESPLIT_DEBUG") == "1"
    try:
        parser = make_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        if args.action is None:
            raise CliError("schedule: choose an action: " + ", ".join(COMMANDS))
        load_schedules()
        return COMMANDS[args.action](args)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except CliError as exc:
        if debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # stdout closed by its reader: handled by main
        raise
    except (ValueError, TypeError, OSError, ImportError) as exc:
        if debug:
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())

"""Measured step time, memory and pass time of Paddle's auto-parallel engine per schedule:
Paddle's own pipeline passes against pipesplit's, one model, two CPU processes.

    python tools/bench/bench_engine.py [--model {gpt,llama}] [--steps 10] [--warmup 3] [-m 4,8]
        [--schedules FThenB,1F1B,...] [--budget-s 1140] [--profiled-steps 6] [--quick]
        [--json PATH]

The parent launches ``python -m paddle.distributed.launch --nproc_per_node 2`` on this file
(``--worker``), one compute thread per rank (as ``tools/bench/bench_multirank.py``).  Each process
builds one ``DistModel`` per (schedule, impl) with ``dist.to_static`` from the example's own
builders (``examples/auto_parallel_pipeline.py``; ``examples/llama_auto_parallel.py`` at pp 2),
each in its own name generator and scope, same seed, same batches.  Paddle's controls (impl
``paddle``: FThenB, 1F1B; Paddle's VPP does not run on the CPU transport) are built and stepped
with ``pipesplit.passes.strategy.disable_strategy()``, as the examples' ``--paddle``;
pipesplit's with ``enable_strategy()``; ``cpu_support`` stays on for both.  Every m of ``-m``
(default 4 and 8) gets its own engines, all stepped together in the same processes.

Every engine runs its ops in program order on the calling thread (Paddle's serial executor,
both impls alike): the memory steps' bytes are then the program's own.  Measured per
(schedule, impl):

* **step ms**: after the warm-up, step k of every engine (order rotated by one per step: paired)
  before step k + 1 of any.  Both ranks first meet in a barrier of the launcher's gloo group
  (not the TCP store, whose blocking ``get`` wakes a waiter later); a step is the last rank's
  end minus the first rank's start of ``dist_model(x, y)`` (``time.monotonic``, system-wide);
  median and interquartile range.  Every step's time is kept (``step_ms_all``): step i of two
  engines forms a pair for the goals;
* **peak bytes** per rank, Paddle's host allocator statistics (process RSS hides its cache),
  exact to the byte: *resident* (allocated bytes the engine added from before its model was
  built to after its first step, GC settled, Python's collector off meanwhile: parameters,
  optimizer states, gradient buffers) + *transient* (the allocator's peak during a step minus
  the bytes at its start, smallest of the memory steps after the warm-up, each run behind the
  executor's GC thread on the rank's own CPU, ``run_behind_gc``: :data:`MEMORY_STEPS`, and
  more up to :data:`MEMORY_STEPS_CAP` while an engine's smallest has not come twice on a rank;
  a row's ``exact_peak`` says it has);
* **pass ms**: time inside the pipeline pass while the engine is prepared (``to_static``,
  ``train()``, first step), by a wrapper installed only then, only in this process, around the
  engine module's ``pipeline_pass`` and ``pir_pass``'s (Paddle's own, or pipesplit's
  ``engine_hooks.pipeline_pass``) and, for pipesplit, ``session.open_engine_state`` (it builds
  the schedule the pass reuses).  One untimed engine per impl is built first: the first
  preparation in a process pays one-time costs (imports, first calls).  After every step,
  ``--pass-repeats`` more calls of each engine's pass on fresh clones of the programs the
  engine gave it (paired as the steps; pipesplit's ``open_engine_state`` time of its
  preparation added to each): the pass goal's samples;
* **auto**: as a user gets it, no cost file: it measures its jobs in step 1 and re-plans
  (``pipesplit.passes.measure.replan``); step 2 builds the new plan's executor, so the default warm-up
  is 3 steps.  Its row carries the costs it measured;
* **auto-budget**: ``auto`` under a memory budget (``use_memory_budget``) of Paddle 1F1B's
  peak, measured first by a probe engine of Paddle's 1F1B (two steps) and added to the bytes
  the process holds for its other engines (:func:`memory_budget`);
* **job times**: after the timed steps, ``--profiled-steps`` more steps of every engine under
  Paddle's profiler (paired as the timed ones): each job's ms per rank (``job_ms_steps``), the
  split goal's samples (I + W of ZBH1 against B of 1F1B, per stage); the first also records
  the allocations (the memory model's figures);
* **max loss diff**: largest |loss - reference| over every step all engines take (the
  rounds' are left out: they step only some engines) and micro-batch; reference:
  Paddle's 1F1B through the same engine (clipping off: Paddle clips the SUM of the micro-batch
  gradients), else the example's one-process dygraph reference.

The issues' goals (``bench_engine_report.goals``) are each a bound on the median of paired
ratios, with a bootstrap interval and a verdict, met / missed / unresolved
(``tools/bench/verdicts.py``).  After the samples asked, while a goal is unresolved and the
budget (``--budget-s``, the workers' seconds from their start) lasts, rounds give more samples
(timed steps, profiled steps or the pass's repeats) to the engines of the goals nearest to
resolving: a goal's price is the seconds its estimate of further samples takes at its engines'
pace, and a round serves the cheapest goals whose prices together fit the rest of the budget
(``tools/bench/bench_engine_rounds.py``); the report says whether sampling stopped with every
goal resolved or with the budget spent, each goal's paired samples (and when it first
resolved), and for each goal left unresolved whether its median lies within 3 % of its bound
(it may stay unresolved) or the budget fell short of it.  On a miss, the simulator's figures
beside the measured.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence

if __package__ in (None, ""):  # run as a script by paddle.distributed.launch
    # the script's folder would shadow modules (tools/profile.py the standard library's)
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from pipesplit.tools.bench.bench_engine_report import (BUDGET_SCHEDULE, REFERENCE,  # noqa: E402
                                                 add_goals, add_loss_diffs, format_report,
                                                 goals)
from pipesplit.tools.bench.bench_engine_rounds import (RESERVE_MARGIN_S,  # noqa: E402
                                                       describe_round, plan_round,
                                                       record_resolutions, reserve_s)
from pipesplit.tools.bench.bench_engine_runs import (KITS, PP, EngineRun,  # noqa: E402
                                               memory_budget)
from pipesplit.tools.bench.memory_model import measured_model  # noqa: E402
from pipesplit.tools.bench.verdicts import iqr  # noqa: E402
from pipesplit.ir_utils.measure import serial_executor  # noqa: E402

#: the clone's examples (this script runs from the clone: the parent launches its own path)
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))),
                        "examples")
#: (schedule, vpp) in the table's order
SCHEDULES = (("FThenB", 1), ("1F1B", 1), ("ZBH1", 1), ("ZBH2", 1), ("VPP", 2), ("ZBV", 2),
             ("DualPipeV", 2), ("auto", 1), (BUDGET_SCHEDULE, 1))
#: schedules Paddle's own pass serves on the CPU transport (the controls)
PADDLE_SCHEDULES = ("FThenB", "1F1B")
#: -m's default: m = 4 (where 1F1B's bubble leaves room for the fastest-schedule goal) beside 8;
#: --quick one small m
DEFAULT_M = {False: "4,8", True: "4"}
#: the launch's time limit on top of --budget-s (the builds, warm-up and memory steps, and the
#: fewest samples an interval needs, are taken whatever the budget)
LAUNCH_TIMEOUT_S = 1200
#: --budget-s's default: the workers' seconds from their start (engines built, samples asked,
#: rounds), 19 minutes: a default run ends within 20 on 2 cores, the launch and report included
DEFAULT_BUDGET_S = 1140.0
#: memory steps per engine (behind the GC thread: exact bytes; the smallest counts) ...
MEMORY_STEPS = 2
#: ... and more, up to this many, while an engine's smallest has not come twice on a rank (a
#: free that lagged behind a step raised its peak; the program's own peak is the smallest)
MEMORY_STEPS_CAP = 5
#: --profiled-steps' default: steps per engine under Paddle's profiler after the timed ones
#: (the split goal's paired samples; 6 is the fewest a verdict is given on)
DEFAULT_PROFILED_STEPS = 6
#: --pass-repeats' default: more calls of each engine's pipeline pass (the pass goal's samples)
DEFAULT_PASS_REPEATS = 12


def make_parser():
    p = argparse.ArgumentParser(prog="tools/bench/bench_engine.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("gpt", "llama"), default="gpt")
    p.add_argument("--steps", type=int, default=10,
                   help="timed steps per engine (at least 2: the goals' intervals)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps first (at least 1: the first step prepares the engine; "
                        "auto re-plans after step 1, and step 2 builds its new executor)")
    p.add_argument("-m", default=None,
                   help="micro-batches per step, a comma list (default 4,8; --quick 4)")
    p.add_argument("--schedules", default=",".join(name for name, _ in SCHEDULES
                                                   if name != BUDGET_SCHEDULE),
                   help="comma list (default: all but auto-budget, which is best run in a "
                        "launch of its own: --schedules 1F1B,auto-budget -m 4); FThenB and 1F1B "
                        "run with both impls")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help="seconds the workers may run in all: after the samples asked, rounds of "
                        "more for the engines of the unresolved goals nearest to resolving (the "
                        "cheapest first) until every goal is resolved or this is spent (0: no "
                        "rounds)")
    p.add_argument("--profiled-steps", type=int, default=DEFAULT_PROFILED_STEPS,
                   help="steps per engine under Paddle's profiler after the timed ones (each "
                        "schedule's job times; the split goal's samples)")
    p.add_argument("--pass-repeats", type=int, default=DEFAULT_PASS_REPEATS,
                   help="calls of each engine's pipeline pass again, on clones of its "
                        "programs, after the steps (the pass goal's paired samples)")
    p.add_argument("--layers", type=int, default=None,
                   help="the model's layers (default: the size's, 4); pp 2 takes half each")
    p.add_argument("--hidden", type=int, default=None,
                   help="the model's hidden size (default: the size's, 256)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (tests)")
    p.add_argument("--json", metavar="PATH", help="write one row per (schedule, impl) here")
    p.add_argument("--log-dir", default=None, help="the launcher's logs (default: temporary)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p


def check_args(args) -> None:
    if args.steps < 2:
        raise ValueError(f"--steps must be >= 2 (the goals' intervals need 2 paired steps), "
                         f"got {args.steps}")
    if args.warmup < 1:
        raise ValueError(f"--warmup must be >= 1, got {args.warmup}")
    if args.layers is not None and (args.layers < PP or args.layers % PP):
        raise ValueError(f"--layers must be a multiple of {PP} (pp), got {args.layers}")
    if args.hidden is not None and args.hidden < 8:
        raise ValueError(f"--hidden must be >= 8, got {args.hidden}")
    if args.profiled_steps < 2:
        raise ValueError(f"--profiled-steps must be >= 2 (the split goals' intervals need 2 "
                         f"paired steps), got {args.profiled_steps}")
    if args.pass_repeats < 2:
        raise ValueError(f"--pass-repeats must be >= 2 (the pass goal's interval needs 2 "
                         f"paired repeats), got {args.pass_repeats}")
    if not args.budget_s >= 0:
        raise ValueError(f"--budget-s must be >= 0, got {args.budget_s}")
    args.ms = parse_ms(DEFAULT_M[args.quick] if args.m is None else args.m)
    known, names = dict(SCHEDULES), [s.strip() for s in args.schedules.split(",") if s.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"--schedules: unknown {bad}; choose from {', '.join(known)}")
    args.entries = [(m, n, impl, known[n]) for m in args.ms for n, _ in SCHEDULES if n in names
                    for impl in (("paddle", "pipesplit") if n in PADDLE_SCHEDULES
                                 else ("pipesplit",))]


def parse_ms(text: str) -> List[int]:
    """``-m``'s comma list, each value once, in increasing order."""
    try:
        ms = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"-m must be a comma list of integers, got {text!r}") from None
    if not ms or ms[0] < 1:
        raise ValueError(f"-m needs values >= 1, got {text!r}")
    return ms


def simulated(schedule, vpp: int) -> dict:
    """The simulator's figures for ``schedule``: unit costs per rank (a chunk of vpp 2 costs
    1/2: F 1, B 2 = I 1 + W 1 per micro-batch per rank), peak in one rank's activations."""
    from pipesplit.job_list import simulate
    from pipesplit.job_list.costs import Costs

    unit = 1.0 / vpp
    sim = simulate(schedule, Costs(forward=unit, backward_b=unit, backward_w=unit))
    return {"built": schedule.name, "sim_makespan": sim.makespan, "sim_bubble": sim.bubble_ratio,
            "sim_peak_units": [u / vpp for u in sim.peak_memory]}


def build_engines(args, kits, ranks) -> List[EngineRun]:
    """Every engine of ``args.entries``, each m's on that m's kit and batches."""
    from pipesplit.ir_utils.measure import MemoryStats

    memory, runs, batches = MemoryStats(), [], {}
    # one untimed engine per impl first (one-time costs would land on whichever came first)
    primers = {impl: (m, name, vpp) for m, name, impl, vpp in reversed(args.entries)}
    primed = [EngineRun(kits[m], name, impl, vpp, None, memory, ranks.barrier)
              for impl, (m, name, vpp) in primers.items()]  # kept: no engine torn down midway
    for run in primed:
        batches.setdefault(run.m, run.batches)
    budgeted = [entry for entry in args.entries if entry[1] == BUDGET_SCHEDULE]
    for m, name, impl, vpp in [e for e in args.entries if e not in budgeted] + budgeted:
        budget = memory_budget(kits[m], memory, ranks, primed) if name == BUDGET_SCHEDULE \
            else None
        runs.append(EngineRun(kits[m], name, impl, vpp, batches.get(m), memory, ranks.barrier,
                              budget))
        batches.setdefault(m, runs[-1].batches)
        print(f"rank {ranks.rank}: built {name} ({impl}, m {m}) in {runs[-1].prepare_ms:.0f} "
              f"ms, pass {runs[-1].pass_ms:.1f} ms", file=sys.stderr, flush=True)
    return sorted(runs, key=lambda run: args.entries.index(
        (run.m, run.name, run.impl, run.vpp)))  # the table's order


def step_all(runs: Sequence[EngineRun], steps: range, **kind) -> None:
    """Steps ``steps`` of every engine of ``runs``, paired: step k of every engine (order
    rotated by one per step) before step k + 1 of any; ``kind``: :meth:`EngineRun.step`'s."""
    for step in steps:
        for run in rotated(runs, step):
            run.step(step, **kind)


def time_engines(args, kits, ranks):
    """Build every engine; the warm-up; the memory steps (:func:`memory_steps`: exact peak
    bytes, before the rounds: the "best" goal compares them); the timed and profiled steps
    asked; rounds of more samples for the engines of the unresolved goals
    (:func:`sample_rounds`); the passes' repeats and their rounds last (a pass again changes
    the engine's state).  (runs, the rounds, the sampling record)"""
    started = time.monotonic()
    runs = build_engines(args, kits, ranks)
    rounds, record = [], {"resolved_at": {}}
    step_all(runs, range(1, args.warmup), timed=False)
    index = memory_steps(runs, ranks, args.warmup, record)
    for count, kind in ((args.steps, {"timed": True}),
                        (args.profiled_steps, {"timed": False, "profiled": True})):
        index = asked_steps(args, runs, ranks, started, index, count, record, **kind)
    index = sample_rounds(args, runs, ranks, started, index, rounds, record)
    for repeat in range(args.pass_repeats):
        for run in rotated(runs, repeat):
            run.repeat_pass()
    pass_rounds(args, runs, ranks, started, rounds, record)
    record["sampling_s"] = round(time.monotonic() - started, 1)
    return runs, rounds, record


def memory_steps(runs: Sequence[EngineRun], ranks, index: int, record: dict) -> int:
    """:data:`MEMORY_STEPS` memory steps of every engine, then more while any engine's
    smallest has not come twice on any rank (``EngineRun.memory_settled``),
    :data:`MEMORY_STEPS_CAP` in all (every engine steps: their training stays in step); their
    count in ``record["memory_steps"]``; the next step index."""
    taken = 0
    while taken < MEMORY_STEPS or (taken < MEMORY_STEPS_CAP and not all(
            ranks.all_gather(all(run.memory_settled() for run in runs)))):
        step_all(runs, range(index, index + 1), timed=False, memory_cpu=own_cpu(ranks.rank))
        index, taken = index + 1, taken + 1
    record["memory_steps"] = taken
    return index


def asked_steps(args, runs, ranks, started, index: int, count: int, record, **kind) -> int:
    """Up to ``count`` steps of every engine (paired), fewer when the budget is spent first
    (never fewer than an interval's 2; ``record["cut"]`` notes it); the next step index."""
    for taken in range(count):
        elapsed = max(ranks.all_gather(time.monotonic() - started))
        if taken >= 2 and args.budget_s > 0 and elapsed >= args.budget_s:
            record.setdefault("cut", []).append(f"{taken} of {count} "
                                                f"{'profiled' if kind.get('profiled') else 'timed'}"
                                                " steps asked (budget spent)")
            break
        step_all(runs, range(index, index + 1), **kind)
        index += 1
    return index


def own_cpu(rank: int) -> int:
    """The CPU this rank's memory steps run on (one each: :func:`run_behind_gc`)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[rank % len(cpus)]


def rotated(runs: Sequence[EngineRun], k: int) -> List[EngineRun]:
    """``runs`` rotated by ``k``: each engine's turn moves by one each round (paired)."""
    shift = k % len(runs)
    return list(runs[shift:]) + list(runs[:shift])


def _decide(args, runs, ranks, started, record, sources,
            reserve: Callable[[List[dict]], float]):
    """Rank 0's plan of the next round for ``sources`` (``bench_engine_rounds.plan_round``),
    on every rank; the goals' first resolutions noted in ``record``."""
    gathered = ranks.all_gather({"timing": [run.timing() for run in runs],
                                 "elapsed": time.monotonic() - started})
    plan = None
    if ranks.rank == 0:
        rows = [timing_row(run, [g["timing"][i] for g in gathered]) for i, run in enumerate(runs)]
        goal_list = goals(rows)
        record_resolutions(record["resolved_at"], goal_list)
        left = args.budget_s - max(g["elapsed"] for g in gathered) - reserve(rows)
        plan = plan_round(rows, goal_list, left, sources)
        if plan is not None:
            print(f"rank 0: {max(g['elapsed'] for g in gathered):.0f} of {args.budget_s:g} s; "
                  f"round: {describe_round(plan)}", file=sys.stderr, flush=True)
    return ranks.all_gather(plan)[0]


def sample_rounds(args, runs, ranks, started, index: int, rounds: list, record) -> int:
    """Rounds of timed and profiled steps for the engines of the unresolved goals nearest to
    resolving (``plan_round``), until none is left or the budget is spent (less the passes'
    reserve); returns the next step index."""
    by_label = {(run.m, f"{run.name} {run.impl}"): run for run in runs}
    while args.budget_s > 0:
        plan = _decide(args, runs, ranks, started, record, ("timed", "profiled"),
                       lambda rows: reserve_s(rows, args.pass_repeats))
        if plan is None:
            break
        for source, kind in (("timed", {"timed": True}),
                             ("profiled", {"timed": False, "profiled": True})):
            chosen = [by_label[tuple(e)] for e in plan["engines"].get(source, ())]
            count = plan["samples"].get(source, 0)
            step_all(chosen, range(index, index + count), common=False, **kind)
            index += count
        rounds.append(plan)
    return index


def pass_rounds(args, runs, ranks, started, rounds: list, record) -> None:
    """Rounds of the passes' repeats while the pass goal is unresolved and the budget lasts."""
    by_label = {(run.m, f"{run.name} {run.impl}"): run for run in runs}
    while args.budget_s > 0:
        plan = _decide(args, runs, ranks, started, record, ("pass",),
                       lambda rows: RESERVE_MARGIN_S)
        if plan is None:
            break
        chosen = [by_label[tuple(e)] for e in plan["engines"]["pass"]]
        for repeat in range(plan["samples"]["pass"]):
            for run in rotated(chosen, repeat):
                run.repeat_pass()
        rounds.append(plan)


def worker(args) -> int:
    from pipesplit.tools.bench.bench_multirank import join_workers

    ranks = join_workers("bench_engine")
    if ranks is None:
        return 2
    from pipesplit.passes import cpu_support

    cpu_support.enable()  # both impls: a CPU build's gaps in the engine

    kits = {m: KITS[args.model](args, m, EXAMPLES) for m in args.ms}
    with serial_executor():  # ops in program order on this thread: the memory steps' exact bytes
        runs, rounds, record = time_engines(args, kits, ranks)
    gathered = [ranks.all_gather(run.result()) for run in runs]
    sims = [simulated(run.schedule, run.vpp) for run in runs] if ranks.rank == 0 else None
    has_reference = {r.m for r in runs if (r.name, r.impl) == REFERENCE}
    references = {} if ranks.rank != 0 else {
        m: kit.reference_losses() for m, kit in kits.items() if m not in has_reference}
    if ranks.rank == 0:
        rows = [make_row(run, own, sim) for run, own, sim in zip(runs, gathered, sims)]
        for m in args.ms:
            add_loss_diffs([r for r in rows if r["m"] == m], references.get(m))
        with open(args.result, "w") as f:
            json.dump({"model": kits[args.ms[0]].describe(), "pp": PP, "m": args.ms,
                       "steps": args.steps, "warmup": args.warmup,
                       "budget_s": args.budget_s,
                       "rounds": rounds, **record, "rows": rows}, f, indent=1)
    ranks.leave()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip Paddle's teardown (the gloo context may block on a gone peer)


def paired_steps(gathered: Sequence[dict]) -> List[float]:
    """Each timed step's ms: the last rank's end minus the first rank's start."""
    return [(max(g["spans"][i][1] for g in gathered) - min(g["spans"][i][0] for g in gathered))
            * 1e3 for i in range(len(gathered[0]["spans"]))]


def timing_row(run: EngineRun, gathered: Sequence[dict]) -> dict:
    """The fields the goals read, from every rank's :meth:`EngineRun.timing`."""
    steps = paired_steps(gathered)
    jobs = [list(step) for step in zip(*(g["job_steps"] for g in gathered))]  # [step][rank]
    return {"schedule": run.name, "impl": run.impl, "m": run.m, "vpp": run.vpp, "pp": PP,
            "step_ms": statistics.median(steps), "step_ms_spread": iqr(steps),
            "step_ms_all": steps, "step_ids": gathered[0]["step_ids"],
            "peak_bytes": [g["peak_bytes"] for g in gathered],
            "exact_peak": all(g["exact_peak"] for g in gathered),
            "process_peak_bytes": [g["process_peak_bytes"] for g in gathered],
            "budget_bytes": gathered[0]["budget_bytes"],
            "job_ms_steps": jobs, "job_ms": jobs[-1] if jobs else None,
            # the table's: the last profiled step (the first records allocations too)
            "profiled_step_ms": max(g["profiled_ms"][-1] for g in gathered) if jobs else None,
            # every profiled step's slowest rank (the bubble goal's floor reads them)
            "profiled_ms_all": [max(ms) for ms in zip(*(g["profiled_ms"] for g in gathered))],
            "pass_ms": max(g["pass_ms"] for g in gathered),
            # each repeat's slowest rank (the engine waits for both)
            "pass_ms_all": [max(ms) for ms in zip(*(g["pass_ms_repeats"] for g in gathered))]}


def make_row(run: EngineRun, gathered: Sequence[dict], sim: dict) -> dict:
    per_rank = {key: [g[key] for g in gathered] for key in gathered[0]
                if key not in ("losses", "memory")}
    return {**timing_row(run, gathered),
            **{key: per_rank[key] for key in ("resident_bytes", "transient_bytes",
                                              "exact_transients")},
            "pass_ms_per_rank": per_rank["pass_ms"],
            "prepare_ms": max(per_rank["prepare_ms"]), "replanned": gathered[0]["replanned"],
            "backward_ops": per_rank["backward_ops"],
            "program_ops": per_rank["program_ops"],
            "losses": next((g["losses"] for g in gathered if g["losses"] is not None), None),
            "memory_model": measured_model(run.schedule, gathered, PP), **sim}


# =========================================================================== parent

def main(argv: Optional[Sequence[str]] = None) -> int:
    from pipesplit.tools._console import checked_args
    from pipesplit.tools.bench.bench_multirank import _without, launch_workers

    argv = list(sys.argv[1:] if argv is None else argv)
    args = checked_args("bench_engine", argv, make_parser(), check_args)
    if args is None:
        return 2
    if args.worker:
        return worker(args)

    t0 = time.perf_counter()
    report = launch_workers(__file__, _without(argv, ("--json", "--log-dir")), args.log_dir,
                            LAUNCH_TIMEOUT_S + args.budget_s)
    add_goals(report)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    print(format_report(report))
    print(f"({report['wall_s']:.0f} s in all)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measured step time, memory and pass time of Paddle's auto-parallel engine per schedule:
Paddle's own pipeline passes against pipesplit's, one model, two CPU processes.

    python tools/bench/bench_engine.py [--model {gpt,llama}] [--steps 10] [--warmup 3] [-m 4,8]
        [--schedules FThenB,1F1B,...] [--budget-s 600] [--quick] [--json PATH]

The parent launches ``python -m paddle.distributed.launch --nproc_per_node 2`` on this file
(``--worker``), one compute thread per rank (as ``tools/bench/bench_multirank.py``).  Each process
builds one ``DistModel`` per (schedule, impl) with ``dist.to_static`` from the example's own
builders (``examples/auto_parallel_pipeline.py``; ``examples/llama_auto_parallel.py`` at pp 2),
each in its own name generator and scope, same seed, same batches.  Paddle's controls (impl
``paddle``: FThenB, 1F1B; Paddle's VPP does not run on the CPU transport) are built and stepped
with ``pipesplit.passes.strategy.disable_strategy()``, as the examples' ``--paddle``;
pipesplit's with ``enable_strategy()``; ``cpu_support`` stays on for both.  Every m of ``-m``
(default 4 and 8) gets its own engines, all stepped together in the same processes.

Measured per (schedule, impl):

* **step ms**: after the warm-up, step k of every engine (order rotated by one per step: paired)
  before step k + 1 of any.  Both ranks first meet in a barrier of the launcher's gloo group
  (not the TCP store, whose blocking ``get`` wakes a waiter later); a step is the last rank's
  end minus the first rank's start of ``dist_model(x, y)`` (``time.monotonic``, system-wide);
  median and interquartile range.  Every step's time is kept (``step_ms_all``): step i of two
  engines forms a pair for the goals;
* **peak bytes** per rank, Paddle's host allocator statistics (process RSS hides its cache):
  *resident* (allocated bytes the engine added from before its model was built to after its
  first step, GC settled: parameters, optimizer states, gradient buffers) + *transient* (the
  allocator's peak during a step minus the bytes at its start; smallest over the timed steps,
  a lagging GC thread only raises it);
* **pass ms**: time inside the pipeline pass while the engine is prepared (``to_static``,
  ``train()``, first step), by a wrapper installed only then, only in this process, around the
  engine module's ``pipeline_pass`` and ``pir_pass``'s (Paddle's own, or pipesplit's
  ``engine_hooks.pipeline_pass``) and, for pipesplit, ``engine_hooks.open_engine_state`` (it builds
  the schedule the pass reuses).  One untimed engine per impl is built first: the first
  preparation in a process pays one-time costs (imports, first calls);
* **auto**: as a user gets it, no cost file: it measures its jobs in step 1 and re-plans
  (``pipesplit.passes.measure.replan``); step 2 builds the new plan's executor, so the default warm-up
  is 3 steps.  Its row carries the costs it measured;
* **max loss diff**: largest |loss - reference| over every step and micro-batch; reference:
  Paddle's 1F1B through the same engine (clipping off: Paddle clips the SUM of the micro-batch
  gradients), else the example's one-process dygraph reference.

The issues' goals (``bench_engine_report.goals``) are each a bound on the median of paired
per-step ratios, with a bootstrap interval and a verdict, met / missed / unresolved
(``tools/bench/verdicts.py``).  After the ``--steps`` asked, while a goal is unresolved and the
timing loop (warm-up included) has run under ``--budget-s`` seconds, every engine steps on in
rounds (paired as before; a round as long as the nearest goal's estimate of the steps it needs,
at most the steps timed so far, and what the budget's rest fits), the goals recomputed after
each.  On a miss, the simulator's figures beside the measured.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import List, Optional, Sequence

if __package__ in (None, ""):  # run as a script by paddle.distributed.launch
    # the script's folder would shadow modules (tools/profile.py the standard library's)
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from pipesplit.tools.bench.bench_engine_report import (REFERENCE, add_goals,  # noqa: E402
                                                 add_loss_diffs, format_report, goals,
                                                 job_summary)
from pipesplit.tools.bench.memory_model import measured_model, profiled_step  # noqa: E402
from pipesplit.tools.bench.verdicts import iqr  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))),
                        "examples")
PP = 2
#: (schedule, vpp) in the table's order
SCHEDULES = (("FThenB", 1), ("1F1B", 1), ("ZBH1", 1), ("ZBH2", 1), ("VPP", 2), ("ZBV", 2),
             ("DualPipeV", 2), ("auto", 1))
#: schedules Paddle's own pass serves on the CPU transport (the controls)
PADDLE_SCHEDULES = ("FThenB", "1F1B")
#: the examples' size options: compute-bound (a job of tens of ms, far above the executor's
#: per-op cost) and --quick (the examples' test sizes)
_COMPUTE_BOUND = ["--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "64", "--vocab",
                  "256", "--micro-batch-size", "4"]
SIZES = {("gpt", False): _COMPUTE_BOUND,
         ("gpt", True): ["--layers", "4", "--hidden", "16", "--heads", "2", "--seq", "8",
                         "--vocab", "32", "--micro-batch-size", "2"],
         ("llama", False): _COMPUTE_BOUND + ["--clip", "0", "--pp", str(PP)],
         ("llama", True): ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq", "8", "--vocab",
                           "64", "--micro-batch-size", "2", "--clip", "0", "--pp", str(PP)]}
#: -m's default: m = 4 (where 1F1B's bubble leaves room for the fastest-schedule goal) beside 8;
#: --quick one small m
DEFAULT_M = {False: "4,8", True: "4"}
#: the launch's time limit on top of --budget-s (building the engines, the profiled step)
LAUNCH_TIMEOUT_S = 1800
#: --budget-s's default: seconds of the timing loop (warm-up included) a run may spend
DEFAULT_BUDGET_S = 600.0
#: the shortest round of further steps (one step moves a median too little to re-check)
ROUND_MIN_STEPS = 2


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
    p.add_argument("--schedules", default=",".join(name for name, _ in SCHEDULES),
                   help="comma list; FThenB and 1F1B run with both impls")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help="after --steps, step on in rounds while a goal is unresolved, until the "
                        "timing loop has run this many seconds (0: never)")
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


# =========================================================================== the models

def _example(name: str):
    """An example module, imported by path (examples/ is no package)."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return __import__(name)


class Kit:
    """An example's model, optimizer, data and strategy, from the example's own functions."""

    module = ""

    def __init__(self, args, m: int):
        self.ex = _example(self.module)
        self.base = SIZES[(args.model, args.quick)]
        # the steps asked + the profiled one; a longer run cycles through these batches
        self.sizes = self.base + ["-m", str(m), "--steps", str(args.warmup + args.steps + 1)]
        self.args = self.parse([])

    def parse(self, extra: Sequence[str]):
        return self.ex.parse_args(self.sizes + list(extra))

    def describe(self) -> str:
        return f"examples/{self.module}.py {' '.join(self.base)} ({self.args.optimizer})"


class GptKit(Kit):
    """Blocks on the stage meshes in model order (the engine or pipesplit re-places them for
    vpp 2), a plain DataLoader, the example's SGD."""

    module = "auto_parallel_pipeline"

    def build(self, name: str, vpp: int):
        import paddle
        import paddle.distributed as dist

        a = self.parse(["--schedule", name, "--vpp", str(vpp)])
        world = dist.get_world_size()
        meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
        model = self.ex.build(a, [meshes[i * world // a.layers] for i in range(a.layers)])
        opt = self.ex.make_optimizer(a, model.parameters())
        loader = paddle.io.DataLoader(self.ex.TokenData(a.steps * a.batch, a.seq, a.vocab, a.seed),
                                      batch_size=a.batch, shuffle=False)
        return dist.to_static(model, loader, self.ex.lm_loss, opt, self.ex.make_strategy(a)), \
            opt, loader

    def reference_losses(self) -> List[List[float]]:
        return self.ex.reference(self.args)[0]["losses"]


class LlamaKit(Kit):
    """dp 1, pp 2, mp 1: the example's global mesh, sharded loader, AdamW and LinearWarmup;
    global-norm clipping off (see the module doc)."""

    module = "llama_auto_parallel"

    def __init__(self, args, m: int):
        import numpy as np
        import paddle.distributed as dist

        dist.auto_parallel.set_mesh(dist.ProcessMesh(
            np.arange(PP).reshape(1, PP, 1).tolist(), ["dp", "pp", "mp"]))
        super().__init__(args, m)

    def parse(self, extra: Sequence[str]):
        import paddle.distributed as dist

        a = super().parse(extra)
        self.ex.check_degrees(a, dist.get_world_size())
        return a

    def build(self, name: str, vpp: int):
        import paddle.distributed as dist

        a = self.parse(["--schedule", name, "--vpp", str(vpp)])
        model = self.ex.build(a, a.pp)
        opt = self.ex.make_optimizer(a, model)
        loader = self.ex.make_loader(a, self.ex.TokenData(a.steps * a.batch, a.seq, a.vocab,
                                                          a.seed))
        return dist.to_static(model, loader, self.ex.LlamaCriterion(distributed=True), opt,
                              self.ex.make_strategy(a)), opt, loader

    def reference_losses(self) -> List[List[float]]:
        return self.ex.reference(self.args)[0]


KITS = {"gpt": GptKit, "llama": LlamaKit}


# =========================================================================== measuring

class PassTimer:
    """Wall time spent in the pipeline pass (and pipesplit's strategy check), summed over the
    calls made while installed.  Installed around whatever the names hold at the time (Paddle's
    or pipesplit's functions), after the strategy is switched for the engine and removed
    before it is switched again (the patch door must never record the timer as Paddle's)."""

    TARGETS = (("paddle.distributed.auto_parallel.static.engine", "pipeline_pass"),
               ("paddle.distributed.auto_parallel.static.pir_pass", "pipeline_pass"),
               ("pipesplit.passes.engine.hooks", "open_engine_state"))

    def __init__(self):
        self.seconds = 0.0
        self._depth = 0  # a timed function calling another counts once
        self._saved = []

    def _wrap(self, function):
        def timed(*args, **kwargs):
            self._depth += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - start
        return timed

    @contextlib.contextmanager
    def installed(self):
        import importlib

        for module_name, attr in self.TARGETS:
            module = importlib.import_module(module_name)
            original = getattr(module, attr)
            wrapper = self._wrap(original)
            setattr(module, attr, wrapper)
            self._saved.append((module, attr, original, wrapper))
        try:
            yield self
        finally:
            for module, attr, original, wrapper in reversed(self._saved):
                if getattr(module, attr) is not wrapper:
                    raise RuntimeError(f"{module.__name__}.{attr} was replaced while timed")
                setattr(module, attr, original)
            self._saved.clear()


def use_impl(impl: str) -> None:
    """Paddle's own engine passes (``disable_strategy``, as the examples' ``--paddle``) or
    pipesplit's; both idempotent, outside any timed window."""
    from pipesplit.passes import strategy

    (strategy.disable_strategy if impl == "paddle" else strategy.enable_strategy)()


class EngineRun:
    """One (schedule, impl)'s DistModel with its own names and scope, stepped on demand."""

    def __init__(self, kit, name: str, impl: str, vpp: int, batches, memory, barrier):
        import paddle

        self.name, self.impl, self.vpp, self.m = name, impl, vpp, kit.args.m
        self.memory, self.barrier = memory, barrier
        self.scope = paddle.static.Scope()
        self.spans, self.losses, self.transient = [], [], []
        self.jobs, self.profiled_span = [], (0.0, 0.0)
        self.memory_figures = None  # pipesplit's engines: rank_memory of the profiled step
        use_impl(impl)
        before = memory.settled_current()
        timer = PassTimer()
        started = time.perf_counter()
        with self._guards(fresh=True), timer.installed():
            self.dist_model, self.opt, loader = kit.build(name, vpp)
            self.dist_model.train()
            self.prepare_ms = (time.perf_counter() - started) * 1e3
            self.batches = batches if batches is not None else [tuple(b) for b in loader]
            self.step(0, timed=False)  # the first run may prepare the rest of the plan
        self.pass_ms = timer.seconds * 1e3
        self.resident = memory.settled_current() - before
        self.first_schedule = self._built_schedule()

    @property
    def replanned(self):
        """pipesplit's re-plan of this engine (auto measures step 1), or None."""
        from pipesplit.passes.strategy import replanned

        return replanned(self.dist_model) if self.impl == "pipesplit" else None

    @property
    def schedule(self):
        """The schedule the engine runs now (auto's after its re-plan)."""
        done = self.replanned
        return self.first_schedule if done is None else done.after.schedule

    @contextlib.contextmanager
    def _guards(self, fresh: bool = False):
        """This engine's scope and name generator (fresh names at the build, as in a new
        process; the same generator again for each step)."""
        import paddle
        from paddle.base import unique_name

        with paddle.static.scope_guard(self.scope):
            with paddle.utils.unique_name.guard(None if fresh else self.names):
                if fresh:
                    self.names = unique_name.generator
                try:
                    yield
                finally:
                    paddle.disable_static()  # a failed build may leave the static mode on

    def _built_schedule(self):
        """The schedule the engine runs: pipesplit's own plan, or (Paddle's pass) pipesplit's
        schedule of the same name, for the simulator's figures."""
        if self.impl == "pipesplit":
            from pipesplit.passes.strategy import last_pipeline

            return last_pipeline().schedule
        from pipesplit.job_list.request import PipelineConfig
        from pipesplit.job_list.request import make_schedule

        return make_schedule(PipelineConfig.from_attrs(self.name, dict(
            num_micro_batches=self.m, pp_degree=PP, vpp_degree=self.vpp)))

    def step(self, index: int, timed: bool, profiled: bool = False) -> None:
        """Step ``index`` of this engine; both ranks meet in the barrier first.  ``profiled``:
        under Paddle's profiler (untimed), its jobs kept as ``self.jobs``."""
        import numpy as np
        import paddle

        x, y = self.batches[index % len(self.batches)]
        use_impl(self.impl)
        with self._guards():
            if timed or profiled:
                self.memory.settled_current()  # the previous run's frees done
                self.memory.reset_peak()
                start_bytes = self.memory.current()
            self.barrier()
            t0 = time.monotonic()
            if profiled:
                loss, self.jobs, self.memory_figures = profiled_step(
                    lambda: self.dist_model(x, y), self.dist_model, start_bytes,
                    with_memory=self.impl == "pipesplit")
            else:
                loss = self.dist_model(x, y)
            t1 = time.monotonic()
            if profiled:
                self.profiled_span = (t0, t1)
            if timed:
                self.spans.append((t0, t1))
                self.transient.append(self.memory.peak() - start_bytes)
        if loss is not None:
            self.losses.append(np.asarray(loss, np.float64).reshape(-1).tolist())
        if isinstance(self.opt._learning_rate, paddle.optimizer.lr.LRScheduler):
            self.opt._learning_rate.step()

    def timing(self) -> dict:
        """What the goals read: the timed steps' spans, peak bytes and pass time."""
        return {"spans": self.spans, "peak_bytes": int(self.resident + min(self.transient)),
                "pass_ms": self.pass_ms}

    def result(self) -> dict:
        done = self.replanned
        return {**self.timing(), "losses": self.losses or None, "jobs": self.jobs,
                "profiled_ms": (self.profiled_span[1] - self.profiled_span[0]) * 1e3,
                "replanned": None if done is None else {"step": done.step,
                                                        "costs": done.costs.to_dict()},
                "prepare_ms": self.prepare_ms, "memory": self.memory_figures,
                "resident_bytes": int(self.resident), "transient_bytes": int(min(self.transient))}


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
    for m, name, impl, vpp in args.entries:
        runs.append(EngineRun(kits[m], name, impl, vpp, batches.get(m), memory, ranks.barrier))
        batches.setdefault(m, runs[-1].batches)
        print(f"rank {ranks.rank}: built {name} ({impl}, m {m}) in {runs[-1].prepare_ms:.0f} "
              f"ms, pass {runs[-1].pass_ms:.1f} ms", file=sys.stderr, flush=True)
    return runs


def step_all(runs: Sequence[EngineRun], steps: range, warmup: int) -> None:
    """Steps ``steps`` of every engine, paired: step k of every engine (order rotated by one
    per step) before step k + 1 of any."""
    for step in steps:
        shift = step % len(runs)
        for run in list(runs[shift:]) + list(runs[:shift]):
            run.step(step, timed=step >= warmup)


def time_engines(args, kits, ranks):
    """Build every engine, run the warm-up and the steps asked, then rounds of further steps
    while a goal is unresolved and the budget lasts (:func:`next_round`), then one profiled
    step each.  (runs, the rounds' lengths, the timing loop's seconds)"""
    runs = build_engines(args, kits, ranks)
    started, end, rounds = time.monotonic(), args.warmup + args.steps, []
    step_all(runs, range(1, end), args.warmup)
    while True:
        more = next_round(args, runs, ranks, time.monotonic() - started, end)
        if not more:
            break
        step_all(runs, range(end, end + more), args.warmup)
        end += more
        rounds.append(more)
    seconds = time.monotonic() - started
    for run in runs:  # each schedule's own job times, for the report's "why"
        run.step(end, timed=False, profiled=True)
    return runs, rounds, seconds


def next_round(args, runs: Sequence[EngineRun], ranks, elapsed: float, done: int) -> int:
    """How many more steps every engine runs (0: stop).  Rank 0 decides from both ranks'
    times and tells rank 1, so both step alike."""
    if args.budget_s <= 0:
        return 0
    gathered = ranks.all_gather({"timing": [run.timing() for run in runs], "elapsed": elapsed})
    more = round_steps(args, runs, gathered, done) if ranks.rank == 0 else 0
    return ranks.all_gather(more)[0]


def round_steps(args, runs: Sequence[EngineRun], gathered: Sequence[dict], done: int) -> int:
    """0 when every goal is resolved or the budget is spent; else the unresolved goals'
    nearest estimate of the steps they need, at least ROUND_MIN_STEPS, at most the steps
    timed so far (the estimate assumes the spread holds: re-check it at twice the sample),
    and at most what the rest of the budget fits at the pace so far (``done`` - 1 steps of
    every engine, warm-up included)."""
    elapsed = max(g["elapsed"] for g in gathered)
    left = args.budget_s - elapsed
    if left <= 0:
        return 0
    rows = [timing_row(run, [g["timing"][i] for g in gathered]) for i, run in enumerate(runs)]
    unresolved = [g for g in goals(rows) if g["verdict"] == "unresolved"]
    if not unresolved:
        return 0
    timed = len(rows[0]["step_ms_all"])
    nearest = min(g["steps_to_resolve"] for g in unresolved)
    fits = max(1, int(left / (elapsed / (done - 1))))
    more = min(max(nearest, ROUND_MIN_STEPS), max(timed, ROUND_MIN_STEPS), fits)
    print(f"rank 0: {timed} steps timed, {elapsed:.0f} of {args.budget_s:g} s; unresolved: "
          + ", ".join(f"m={g['m']} {g['name']} (~{g['steps_to_resolve']})" for g in unresolved)
          + f"; {more} more", file=sys.stderr, flush=True)
    return more


def worker(args) -> int:
    from pipesplit.tools.bench.bench_multirank import join_workers

    ranks = join_workers("bench_engine")
    if ranks is None:
        return 2
    from pipesplit.passes import cpu_support

    cpu_support.enable()  # both impls: a CPU build's gaps in the engine

    kits = {m: KITS[args.model](args, m) for m in args.ms}
    runs, rounds, seconds = time_engines(args, kits, ranks)
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
                       "steps": args.steps, "timed_steps": len(rows[0]["step_ms_all"]),
                       "warmup": args.warmup, "budget_s": args.budget_s, "rounds": rounds,
                       "timing_s": round(seconds, 1), "rows": rows}, f, indent=1)
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
    return {"schedule": run.name, "impl": run.impl, "m": run.m, "vpp": run.vpp,
            "step_ms": statistics.median(steps), "step_ms_spread": iqr(steps),
            "step_ms_all": steps, "peak_bytes": [g["peak_bytes"] for g in gathered],
            "pass_ms": max(g["pass_ms"] for g in gathered)}


def make_row(run: EngineRun, gathered: Sequence[dict], sim: dict) -> dict:
    per_rank = {key: [g[key] for g in gathered] for key in gathered[0]
                if key not in ("losses", "memory")}
    profiled = max(g["profiled_ms"] for g in gathered)
    return {**timing_row(run, gathered),
            **{key: per_rank[key] for key in ("resident_bytes", "transient_bytes")},
            "pass_ms_per_rank": per_rank["pass_ms"],
            "prepare_ms": max(per_rank["prepare_ms"]), "replanned": gathered[0]["replanned"],
            "profiled_step_ms": profiled, "job_ms": [job_summary(g["jobs"]) for g in gathered],
            "losses": next((g["losses"] for g in gathered if g["losses"] is not None), None),
            "memory_model": measured_model(run.schedule, gathered, PP), **sim}


# =========================================================================== parent

def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        print(f"bench_engine: error: {exc}", file=sys.stderr)
        return 2
    if args.worker:
        return worker(args)
    from pipesplit.tools.bench.bench_multirank import _without, launch_workers

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

"""The engines ``tools/bench/bench_engine.py`` times: the examples' models (kits), the pass
timer, one (schedule, impl)'s ``DistModel`` stepped on demand, and ``auto``'s memory budget
measured on Paddle's 1F1B.  See bench_engine's doc for what each figure means."""
from __future__ import annotations

import contextlib
import gc
import sys
import time
from typing import List, Optional, Sequence

from pipesplit.tools.bench.bench_engine_report import BUDGET_SCHEDULE
from pipesplit.tools.bench.memory_model import profiled_step

PP = 2

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

# =========================================================================== the models

def _example(name: str, examples: str):
    """An example module, imported by path from the clone's ``examples`` folder (no package)."""
    if examples not in sys.path:
        sys.path.insert(0, examples)
    return __import__(name)


class Kit:
    """An example's model, optimizer, data and strategy, from the example's own functions."""

    module = ""

    def __init__(self, args, m: int, examples: str):
        self.ex = _example(self.module, examples)
        self.base = list(SIZES[(args.model, args.quick)])
        for option, value in (("--layers", args.layers), ("--hidden", args.hidden)):
            if value is not None:
                self.base[self.base.index(option) + 1] = str(value)
        # the steps asked + the profiled ones; a longer run cycles through these batches
        self.sizes = self.base + ["-m", str(m), "--steps",
                                  str(args.warmup + args.steps + args.profiled_steps)]
        self.args = self.parse([])

    def parse(self, extra: Sequence[str]):
        return self.ex.parse_args(self.sizes + list(extra))

    def describe(self) -> str:
        return f"examples/{self.module}.py {' '.join(self.base)} ({self.args.optimizer})"

    def strategy(self, a, budget: Optional[int]):
        """The example's strategy; with ``budget``, ``auto``'s memory budget in bytes."""
        strategy = self.ex.make_strategy(a)
        if budget is not None:
            from pipesplit.passes import strategy as pipesplit_strategy

            pipesplit_strategy.use_memory_budget(strategy, budget)
        return strategy


class GptKit(Kit):
    """Blocks on the stage meshes in model order (the engine or pipesplit re-places them for
    vpp 2), a plain DataLoader, the example's SGD."""

    module = "auto_parallel_pipeline"

    def build(self, name: str, vpp: int, budget: Optional[int] = None):
        import paddle
        import paddle.distributed as dist

        a = self.parse(["--schedule", name, "--vpp", str(vpp)])
        world = dist.get_world_size()
        meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
        model = self.ex.build(a, [meshes[i * world // a.layers] for i in range(a.layers)])
        opt = self.ex.make_optimizer(a, model.parameters())
        loader = paddle.io.DataLoader(self.ex.TokenData(a.steps * a.batch, a.seq, a.vocab, a.seed),
                                      batch_size=a.batch, shuffle=False)
        return dist.to_static(model, loader, self.ex.lm_loss, opt, self.strategy(a, budget)), \
            opt, loader

    def reference_losses(self) -> List[List[float]]:
        return self.ex.reference(self.args)[0]["losses"]


class LlamaKit(Kit):
    """dp 1, pp 2, mp 1: the example's global mesh, sharded loader, AdamW and LinearWarmup;
    global-norm clipping off (see the module doc)."""

    module = "llama_auto_parallel"

    def __init__(self, args, m: int, examples: str):
        import numpy as np
        import paddle.distributed as dist

        dist.auto_parallel.set_mesh(dist.ProcessMesh(
            np.arange(PP).reshape(1, PP, 1).tolist(), ["dp", "pp", "mp"]))
        super().__init__(args, m, examples)

    def parse(self, extra: Sequence[str]):
        import paddle.distributed as dist

        a = super().parse(extra)
        self.ex.check_degrees(a, dist.get_world_size())
        return a

    def build(self, name: str, vpp: int, budget: Optional[int] = None):
        import paddle.distributed as dist

        a = self.parse(["--schedule", name, "--vpp", str(vpp)])
        model = self.ex.build(a, a.pp)
        opt = self.ex.make_optimizer(a, model)
        loader = self.ex.make_loader(a, self.ex.TokenData(a.steps * a.batch, a.seq, a.vocab,
                                                          a.seed))
        return dist.to_static(model, loader, self.ex.LlamaCriterion(distributed=True), opt,
                              self.strategy(a, budget)), opt, loader

    def reference_losses(self) -> List[List[float]]:
        return self.ex.reference(self.args)[0]


KITS = {"gpt": GptKit, "llama": LlamaKit}


# =========================================================================== measuring

def _cloned(value):
    """A PIR program (or a list of them) cloned; anything else as it is."""
    import paddle

    if isinstance(value, paddle.pir.Program):
        return value.clone()
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, paddle.pir.Program) for v in value):
        return type(value)(v.clone() for v in value)
    return value


class PassTimer:
    """Wall time spent in the pipeline pass (and pipesplit's strategy check), summed over the
    calls made while installed.  Installed around whatever the names hold at the time (Paddle's
    or pipesplit's functions), after the strategy is switched for the engine and removed
    before it is switched again (the patch door must never record the timer as Paddle's)."""

    TARGETS = (("paddle.distributed.auto_parallel.static.engine", "pipeline_pass"),
               ("paddle.distributed.auto_parallel.static.pir_pass", "pipeline_pass"),
               ("pipesplit.passes.engine.session", "open_engine_state"))
    #: the target whose first call :meth:`repeat` makes again
    PASS = "pipeline_pass"

    def __init__(self):
        self.seconds = 0.0
        self.open_seconds = 0.0  # of it, in open_engine_state (done once per engine)
        self.call = None  # (function, args) of the first outermost pipeline_pass call
        self._depth = 0  # a timed function calling another counts once
        self._saved = []

    def _wrap(self, function, attr: str):
        def timed(*args, **kwargs):
            outermost = self._depth == 0
            if outermost and attr == self.PASS and self.call is None:
                self.call = (function, args, kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1
                if outermost:
                    spent = time.perf_counter() - start
                    self.seconds += spent
                    if attr != self.PASS:
                        self.open_seconds += spent
        return timed

    def repeat(self) -> float:
        """Seconds of one more call of the recorded pipeline pass on fresh clones of its
        programs (the engine's are kept as they were), plus the engine's one
        ``open_engine_state`` (pipesplit builds its schedule there, once per engine)."""
        import paddle

        if self.call is None:
            raise RuntimeError("no pipeline pass was recorded for this engine")
        function, args, kwargs = self.call
        cloned = [_cloned(a) for a in args]
        with paddle.base.framework._dygraph_guard(None):  # the engine runs it in static mode
            start = time.perf_counter()
            function(*cloned, **kwargs)
            return time.perf_counter() - start + self.open_seconds

    @contextlib.contextmanager
    def installed(self):
        import importlib

        for module_name, attr in self.TARGETS:
            module = importlib.import_module(module_name)
            original = getattr(module, attr)
            wrapper = self._wrap(original, attr)
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

    def __init__(self, kit, name: str, impl: str, vpp: int, batches, memory, barrier,
                 budget: Optional[int] = None):
        import paddle

        self.name, self.impl, self.vpp, self.m = name, impl, vpp, kit.args.m
        self.memory, self.barrier, self.budget = memory, barrier, budget
        self.scope = paddle.static.Scope()
        self.spans, self.step_ids, self.losses, self.transient = [], [], [], []
        self.exact_transient = []  # the memory steps' (behind the GC thread: exact bytes)
        self.process_peaks = []  # the allocator's peak in each timed step (the whole process)
        self.job_steps, self.profiled_spans = [], []  # one entry per profiled step
        self.memory_figures = None  # pipesplit's engines: rank_memory of the profiled step
        use_impl(impl)
        gc.collect()  # no earlier engine's garbage freed inside this one's figures
        gc.disable()
        try:
            before = memory.settled_current()
            timer = PassTimer()
            started = time.perf_counter()
            with self._guards(fresh=True), timer.installed():
                self.dist_model, self.opt, loader = kit.build(
                    "auto" if name == BUDGET_SCHEDULE else name, vpp, budget)
                self.dist_model.train()
                self.prepare_ms = (time.perf_counter() - started) * 1e3
                self.batches = batches if batches is not None else [tuple(b) for b in loader]
                self.step(0, timed=False)  # the first run may prepare the rest of the plan
            self.resident = memory.settled_current() - before
        finally:
            gc.enable()
        self.pass_ms = timer.seconds * 1e3
        self.pass_timer = timer
        self.pass_ms_repeats: List[float] = []
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

    def step(self, index: int, timed: bool, profiled: bool = False,
             memory_cpu: Optional[int] = None, common: bool = True) -> None:
        """Step ``index`` of this engine; both ranks meet in the barrier first.  ``profiled``:
        under Paddle's profiler (untimed), its jobs appended to ``self.job_steps``.
        ``memory_cpu``: a memory step (untimed), run behind the executor's GC thread on that
        CPU (:func:`~pipesplit.ir_utils.measure.run_behind_gc`: the program's own peak, the
        same bytes in every run).  ``common``: every engine takes this step (its loss is
        compared with the reference's; rounds step only the engines a goal still needs)."""
        import numpy as np
        import paddle

        x, y = self.batches[index % len(self.batches)]
        use_impl(self.impl)
        with self._guards():
            if timed or profiled or memory_cpu is not None:
                if memory_cpu is not None:
                    gc.collect()
                    gc.disable()  # (a collection inside the step would lower its peak)
                self.memory.settled_current()  # the previous run's frees done
                self.memory.reset_peak()
                start_bytes = self.memory.current()
            self.barrier()
            t0 = time.monotonic()
            if profiled:  # the allocations too in the first (the memory model's figures)
                first = not self.job_steps
                loss, jobs, figures = profiled_step(
                    lambda: self.dist_model(x, y), self.dist_model, start_bytes,
                    with_memory=first and self.impl == "pipesplit")
                self.job_steps.append(jobs)
                if first:
                    self.memory_figures = figures
            elif memory_cpu is not None:
                from pipesplit.ir_utils.measure import run_behind_gc

                try:
                    loss = run_behind_gc(lambda: self.dist_model(x, y), memory_cpu)
                    self.exact_transient.append(self.memory.peak() - start_bytes)
                finally:
                    gc.enable()
            else:
                loss = self.dist_model(x, y)
            t1 = time.monotonic()
            if profiled:
                self.profiled_spans.append((t0, t1))
            if timed:
                self.spans.append((t0, t1))
                self.step_ids.append(index)
                self.transient.append(self.memory.peak() - start_bytes)
                self.process_peaks.append(self.memory.peak())
        if loss is not None and common:
            self.losses.append(np.asarray(loss, np.float64).reshape(-1).tolist())
        if isinstance(self.opt._learning_rate, paddle.optimizer.lr.LRScheduler):
            self.opt._learning_rate.step()

    def repeat_pass(self) -> None:
        """Time the engine's pipeline pass once more (:meth:`PassTimer.repeat`), in its own
        scope and names: only after its last step (pipesplit's pass records the plan it
        builds in the engine's state, and makes the plan's scope variables)."""
        use_impl(self.impl)
        with self._guards():
            self.pass_ms_repeats.append(self.pass_timer.repeat() * 1e3)

    def backward_ops(self) -> Optional[dict]:
        """pipesplit's backward sub-programs on this process: job type -> {op name: count}
        (the split goal's "why": what I + W run that B does not); None for Paddle's."""
        if self.impl != "pipesplit":
            return None
        from collections import Counter

        from pipesplit.passes.strategy import plan_of

        programs = plan_of(self.dist_model).split.programs
        return {job_type: dict(Counter(op.name() for op in program.global_block().ops))
                for job_type, program in programs.items() if job_type.startswith("backward")}

    def program_ops(self) -> Optional[int]:
        """Ops of the program pipesplit's pass split (the engine's, after its own passes)."""
        if self.impl != "pipesplit":
            return None
        from pipesplit.passes.strategy import plan_of

        return len(plan_of(self.dist_model).source_program.global_block().ops)

    def timing(self) -> dict:
        """What the goals read: the timed steps' spans (and their step indices: two engines'
        steps pair by index), the profiled steps' jobs, peak bytes and pass times."""
        from pipesplit.tools.bench.bench_engine_report import job_summary

        return {"spans": self.spans, "step_ids": self.step_ids,
                "job_steps": [job_summary(jobs) for jobs in self.job_steps],
                "profiled_ms": [(end - start) * 1e3 for start, end in self.profiled_spans],
                "peak_bytes": int(self.resident + self.transient_bytes()),
                "exact_peak": self.memory_settled(),
                # what a memory budget bounds (``auto-budget``): the process's own peak, the
                # smallest over the timed steps (a lagging free only raises one)
                "process_peak_bytes": int(min(self.process_peaks)), "budget_bytes": self.budget,
                "pass_ms": self.pass_ms, "pass_ms_repeats": self.pass_ms_repeats}

    def memory_settled(self) -> bool:
        """Whether the memory steps measured their smallest bytes twice: a free that lagged
        behind a step only raises its peak (by 2-17 MB at m = 8 here, some raised peaks
        repeating), the program's own peak is the smallest, and it repeats."""
        steps = self.exact_transient
        return len(steps) >= 2 and steps.count(min(steps)) >= 2

    def transient_bytes(self) -> int:
        """A step's bytes above its start: the memory steps' smallest (exact), else the timed
        steps' smallest (a lagging GC thread only raises one)."""
        return int(min(self.exact_transient or self.transient))

    def result(self) -> dict:
        done = self.replanned
        return {**self.timing(), "losses": self.losses or None,
                "replanned": None if done is None else {"step": done.step,
                                                        "costs": done.costs.to_dict(),
                                                        "memory": done.memory},
                "prepare_ms": self.prepare_ms, "memory": self.memory_figures,
                "backward_ops": self.backward_ops(), "program_ops": self.program_ops(),
                "resident_bytes": int(self.resident), "transient_bytes": self.transient_bytes(),
                "exact_transients": [int(t) for t in self.exact_transient]}

#: the steps Paddle's 1F1B takes to measure its peak for ``auto``'s budget (the smallest
#: transient of them counts, as for the rows)
BUDGET_PROBE_STEPS = 2


def memory_budget(kit, memory, ranks, kept: list) -> int:
    """The memory budget of the ``auto-budget`` engine: Paddle 1F1B's measured peak, as the
    rows measure it (resident + a step's smallest transient) on its worst rank (a budget is
    what each device holds: the most any process needs under 1F1B), on top of everything this
    process holds before the budgeted engine is built (a process holds every engine, the probe
    too, and ``auto``'s re-plan counts every byte it holds).  One budget for every process (the
    re-plan refuses differing ones): the smallest of the ranks' sums.  The probe engine is
    kept in ``kept`` (no engine is torn down midway).  Run it in a launch of its own (few
    engines: what the others allocate after their first step is not in ``held``)."""
    probe = EngineRun(kit, "1F1B", "paddle", 1, None, memory, ranks.barrier)
    for step in range(1, 1 + BUDGET_PROBE_STEPS):
        probe.step(step, timed=True)
    kept.append(probe)
    peak = max(ranks.all_gather(probe.timing()["peak_bytes"]))
    held = memory.settled_current()
    budget = min(ranks.all_gather(held + peak))
    print(f"rank {ranks.rank}: auto's budget {budget} bytes (Paddle 1F1B's peak {peak} on top of "
          f"the {held} held)", file=sys.stderr, flush=True)
    return budget

"""The one profiler of jobs: what each job of a plan takes in Paddle's executor, measured
two ways.

**The jobs one run executed** (what the engine's measured step and the benchmarks read):
:func:`record_jobs` runs ``run()`` under Paddle's host profiler; the standalone executor records
every job it runs as a ``<job type>-<micro-batch>`` event, whose wall time is the job's
(:func:`executed_jobs`; :func:`job_times` groups them by job type);
:func:`record_jobs_and_memory` records every allocation too.

**A model's jobs, probed one job type at a time** (``pipesplit profile``, the cost files
:func:`pipesplit.passes.strategy.use_costs` reads): :func:`profile_jobs` splits the model (once
with ``split_backward=True`` for forward / backward_b / backward_w / optimizer / send / recv,
once unsplit for the full backward) and runs small ``core.Plan`` s built with
:func:`~pipesplit.ir_utils.make_plan` on the standalone executor, into a :class:`Profile`:

* **time** of job type ``T`` (one chunk = one global stage): the plan ``P`` of every job type
  before ``T`` in a grouped F-then-B order (each type for every micro-batch: ``forward0 x m``,
  ``forward1 x m`` ... ``backward_b{S-1} x m``, ``backward_w{S-1} x m`` ...) is timed against
  ``P + [T for each micro-batch] * K`` (``K = max(inner, len(P) / m)``); the difference of the
  median run times, divided by ``K * m``, is one job's time.  Both executors are built once and
  their runs interleaved, so executor set-up and drift cancel.
* **live memory** of job type ``T``: the prefix plans are built with the skip-gc sets of the FULL
  order (a value a later, absent job still reads is kept), so after running a prefix on a fresh
  scope the allocator's current value holds exactly what the pipeline keeps alive at that
  point.  The growth across ``T``'s ``m`` jobs divided by ``m`` is ``T``'s live-memory delta per
  micro-batch; ``forward`` deltas are the activation bytes of one stage for one micro-batch,
  the unit of :func:`~pipesplit.job_list.simulate.simulate`'s memory model.

Times are milliseconds.  The measuring itself (allocator statistics, the serial executor, runs
behind the executor's garbage collector, timed plan runs) is :mod:`pipesplit.ir_utils.measure`;
a whole step of each schedule against the simulator is :mod:`.calibration`.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from pipesplit.job_list.ir import (BACKWARD, BACKWARD_B, BACKWARD_W, COMM_KINDS, COMPUTE_KINDS,
                                   FORWARD, OPTIMIZER, job_type, parse_job_type)
from pipesplit.job_list.simulate import Costs
from pipesplit.job_list.text import format_bytes, parse_size, text_table

from pipesplit.passes._paddle import require_supported_paddle

paddle = require_supported_paddle()

from pipesplit.ir_utils import init_scope, make_plan  # noqa: E402
from pipesplit.ir_utils.measure import (MemoryStats, TimedExecutor, gc_priority,  # noqa: E402
                                        median_time_difference, plan_with_gc_of,
                                        serial_executor)

STAGE_KINDS = COMPUTE_KINDS + COMM_KINDS  # the job kinds with one chunk (= global stage) each
FORMAT = "pipesplit-profile/1"


# --------------------------------------------------------------------------- Profile

@dataclass
class Profile:
    """Measured per-stage job times (ms) and live-memory deltas (bytes per micro-batch).

    ``times[kind]`` / ``memory[kind]``: one value per global stage for ``forward``,
    ``backward``, ``backward_b``, ``backward_w`` and the four send / recv kinds;
    ``times["optimizer"]`` is one number (the whole optimizer job).
    """

    times: Dict[str, Union[List[float], float]]
    memory: Dict[str, List[int]]
    meta: dict = field(default_factory=dict)

    # -- derived ---------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.times["forward"])

    @property
    def activation_bytes(self) -> List[int]:
        """Bytes one micro-batch's forward keeps alive per stage (the simulator's unit)."""
        return [max(0, int(x)) for x in self.memory["forward"]]

    @property
    def unit_bytes(self) -> int:
        """Bytes of one simulator memory unit: the largest stage's activations for one
        micro-batch (so a byte limit converted with it is never exceeded by any stage)."""
        return max(1, max(self.activation_bytes))

    @property
    def costs(self) -> Costs:
        t = self.times
        comm = [t[k][s] for k in COMM_KINDS for s in range(self.num_stages)]
        lo = _floor(t)
        return Costs(forward=_clamp(t["forward"], lo), backward=_clamp(t["backward"], lo),
                     backward_b=_clamp(t["backward_b"], lo), backward_w=_clamp(t["backward_w"], lo),
                     comm=max(0.0, round(statistics.median(comm), 6)) if comm else 0.0,
                     w_memory=self.w_memory)

    @property
    def w_memory(self) -> float:
        """Measured units held from the end of I to the end of W: what W frees, over what F
        allocates (median over stages); the simulator's 1/2 when W was not measured."""
        freed = self.memory.get("backward_w")
        ratios = [-w / f for w, f in zip(freed or [], self.activation_bytes) if f > 0]
        return round(max(0.0, statistics.median(ratios)), 3) if ratios else 0.5

    def bytes_to_units(self, n_bytes: float) -> float:
        return float(n_bytes) / self.unit_bytes

    # -- (de)serialisation --------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT,
                "costs": self.costs.to_dict(),
                "memory": {"unit_bytes": self.unit_bytes,
                           "activation_bytes": self.activation_bytes,
                           "job_delta_bytes": {k: list(v) for k, v in self.memory.items()}},
                "times_ms": {k: (list(v) if isinstance(v, (list, tuple)) else v)
                             for k, v in self.times.items()},
                "meta": dict(self.meta)}

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def from_dict(cls, data: dict) -> "Profile":
        if "times_ms" not in data or "memory" not in data:
            raise ValueError("not a pipesplit profile (needs 'times_ms' and 'memory')")
        missing = [k for k in ("forward", "backward_b", "backward_w") if k not in data["times_ms"]]
        if missing:
            raise ValueError(f"profile lacks job kinds {missing}")
        times = {k: (list(v) if isinstance(v, list) else v) for k, v in data["times_ms"].items()}
        memory = {k: list(v) for k, v in data["memory"]["job_delta_bytes"].items()}
        return cls(times, memory, dict(data.get("meta", {})))

    @classmethod
    def load(cls, path: str) -> "Profile":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    # -- report ---------------------------------------------------------------------------
    def table(self) -> str:
        kinds = [k for k in STAGE_KINDS if k in self.times]
        head = ["stage"] + [f"{k} ms" for k in kinds]
        rows = [head]
        for s in range(self.num_stages):
            rows.append([str(s)] + [f"{self.times[k][s]:.4g}" for k in kinds])
        out = [text_table(rows)]
        out.append(f"optimizer {self.times.get('optimizer', 0.0):.4g} ms (whole job)")
        mkinds = [k for k in COMPUTE_KINDS if k in self.memory]
        rows = [["stage"] + [f"{k} live delta" for k in mkinds]]
        for s in range(self.num_stages):
            rows.append([str(s)] + [format_bytes(self.memory[k][s]) for k in mkinds])
        out.append(text_table(rows))
        out.append(f"memory unit (largest stage's activations, one micro-batch): "
                   f"{format_bytes(self.unit_bytes)}")
        return "\n".join(out)


def _floor(times: Dict[str, object]) -> float:
    """Smallest time a cost may take: 5% of the median compute job (a measured difference at or
    below zero is noise around a job that costs next to nothing)."""
    values = [float(v) for k in ("forward", "backward_b", "backward_w")
              for v in times.get(k, ()) if float(v) > 0]
    return max(1e-6, 0.05 * statistics.median(values)) if values else 1e-3


def _clamp(values, floor):
    return tuple(float(f"{max(floor, float(v)):.4g}") for v in values)


def parse_memory(text: Union[str, float, int]) -> Tuple[float, bool]:
    """``"2GB"`` -> (2**31, True) bytes; ``"12"`` / ``12`` -> (12.0, False) simulator units.
    Suffixes B, KB, MB, GB, TB (binary, 1 KB = 1024 B; KiB ... accepted too:
    :func:`~pipesplit.job_list.text.parse_size`)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, is_bytes = float(text), False
    else:
        size = parse_size(str(text))
        if size is None:
            raise ValueError(f"memory limit must be a number of units or bytes with a suffix "
                             f"B/KB/MB/GB, got {text!r}")
        number, unit = size
        value, is_bytes = (number, False) if unit is None else (number * unit, True)
    if not value > 0:
        raise ValueError(f"memory limit must be > 0, got {text!r}")
    return value, is_bytes


# ----------------------------------------------------------------- the jobs a run executed

#: the executor's event whose children are the jobs it ran
_EXECUTOR_EVENT = "StandaloneExecutor::run"


def executed_job_spans(result) -> List[Tuple[str, int, int, int]]:
    """(job type, micro-batch, start ns, end ns) of every job the standalone executor ran, in
    run order, from a ``paddle.profiler`` result (its ``StandaloneExecutor::run`` events'
    children)."""
    runs = []
    stack = list(result.get_data().values())
    while stack:
        node = stack.pop()
        if node.name == _EXECUTOR_EVENT:
            runs.append(node)
        else:
            stack.extend(node.children_node)
    out = []
    for run in sorted(runs, key=lambda n: n.start_ns):
        for job in sorted(run.children_node, key=lambda n: n.start_ns):
            kind, _, micro_batch = job.name.rpartition("-")
            if kind and micro_batch.isdigit():
                out.append((kind, int(micro_batch), job.start_ns, job.end_ns))
    return out


def executed_jobs(result) -> List[Tuple[str, int, float]]:
    """(job type, micro-batch, milliseconds) of :func:`executed_job_spans`."""
    return [(t, mb, (end - start) / 1e6) for t, mb, start, end in executed_job_spans(result)]


def allocator_events(result) -> List[Tuple[int, int]]:
    """(ns, allocated bytes after it) of every allocation and free a ``paddle.profiler``
    result with ``profile_memory`` recorded, on any thread."""
    out = []
    stack = list(result.get_data().values())
    while stack:
        node = stack.pop()
        out.extend((m.timestamp_ns, m.current_allocated) for m in node.mem_node)
        stack.extend(node.children_node)
    return out


def job_times(jobs: Sequence[Tuple[str, int, float]]) -> Dict[str, List[float]]:
    """The milliseconds of :func:`executed_jobs` by job type, in run order."""
    out: Dict[str, List[float]] = {}
    for t, _, ms in jobs:
        out.setdefault(t, []).append(ms)
    return out


#: Paddle's flag that makes the interpreters run their ops on the calling thread (its "trace
#: mode"); Paddle 3.3.1 reads it when it builds an interpreter, 3.0.0 each time one runs, so
#: the flag is on both while the measured step's interpreters are built and while it runs
_TRACE_RUN_FLAG = "FLAGS_enable_pir_in_executor_trace_run"


@contextlib.contextmanager
def ops_on_this_thread():
    """The executor's interpreters built inside run their ops on the calling thread (and, on
    Paddle 3.0.0, those that run inside: see :data:`_TRACE_RUN_FLAG`).

    The steps up to the measured one build their interpreters so, and the measured step runs
    so: the profiler's stop gathers
    every thread's events without a lock, and an executor worker still closing its first event
    then (the last op of a step) crashed the process now and then, in
    ``HostEventRecorder::GatherEvents``. With the ops on the profiling thread nothing else
    records. The re-planned interpreters are built after, as Paddle builds them."""
    before = paddle.get_flags([_TRACE_RUN_FLAG])[_TRACE_RUN_FLAG]
    paddle.set_flags({_TRACE_RUN_FLAG: True})
    try:
        yield
    finally:
        paddle.set_flags({_TRACE_RUN_FLAG: before})


def record_jobs(run: Callable[[], object]) -> Tuple[object, List[Tuple[str, int, float]]]:
    """(what ``run()`` returned, :func:`executed_jobs` of the jobs it ran) with Paddle's host
    profiler on around it (nothing is written to disk)."""
    value, recorder = _recorded(run, memory=False)
    return value, recorder.jobs()


def record_jobs_and_memory(run: Callable[[], object]):
    """(what ``run()`` returned, :func:`executed_jobs`, and per job (type, live bytes at its
    end, highest live bytes while it ran): :func:`~.memory_budget.job_memory`), with the
    profiler recording every allocation too."""
    value, recorder = _recorded(run, memory=True)
    return value, recorder.jobs(), recorder.memory_levels()


class JobRecorder:
    """Paddle's host profiler, on from :meth:`start` to :meth:`stop` (nothing is written to
    disk); ``memory``: every allocation recorded too.  What the jobs in between ran:
    :meth:`jobs`, :meth:`memory_levels`."""

    def __init__(self, memory: bool = False):
        self.memory = memory
        self._profiler = None
        self._result = None

    def start(self) -> None:
        import paddle.profiler as profiler

        self._profiler = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU],
                                           on_trace_ready=lambda _: None,
                                           profile_memory=self.memory)
        self._profiler.start()

    def stop(self) -> None:
        """The profiler off (again: nothing)."""
        if self._profiler is not None:
            self._profiler.stop()
            self._result, self._profiler = self._profiler.profiler_result, None

    def jobs(self) -> List[Tuple[str, int, float]]:
        """:func:`executed_jobs` of what ran while it recorded."""
        return executed_jobs(self._result)

    def memory_levels(self):
        """Per job (type, live bytes at its end, highest live bytes while it ran):
        :func:`~.memory_budget.job_memory`."""
        from pipesplit.passes.measure.memory_budget import job_memory

        return job_memory(executed_job_spans(self._result), allocator_events(self._result))


def _recorded(run: Callable[[], object], memory: bool):
    recorder = JobRecorder(memory)
    recorder.start()
    try:
        value = run()
    finally:
        recorder.stop()
    return value, recorder


# ---------------------------------------------------------------- a model's jobs, probed

def build_model(model: str, num_stages: int, m: int, *, hidden: int = 32, layers_per_stage: int = 1,
                micro_batch_size: int = 2, optimizer: str = "sgd", seed: int = 0, **extra):
    """``build_gpt`` / ``build_mlp`` with the batch ``m * micro_batch_size``."""
    from pipesplit.ir_utils import build_gpt, build_mlp

    if model not in ("gpt", "mlp"):
        raise ValueError(f"model must be 'gpt' or 'mlp', got {model!r}")
    builder = build_gpt if model == "gpt" else build_mlp
    return builder(num_stages=num_stages, layers_per_stage=layers_per_stage, hidden=hidden,
                   batch_size=m * micro_batch_size, optimizer=optimizer,
                   lr=1e-3 if optimizer == "adam" else 0.1, seed=seed, **extra)


def split_programs(model, pp: int, vpp: int, m: int, split_backward: bool):
    """The SplitProgram of ``model`` (through :func:`apply_pipeline`, FThenB)."""
    from pipesplit.passes import apply_pipeline

    attrs = dict(num_micro_batches=m, pp_degree=pp, vpp_degree=vpp, split_backward=split_backward)
    return apply_pipeline(model.main, model.startup, "FThenB", attrs).split


def _grouped_types(num_stages: int, split_backward: bool) -> List[str]:
    backward = [BACKWARD_B, BACKWARD_W] if split_backward else [BACKWARD]
    types = [job_type(FORWARD, s) for s in range(num_stages)]
    for s in reversed(range(num_stages)):
        types += [job_type(kind, s) for kind in backward]
    return types


def _grouped_order(types: Sequence[str], m: int) -> List[Tuple[str, int]]:
    return [(t, mb) for t in types for mb in range(m)]


def profile_jobs(model, pp: int, vpp: int = 1, m: Optional[int] = None, *, repeats: int = 5,
                 inner: int = 4, place=None, measure_time: bool = True, log=None,
                 **model_options) -> Profile:
    """Profile every job type of ``model`` split for ``pp * vpp`` stages and ``m`` micro-batches.

    ``model``: a :class:`~pipesplit.ir_utils.BuiltModel` (its ``num_stages`` must be pp*vpp and
    its batch divisible by ``m``) or ``"gpt"`` / ``"mlp"`` built with ``model_options``
    (``hidden``, ``layers_per_stage``, ``micro_batch_size``, ``optimizer``, ``seed``).
    ``repeats``: timed runs per plan (medians); ``inner``: how many times the probed job type
    runs for every micro-batch in its probe plan (raised to the prerequisites' job count).  ``measure_time=False`` skips timing (times
    are then 0) and measures memory only.
    """
    from pipesplit.job_list.placement import check_positive_int

    pp = check_positive_int("pp", pp)
    vpp = check_positive_int("vpp", vpp)
    m = check_positive_int("m", m if m is not None else 2 * pp)
    repeats = check_positive_int("repeats", repeats)
    inner = check_positive_int("inner", inner)
    num_stages = pp * vpp
    model, kind = _model_to_profile(model, num_stages, m, model_options)
    run = _ProfileRun(model, m, place if place is not None else paddle.CPUPlace(), log)
    times: Dict[str, object] = {k: [0.0] * num_stages for k in STAGE_KINDS}
    memory: Dict[str, List[int]] = {k: [0] * num_stages
                                    for k in COMPUTE_KINDS}
    t_start = time.perf_counter()
    for split_backward in (True, False):
        split = split_programs(model, pp, vpp, m, split_backward)
        types = _grouped_types(num_stages, split_backward)
        for t, delta in zip(types, run.live_memory_deltas(split, types)):
            kind_name, stage = parse_job_type(t)
            if split_backward or kind_name == "backward":
                memory[kind_name][stage] = delta
        if not measure_time:
            continue
        for t, per_job in run.probe_times(split, _probes(num_stages, split_backward), repeats, inner):
            if t == "optimizer":
                times["optimizer"] = per_job
            else:
                kind_name, stage = parse_job_type(t)
                times[kind_name][stage] = per_job
    meta = dict(model=kind, pp=pp, vpp=vpp, m=m, num_stages=num_stages,
                batch_size=model.batch_size, micro_batch_size=model.batch_size // m,
                repeats=repeats, inner=inner, place=str(run.place), time_unit="ms",
                memory_unit="bytes", paddle=paddle.__version__, gc_priority=gc_priority(),
                profile_seconds=round(time.perf_counter() - t_start, 2))
    for key, value in model_options.items():
        if isinstance(value, (int, float, str)):
            meta.setdefault(key, value)
    return Profile(times, memory, meta)


def _model_to_profile(model, num_stages: int, m: int, model_options: dict):
    """(BuiltModel, its name for the meta) of ``profile_jobs``' ``model`` argument, checked."""
    if isinstance(model, str):
        kind = model
        model = build_model(model, num_stages, m, **model_options)
    else:
        if model_options:
            raise TypeError(f"model options {sorted(model_options)} need a model name, not a "
                            f"BuiltModel")
        kind = type(model).__name__
    if model.num_stages != num_stages:
        raise ValueError(f"model has {model.num_stages} stages, pp*vpp = {num_stages}")
    if model.batch_size % m:
        raise ValueError(f"batch size {model.batch_size} is not divisible by m={m}")
    return model, kind


def _probes(num_stages: int, split_backward: bool) -> List[Tuple[str, List[str]]]:
    """(probed job type, the job types that must run before it) for every type timed: a chain
    of forwards then backwards (B's when split); split, also each W after its B, the optimizer
    and the send / recv jobs (no prerequisites); unsplit, only the full backwards."""
    backward = BACKWARD_B if split_backward else BACKWARD
    chain = [job_type(FORWARD, s) for s in range(num_stages)]
    chain += [job_type(backward, s) for s in reversed(range(num_stages))]
    probes = [(t, chain[:k]) for k, t in enumerate(chain)]
    if not split_backward:
        return [(t, pre) for t, pre in probes if parse_job_type(t)[0] == BACKWARD]
    probes += [(job_type(BACKWARD_W, s), chain[:chain.index(job_type(BACKWARD_B, s)) + 1])
               for s in reversed(range(num_stages))]
    probes.append((OPTIMIZER, []))
    probes += [(job_type(kind, s), []) for s in range(num_stages) for kind in COMM_KINDS]
    return probes


class _ProfileRun:
    """The measurements of one :func:`profile_jobs` call on one model, batch and place."""

    def __init__(self, model, m: int, place, log):
        self.model, self.m, self.place = model, m, place
        self.stats = MemoryStats(place)
        self.feed = model.make_batch(0)
        self.say = log or (lambda *_: None)

    def live_memory_deltas(self, split, types: Sequence[str]) -> List[int]:
        """Per job type of ``types`` (in order), its live-memory growth per micro-batch: the
        live bytes after each prefix of whole job types (fresh scope each, the skip-gc sets of
        the full order), differenced."""
        m = self.m
        full = _grouped_order(types, m) + [("optimizer", 0)]
        live = [0]
        with serial_executor():
            for k in range(1, len(types) + 1):
                ex = TimedExecutor(plan_with_gc_of(k * m, full, split.programs, m),
                                   init_scope(self.model, split, self.place), self.feed, self.place)
                after, _ = ex.run_measured(self.stats)
                live.append(after)
                del ex
        return [int(round((live[k + 1] - live[k]) / m)) for k in range(len(types))]

    def probe_times(self, split, probes, repeats: int, inner: int):
        """(job type, ms per job) of each probe: its prerequisites' plan timed against the
        prerequisites plus ``K * m`` jobs of the probed type (one scope for all)."""
        m, programs = self.m, split.programs
        scope = init_scope(self.model, split, self.place)
        bases: Dict[int, TimedExecutor] = {}
        for t, pre in probes:
            base_order = _grouped_order(pre, m) or [("recv_forward0", 0)]
            if len(pre) not in bases:
                bases[len(pre)] = TimedExecutor(make_plan(base_order, programs, m), scope,
                                                self.feed, self.place)
            # at least as many probed jobs as prerequisite jobs, so the signal is not drowned
            # by the prerequisites' run-to-run noise
            times_over = max(inner, -(-len(base_order) // m))
            reps = ([(t, 0)] * (times_over * m) if t == "optimizer"
                    else _grouped_order([t], m) * times_over)
            probe = TimedExecutor(make_plan(base_order + reps, programs, m), scope, self.feed,
                                  self.place)
            per_job = median_time_difference(bases[len(pre)], probe, repeats) / len(reps) * 1e3
            self.say(f"  {t}: {per_job:.4g} ms")
            yield t, per_job
        bases.clear()

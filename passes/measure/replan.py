"""Costs measured during a training step through the engine, for one re-plan.

Through ``dist.to_static`` an ``auto`` / ``autoV`` schedule is first searched with the costs
the strategy has (:func:`pipesplit.passes.strategy.use_costs`), or the simulator's defaults.
Without given costs, every rank profiles its own jobs during one early training step
(:data:`MEASURED_STEP` by default: the first step also builds the executor's interpreters),
the ranks agree on the costs through the launcher's TCP store, and the plan is built again
once with them (:func:`pipesplit.passes.engine.replanning.replan`).

The pieces, each on its own:

* :func:`profile_jobs` - run a step under Paddle's profiler; the standalone executor records
  every job it runs as a ``<job type>-<micro-batch>`` event, whose wall time is the job's
  (:func:`executed_jobs`);
* :func:`rank_measurement` - this process's median job time per kind and global stage, and
  its fastest transfer;
* the exchange of the measurements and the rendezvous of all processes around the measured
  step: the engine's transport (:meth:`~pipesplit.passes.transport.base.Transport.share`,
  :meth:`~pipesplit.passes.transport.base.Transport.rendezvous`, in
  :mod:`pipesplit.passes.transport.rendezvous`);
* :func:`costs_from` - the :class:`~pipesplit.job_list.Costs` all of them give, the same
  on every process (so every rank builds the same schedule).
"""
from __future__ import annotations

import contextlib
import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from pipesplit.job_list.costs import Costs
from pipesplit.job_list.ir import (BACKWARD, BACKWARD_B, BACKWARD_W, COMM_KINDS, FORWARD,
                                   OPTIMIZER, parse_job_type)

from pipesplit.job_list.request import PipelineConfig

#: the training step (0-based) whose jobs are measured: step 0 builds the interpreters
MEASURED_STEP = 1
#: job kinds whose times are per global stage in :class:`Costs`
STAGE_KINDS = (FORWARD, BACKWARD, BACKWARD_B, BACKWARD_W)
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


#: Paddle's flag that makes the interpreters built while it is on run their ops on the calling
#: thread (its "trace mode"); it is read when an interpreter is built, not when it runs
_TRACE_RUN_FLAG = "FLAGS_enable_pir_in_executor_trace_run"


@contextlib.contextmanager
def ops_on_this_thread():
    """The executor's interpreters built inside run their ops on the calling thread.

    The steps up to the measured one build their interpreters so: the profiler's stop gathers
    every thread's events without a lock, and an executor worker still closing its first event
    then (the last op of a step) crashed the process now and then, in
    ``HostEventRecorder::GatherEvents``. With the ops on the profiling thread nothing else
    records. The re-planned interpreters are built after, as Paddle builds them."""
    import paddle

    before = paddle.get_flags([_TRACE_RUN_FLAG])[_TRACE_RUN_FLAG]
    paddle.set_flags({_TRACE_RUN_FLAG: True})
    try:
        yield
    finally:
        paddle.set_flags({_TRACE_RUN_FLAG: before})


def profile_jobs(run: Callable[[], object]) -> Tuple[object, List[Tuple[str, int, float]]]:
    """(what ``run()`` returned, :func:`executed_jobs` of the jobs it ran) with Paddle's host
    profiler on around it (nothing is written to disk)."""
    value, result = _profiled(run, memory=False)
    return value, executed_jobs(result)


def profile_jobs_and_memory(run: Callable[[], object]):
    """(what ``run()`` returned, :func:`executed_jobs`, and per job (type, live bytes at its
    end, highest live bytes while it ran): :func:`~.memory_budget.job_memory`), with the
    profiler recording every allocation too."""
    from pipesplit.passes.measure.memory_budget import job_memory

    value, result = _profiled(run, memory=True)
    return (value, executed_jobs(result),
            job_memory(executed_job_spans(result), allocator_events(result)))


def _profiled(run: Callable[[], object], memory: bool):
    import paddle.profiler as profiler

    prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU],
                             on_trace_ready=lambda _: None, profile_memory=memory)
    prof.start()
    try:
        value = run()
    finally:
        prof.stop()
    return value, prof.profiler_result


def rank_measurement(jobs: Sequence[Tuple[str, int, float]], config: PipelineConfig) -> dict:
    """This process's measurement of the :func:`executed_jobs` ``jobs``: ``{"stages": {kind: {global stage: median ms}},
    "comm": fastest transfer in ms or None, "optimizer": ms or None}``.  Its chunks are
    pipeline rank ``config.pp_stage``'s, placed as the schedule places them."""
    if config.pp_stage is None:
        raise ValueError("rank_measurement needs config.pp_stage (this process's pipeline rank)")
    placement = config.placement
    stages: Dict[str, Dict[str, float]] = {}
    comm: List[float] = []
    optimizer = None
    for t, values in job_times(jobs).items():
        try:
            kind, chunk = parse_job_type(t)
        except ValueError:
            continue  # not one of pipesplit's jobs
        if kind == OPTIMIZER:
            optimizer = statistics.median(values)
        elif kind in COMM_KINDS:
            comm.extend(values)
        elif kind in STAGE_KINDS:
            stage = placement.stage(config.pp_stage, chunk)
            stages.setdefault(kind, {})[str(stage)] = statistics.median(values)
    return {"stages": stages, "comm": min(comm) if comm else None, "optimizer": optimizer}


def costs_from(measurements: Sequence[dict], num_stages: int, comm_mode: str,
               w_memory: float = Costs.w_memory) -> Costs:
    """The costs every process's measurement gives (the same on every process).

    Per kind and stage: the median over the processes that ran it (data / tensor parallel
    copies of a stage measure it alike).  A stage that ran its backward as I / W has no B
    time: B is then I + W (the cost of its split twin); a stage that ran B only has no I / W
    times: they are then B / 2 each (the simulator's default split).  ``comm``: the median
    over processes of each one's fastest transfer (the others waited for a peer)."""
    def per_stage(kind: str) -> List[Optional[float]]:
        values = [[m["stages"].get(kind, {}).get(str(s)) for m in measurements]
                  for s in range(num_stages)]
        return [statistics.median([v for v in vs if v is not None])
                if any(v is not None for v in vs) else None for vs in values]

    forward, b, w, full = (per_stage(k) for k in (FORWARD, BACKWARD_B, BACKWARD_W, BACKWARD))
    missing = [s for s in range(num_stages)
               if forward[s] is None or (full[s] is None and (b[s] is None or w[s] is None))]
    if missing:
        raise ValueError(f"the measurements have no forward / backward times for stage(s) "
                         f"{missing} of {num_stages}")
    b = [x if x is not None else full[s] / 2 for s, x in enumerate(b)]
    w = [x if x is not None else full[s] / 2 for s, x in enumerate(w)]
    backward = None if all(x is None for x in full) else \
        [x if x is not None else b[s] + w[s] for s, x in enumerate(full)]
    fastest = [m["comm"] for m in measurements if m.get("comm") is not None]
    return Costs(forward=_rounded(forward), backward=None if backward is None
                 else _rounded(backward), backward_b=_rounded(b), backward_w=_rounded(w),
                 comm=round(statistics.median(fastest), 4) if fastest else 0.0,
                 w_memory=w_memory, comm_mode=comm_mode)


def _rounded(values) -> tuple:
    return tuple(round(float(v), 4) for v in values)

"""Costs measured during a training step through the engine, for one re-plan.

Through ``dist.to_static`` an ``auto`` / ``autoV`` schedule is first searched with the costs
the strategy has (:func:`pipesplit.passes.strategy.use_costs`), or the simulator's defaults.
Without given costs, every rank profiles its own jobs during one early training step
(:data:`MEASURED_STEP` by default: the first step also builds the executor's interpreters),
the ranks agree on the costs through the launcher's TCP store, and the plan is built again
once with them (:func:`pipesplit.passes.engine.replanning.replan`).

The pieces, each on its own:

* the step's jobs, recorded by the one profiler of jobs
  (:func:`pipesplit.passes.measure.profile.record_jobs`: the standalone executor records every
  job it runs as a ``<job type>-<micro-batch>`` event, whose wall time is the job's);
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

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from pipesplit.job_list.costs import Costs
from pipesplit.job_list.ir import (BACKWARD, BACKWARD_B, BACKWARD_W, COMM_KINDS, COMPUTE_KINDS,
                                   FORWARD, OPTIMIZER, parse_job_type)
from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes.measure.profile import job_times

#: the training step (0-based) whose jobs are measured: step 0 builds the interpreters
MEASURED_STEP = 1


def rank_measurement(jobs: Sequence[Tuple[str, int, float]], config: PipelineConfig) -> dict:
    """This process's measurement of the recorded ``jobs``
    (:func:`~pipesplit.passes.measure.profile.executed_jobs`): ``{"stages": {kind: {global
    stage: median ms}}, "comm": fastest transfer in ms or None, "optimizer": ms or None}``.
    Its chunks are pipeline rank ``config.pp_stage``'s, placed as the schedule places them."""
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
        elif kind in COMPUTE_KINDS:  # one time per global stage
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

"""The simulator's memory model against the peak bytes measured through the engine.

Each pipesplit engine's profiled step also records its allocations, as ``auto``'s measured step
does under a memory budget, and prices the simulator's units in bytes per rank: resident bytes,
bytes per kept forward, temporaries and ``w_memory``
(:class:`~pipesplit.passes.measure.memory_budget.MemoryModel`; the row's ``memory_model``).
The prediction for the schedule the engine runs stands beside its measured peak (the smallest
over the timed steps: on CPU a step's peak also holds what the executor's GC thread has not
freed yet).  Peak bytes are exact (the allocator's statistics), so the error is a property of
the model, not of noise; ``tests/multiprocess/test_memory.py`` holds it to
:data:`MEMORY_MODEL_TOLERANCE` on two processes.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

#: the largest |measured / predicted - 1| the model is held to (issue 31)
MEMORY_MODEL_TOLERANCE = 0.10


def profiled_step(run, dist_model, start_bytes: int, with_memory: bool):
    """(what ``run()`` returned, its jobs, this rank's memory figures or None): ``run()`` under
    Paddle's profiler; ``with_memory`` (pipesplit's engines) records the allocations and takes
    the figures as the engine's measured step does
    (:func:`~pipesplit.passes.measure.memory_budget.rank_memory`)."""
    from pipesplit.passes.measure.profile import record_jobs, record_jobs_and_memory

    if not with_memory:
        return record_jobs(run) + (None,)
    from pipesplit.passes.engine.session import engine_state
    from pipesplit.passes.measure.memory_budget import rank_memory

    loss, jobs, levels = record_jobs_and_memory(run)
    config = engine_state(dist_model._engine).pipeline_of("train").config
    return loss, jobs, rank_memory(levels, start_bytes, config.pp_stage, config.placement)


def measured_model(schedule, gathered: Sequence[dict], pp: int) -> Optional[dict]:
    """The memory model one engine's profiled step measured (every rank's ``memory``,
    :class:`~pipesplit.passes.measure.memory_budget.MemoryModel`) and the peak it predicts per
    rank for ``schedule``, in a row's terms (resident + the step's bytes above its start);
    None for Paddle's engines (no figures)."""
    if any(g["memory"] is None for g in gathered):
        return None
    from pipesplit.job_list.costs import Costs
    from pipesplit.passes.measure.memory_budget import MemoryModel

    model = MemoryModel.from_measurements([g["memory"] for g in gathered], pp)
    peaks = model.peaks(schedule, Costs())
    return {**model.to_dict(), "predicted_peak_bytes": [
        int(g["resident_bytes"] + peak - price.start)
        for g, peak, price in zip(gathered, peaks, model.ranks)]}


def predictions(rows: Sequence[dict]) -> List[Dict[str, object]]:
    """Per pipesplit row with a measured model, each rank's measured and predicted peak and
    the error."""
    out = []
    for row in rows:
        model = row.get("memory_model")
        if not model:
            continue
        for rank, (measured, predicted, price) in enumerate(
                zip(row["peak_bytes"], model["predicted_peak_bytes"], model["ranks"])):
            out.append({"m": row["m"], "schedule": row["schedule"], "rank": rank,
                        "measured_bytes": int(measured), "predicted_bytes": int(predicted),
                        "unit_bytes": price["unit_bytes"], "rest_bytes": price["rest_bytes"],
                        "w_memory": model["w_memory"], "error": measured / predicted - 1})
    return out


def memory_model_table(entries: Sequence[dict]) -> List[str]:
    """The report's lines: per row and rank, the measured unit and temporaries, measured and
    predicted MiB, error."""
    if not entries:
        return []
    lines = ["", "memory model: peak per rank = resident + simulated units x unit bytes + "
             "temporaries, each measured in the schedule's profiled step (|error| <= "
             f"{MEMORY_MODEL_TOLERANCE:.0%} is the goal)"]
    for e in entries:
        w = "-" if e["w_memory"] is None else f"{e['w_memory']:.2f}"
        lines.append(f"  m={e['m']} {e['schedule']:<10} rank {e['rank']}: unit "
                     f"{e['unit_bytes'] / 2**20:.2f} MiB, temporaries "
                     f"{e['rest_bytes'] / 2**20:.2f} MiB, w_memory {w}: measured "
                     f"{e['measured_bytes'] / 2**20:.2f} MiB, predicted "
                     f"{e['predicted_bytes'] / 2**20:.2f} MiB, error {e['error']:+.1%}")
    return lines

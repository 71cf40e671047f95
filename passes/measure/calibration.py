"""The simulator's memory model and times against one whole measured step, per schedule
(``bench_memory``): :func:`measure_schedule` runs a step of a schedule (every rank in one
process) and sets its peak allocated bytes and step time beside the simulator's figures, priced
with a :class:`~.profile.Profile` (:func:`~.profile.profile_jobs`); :func:`calibrate` does so
for each schedule, :func:`calibration_table` shows them."""
from __future__ import annotations

import statistics
from typing import List, Optional, Sequence, Tuple

from pipesplit.job_list.events import rank_peaks, serial_memory

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.job_list.text import format_bytes, text_table
from pipesplit.passes.measure.profile import Profile

paddle = require_supported_paddle()

from pipesplit.ir_utils import init_scope  # noqa: E402
from pipesplit.ir_utils.measure import (PEAK_RUNS, MemoryStats, TimedExecutor,  # noqa: E402
                                        gc_priority, run_behind_gc, serial_executor)


def summed_sim_memory(sim) -> float:
    """Peak over time of the simulator's memory summed over ranks (frees before allocations
    at equal times): what one address space holding every rank would see if the ranks ran
    concurrently as simulated."""
    events = sorted((t, d) for curve in sim.memory_curve
                    for (t, d) in _deltas(curve))
    level = peak = 0.0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def _deltas(curve):
    prev = 0.0
    for t, level in curve:
        yield t, level - prev
        prev = level


def measured_delta(profile: Profile):
    """Live-memory change (bytes) of a job as measured: forward +a_s; backward -a_s;
    backward_b its measured delta; backward_w the rest (-a_s - delta_b), so each micro-batch
    returns to zero."""
    act = profile.activation_bytes
    b = profile.memory.get("backward_b", [0] * len(act))

    def delta(kind, stage):
        if kind == "forward":
            return act[stage]
        if kind == "backward":
            return -act[stage]
        db = min(max(b[stage], -act[stage]), act[stage])
        return db if kind == "backward_b" else -act[stage] - db
    return delta


def sim_delta_bytes(profile: Profile):
    """The simulator's model (+1, -1, h-1, -h with the profile's calibrated h = w_memory)
    scaled by each stage's activation bytes."""
    act, costs = profile.activation_bytes, profile.costs
    return lambda kind, stage: costs.memory_delta(kind) * act[stage]


def measure_schedule(model, schedule: str, pp: int, vpp: int, m: int, profile: Profile, *,
                     repeats: int = 3, place=None, split_backward: bool = False,
                     memory_limit: Optional[float] = None) -> dict:
    """Run one whole step of ``schedule`` (every rank in one process) and set its measured peak
    allocated bytes and step time beside the simulator's figures (costs from ``profile``)."""
    from pipesplit.passes import apply_pipeline

    place = place if place is not None else paddle.CPUPlace()
    stats = MemoryStats(place)
    costs = profile.costs
    attrs = dict(num_micro_batches=m, pp_degree=pp, vpp_degree=vpp, costs=costs,
                 split_backward=split_backward)
    if memory_limit is not None:
        attrs["memory_limit"] = memory_limit
    pipeline = apply_pipeline(model.main, model.startup, schedule, attrs)
    sim = pipeline.simulate(costs)
    feed = model.make_batch(0)
    with serial_executor():
        ex = TimedExecutor(pipeline.plan, init_scope(model, pipeline.split, place), feed, place)
        ex.run()  # warm-up: executor built, caches filled
        peak = min(run_behind_gc(lambda: ex.run_measured(stats))[1] for _ in range(PEAK_RUNS))
        del ex
    ex = TimedExecutor(pipeline.plan, init_scope(model, pipeline.split, place), feed, place)
    ex.run()
    step = statistics.median(ex.run() for _ in range(repeats)) * 1e3
    order = pipeline.job_order
    serial_units, _ = serial_memory(order, lambda k, s: costs.memory_delta(k))
    unit = statistics.mean(profile.activation_bytes) or 1
    return {
        "schedule": pipeline.schedule.name,
        "peak_bytes": int(peak),
        "sim_peak_units": sim.max_peak_memory,
        "sim_sum_peak_units": summed_sim_memory(sim),
        "serial_peak_units": serial_units,
        "serial_peak_bytes_sim": int(serial_memory(order, sim_delta_bytes(profile))[0]),
        "serial_peak_bytes_measured": int(serial_memory(order, measured_delta(profile))[0]),
        "rank_peak_bytes_sim": [int(x) for x in rank_peaks(sim, sim_delta_bytes(profile))],
        "rank_peak_bytes_measured": [int(x) for x in rank_peaks(sim, measured_delta(profile))],
        "unit_bytes": int(unit),
        "step_ms": step,
        "sim_makespan": sim.makespan,
        "sim_busy_ms": sum(sim.busy),
        "optimizer_ms": float(profile.times.get("optimizer", 0.0)),
        "pp": pp, "vpp": vpp, "m": m, "gc_priority": gc_priority(),
    }


def calibrate(model, pp: int, vpp: int, m: int, profile: Profile,
              schedules: Optional[Sequence[str]] = None, *, repeats: int = 3, place=None,
              log=None) -> Tuple[List[dict], List[Tuple[str, str]]]:
    """:func:`measure_schedule` for each of ``schedules`` (default: every registered one;
    ``pipesplit.tools.cli.load_schedules`` registers those of every job_list module);
    returns (records, [(name, reason)] for schedules that cannot serve pp / vpp / m)."""
    from pipesplit.job_list import schedule_names

    records, refused = [], []
    for name in schedules or schedule_names():
        try:
            records.append(measure_schedule(model, name, pp, vpp, m, profile, repeats=repeats,
                                            place=place))
        except (ValueError, TypeError) as exc:
            refused.append((name, " ".join(str(exc).split())[:160]))
            continue
        if log:
            r = records[-1]
            log(f"  {r['schedule']}: peak {format_bytes(r['peak_bytes'])}, step {r['step_ms']:.1f} ms")
    return records, refused


def calibration_table(records: Sequence[dict], reference: str = "1F1B") -> str:
    """Measured vs simulated memory and time; ratios are to ``reference``'s figures.

    one process: ``peak`` (measured: allocator peak during one step above the resting level),
    ``serial`` (the executed global job order walked with the simulator's +1/-1/-1/2/-1/2 model,
    in bytes of each stage's measured activations) and ``serial*`` (same order, the measured
    per-job deltas).  per rank (a real multi-rank run, derived): max over ranks of each rank's
    own job order with the simulator's model (``rank sim``, = sim units x activation bytes) and
    with the measured deltas (``rank*``).  time: measured step vs the simulator's total busy
    work (sum over ranks of job times + optimizer: one process runs every rank serially)."""
    ref = next((r for r in records if r["schedule"] == reference), records[0] if records else None)
    rows = [["schedule", "peak", "serial", "serial*", "peak/ref", "serial/ref", "serial*/ref",
             "rank sim", "rank*", "rank sim/ref", "rank*/ref", "sim units",
             "step ms", "busy ms", "step/busy", "makespan"]]

    def rmax(r, key):
        return max(r[key])

    for r in records:
        rows.append([
            r["schedule"], format_bytes(r["peak_bytes"]), format_bytes(r["serial_peak_bytes_sim"]),
            format_bytes(r["serial_peak_bytes_measured"]),
            f"{r['peak_bytes'] / ref['peak_bytes']:.2f}",
            f"{r['serial_peak_bytes_sim'] / ref['serial_peak_bytes_sim']:.2f}",
            f"{r['serial_peak_bytes_measured'] / ref['serial_peak_bytes_measured']:.2f}",
            format_bytes(rmax(r, "rank_peak_bytes_sim")),
            format_bytes(rmax(r, "rank_peak_bytes_measured")),
            f"{rmax(r, 'rank_peak_bytes_sim') / rmax(ref, 'rank_peak_bytes_sim'):.2f}",
            f"{rmax(r, 'rank_peak_bytes_measured') / rmax(ref, 'rank_peak_bytes_measured'):.2f}",
            f"{r['sim_peak_units']:g}/{r['sim_sum_peak_units']:g}/{r['serial_peak_units']:g}",
            f"{r['step_ms']:.1f}", f"{r['sim_busy_ms'] + r['optimizer_ms']:.1f}",
            f"{r['step_ms'] / max(1e-9, r['sim_busy_ms'] + r['optimizer_ms']):.2f}",
            f"{r['sim_makespan']:.1f}"])
    return text_table(rows)

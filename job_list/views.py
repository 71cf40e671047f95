"""Views of a schedule: ASCII grid, Chrome trace, PNG timeline, CSV and JSON.

* :func:`ascii_grid` — rank x time grid of a simulated schedule, cells ``{stage}{op}{mb}``.
* :func:`~.grid.step_grid` (module :mod:`.grid`) — rank x list-position grid of any schedule
  (simulated or not, valid or not), with marked cells (the validator marks the heads a
  deadlock stopped).
* :func:`chrome_trace` — Chrome trace-event dict (open the JSON in https://ui.perfetto.dev).
* :func:`plot_timeline` — PNG via matplotlib (imported lazily; only this function needs it).
* :func:`to_csv` / :func:`from_csv` — PyTorch's pipelining CSV (torchtitan ``_dump_csv`` /
  ``_load_csv``): row ``r`` is rank ``r``'s ordered actions ``{stage}{op}{mb}`` with the *global*
  virtual stage; empty cells (idle steps) are allowed and ignored on reading.
* :func:`to_json` / :func:`from_json` — the schedule, optionally with simulated start / end times.

Pure Python: imports nothing from paddle.
"""
from __future__ import annotations

import csv
import io
import json
import math
from fractions import Fraction
from typing import List, Optional, Sequence

from .ir import BACKWARD_B, BACKWARD_W, OPTIMIZER, OPTIMIZER_ACTION, Action, Job, Schedule
from .bounds import lower_bound
from .latency import SimResult
from .placement import LOOPED, Placement, check_positive_int

__all__ = ["ascii_grid", "chrome_trace", "plot_timeline", "to_csv", "from_csv", "to_json",
           "from_json", "schedule_from_actions", "OP_COLORS"]

#: colours of the compute ops in :func:`plot_timeline` (F, full B, I = backward_b, W = backward_w)
OP_COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#DD8452", "W": "#8172B3"}
_MAX_GRID_COLUMNS = 2000
#: with a width, at most this many bands of columns before the time step grows (a grid taller
#: than this is no longer read as one picture)
MAX_GRID_BANDS = 6


# --------------------------------------------------------------------------- ASCII grid

def _time_step(sim: SimResult) -> float:
    """The gcd of all job durations (``gcd-ish``: durations rounded to 1/1000), or the shortest
    job's duration when that gcd is much finer.  Starts are rounded to the step, so a latency
    ``comm`` smaller than the step does not blow the grid up."""
    durations = [t.end - t.start for row in sim.timeline for t in row if t.end > t.start]
    if not durations:
        return 1.0
    shortest = min(durations)
    g = Fraction(0)
    for d in durations:
        g = _fraction_gcd(g, Fraction(d).limit_denominator(1000))
    step = float(g)
    if step <= 0 or step < shortest / 8 or sim.makespan / step > _MAX_GRID_COLUMNS:
        step = shortest
    return step


def _fraction_gcd(a: Fraction, b: Fraction) -> Fraction:
    if a == 0:
        return abs(b)
    if b == 0:
        return abs(a)
    den = a.denominator * b.denominator // math.gcd(a.denominator, b.denominator)
    return Fraction(math.gcd(int(a * den), int(b * den)), den)


def ascii_grid(sim: SimResult, width: Optional[int] = None) -> str:
    """Rank x time grid of a simulated schedule.

    Each row is a rank, each column one time step (the gcd of the job durations, or the shortest
    job's duration when the gcd is too fine; start and end times are rounded to it, so every job
    keeps at least one cell of its own); a cell holds the short form
    ``{stage}{op}{mb}`` of the job running then, ``.`` when the rank is idle.

    With ``width`` (characters per line) a grid too wide for one line is cut into bands of
    consecutive columns, one under the other, each headed by its time range; beyond
    :data:`MAX_GRID_BANDS` bands the time step grows to a round number (1, 1.2, 1.5, 2, 2.5, 3,
    4, 5, 6, 8 times a power of ten) until that many suffice.  Jobs shorter than such a step can
    fall into one column: the cell shows ``+N`` (N jobs in it) and the legend says how many jobs
    have no column of their own, so no job disappears silently.  The last line is the legend.
    """
    schedule = sim.schedule
    labels = {(t.rank, t.index): str(schedule.to_action(t.rank, t.job))
              for row in sim.timeline for t in row}
    cell = max([len(s) for s in labels.values()] + [2])
    step = _time_step(sim)
    prefix = f"rank {schedule.pp - 1:>{len(str(schedule.pp - 1))}} |"
    band_columns = None
    if width is not None:
        check_positive_int("width", width)
        band_columns = max(1, (width - len(prefix) + 1) // (cell + 1))
        if sim.makespan / step > band_columns * MAX_GRID_BANDS:
            step = _round_step_up(sim.makespan / (band_columns * MAX_GRID_BANDS))

    def cell_of(time: float) -> int:  # round half up: monotone, so no two jobs share a cell
        return int(math.floor(time / step + 0.5 + 1e-9))

    def cells_of(t) -> range:
        first = cell_of(t.start)
        return range(first, max(first + 1, cell_of(t.end)))

    columns = max([1] + [cells_of(t).stop for row in sim.timeline for t in row])
    grid, hidden = [], 0
    for rank in range(schedule.pp):
        occupants: List[List[str]] = [[] for _ in range(columns)]
        for t in sim.timeline[rank]:
            for col in cells_of(t):
                occupants[col].append(labels[(t.rank, t.index)])
        shown = {jobs[0] for jobs in occupants if len(jobs) == 1}
        hidden += sum(1 for t in sim.timeline[rank] if labels[(t.rank, t.index)] not in shown)
        grid.append(["." if not jobs else jobs[0] if len(jobs) == 1 else f"+{len(jobs)}"
                     for jobs in occupants])
    band_columns = band_columns or columns
    bands = [range(first, min(first + band_columns, columns))
             for first in range(0, columns, band_columns)]
    lines = [f"time step {step:g} per column, makespan {sim.makespan:g} "
             f"({schedule.name} pp={schedule.pp} vpp={schedule.vpp} m={schedule.m})"
             + (f", {len(bands)} bands of {band_columns} columns" if len(bands) > 1 else "")]
    for band in bands:
        if len(bands) > 1:
            lines.append(f"t {band.start * step:g} to {band.stop * step:g}")
        for rank in range(schedule.pp):
            lines.append(f"rank {rank:>{len(str(schedule.pp - 1))}} |"
                         + " ".join(grid[rank][col].ljust(cell) for col in band).rstrip())
    legend = ("legend: cell = {stage}{op}{micro-batch}, stage = global virtual stage; "
              "F forward, B backward, I backward_b (input grad), W backward_w (weight grad); "
              ". idle")
    if any(c.startswith("+") for row in grid for c in row):
        jobs = sum(len(row) for row in sim.timeline)
        legend += (f"; +N: N jobs shorter than the time step in one column ({hidden} of {jobs} "
                   f"jobs have no column of their own; a larger width shows them)")
    lines.append(legend)
    return "\n".join(lines)


def _round_step_up(step: float) -> float:
    """The smallest round number >= ``step``: 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a
    power of ten (at most 25% coarser than needed, and easy to read off the grid)."""
    power = 10.0 ** math.floor(math.log10(step))
    for mantissa in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if mantissa * power >= step * (1 - 1e-9):
            return float(f"{mantissa * power:.12g}")
    return 10 * power


# --------------------------------------------------------------------------- Chrome trace

def chrome_trace(sim: SimResult, us_per_unit: float = 1000.0) -> dict:
    """Chrome trace-event dict: one process, one track (``tid``) per rank, one complete (``X``)
    event per compute job.  Simulator time units become ``us_per_unit`` microseconds (default
    1 unit = 1 ms).  ``json.dump`` it and open the file in Perfetto or ``chrome://tracing``."""
    schedule = sim.schedule
    events: List[dict] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
         "args": {"name": f"{schedule.name} pp={schedule.pp} vpp={schedule.vpp} m={schedule.m}"}},
    ]
    for rank in range(schedule.pp):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": rank,
                       "args": {"sort_index": rank}})
    for row in sim.timeline:
        for t in row:
            action = schedule.to_action(t.rank, t.job)
            events.append({
                "ph": "X", "name": str(action), "cat": t.job.kind, "pid": 0, "tid": t.rank,
                "ts": t.start * us_per_unit, "dur": (t.end - t.start) * us_per_unit,
                "args": {"kind": t.job.kind, "chunk": t.job.chunk,
                         "micro_batch": t.job.micro_batch, "stage": t.stage,
                         "job_type": t.job.type, "index": t.index},
            })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": schedule.name, "pp": schedule.pp, "vpp": schedule.vpp,
                          "m": schedule.m, "makespan": sim.makespan,
                          "bubble_ratio": sim.bubble_ratio, "us_per_unit": us_per_unit}}


# --------------------------------------------------------------------------- PNG

def plot_timeline(sim: SimResult, path: str, title: Optional[str] = None, dpi: int = 120) -> str:
    """Draw the simulated timeline as a PNG at ``path`` (returns ``path``).

    One row per rank (rank 0 on top); boxes coloured by op (F / B / I / W), later chunks drawn
    lighter, each labelled with its micro-batch (with vpp > 1 and room in every box: its short form
    ``{stage}{op}{mb}``).  Needs matplotlib; uses the Agg canvas directly, so no GUI backend is touched.
    """
    try:
        from matplotlib.figure import Figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plot_timeline needs matplotlib (pip install matplotlib)") from exc

    schedule = sim.schedule
    span = sim.makespan or 1.0
    fig_width = min(40.0, max(8.0, 0.45 * sum(len(r) for r in sim.timeline) / schedule.pp))
    fig = Figure(figsize=(fig_width, 0.55 * schedule.pp + 1.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ops_seen = []
    shortest = min([t.end - t.start for row in sim.timeline for t in row] or [span])
    # short forms when every box has room for one (about 4 characters), else micro-batch only
    full_labels = schedule.vpp > 1 and shortest / span * fig_width * 72 / 7 / 4 >= 1.0
    for row in sim.timeline:
        for t in row:
            action = schedule.to_action(t.rank, t.job)
            op = action.op
            if op not in ops_seen:
                ops_seen.append(op)
            alpha = 1.0 - 0.45 * (t.job.chunk / max(1, schedule.vpp - 1)) if schedule.vpp > 1 else 1.0
            dur = t.end - t.start
            ax.barh(t.rank, dur, left=t.start, height=0.8, color=OP_COLORS.get(op, "#999999"),
                    alpha=alpha, edgecolor="black", linewidth=0.4)
            label = str(action) if full_labels else str(t.job.micro_batch)
            ax.text(t.start + dur / 2, t.rank, label, ha="center", va="center",
                    fontsize=7 if len(label) > 2 else 8, color="white" if alpha > 0.8 else "black")
    ax.set_ylim(schedule.pp - 0.5, -0.5)
    ax.set_yticks(range(schedule.pp))
    ax.set_yticklabels([f"rank {r}" for r in range(schedule.pp)])
    ax.set_xlim(0, span)
    ax.set_xlabel("time (simulator units)")
    ax.set_title(title or (f"{schedule.name}  pp={schedule.pp} vpp={schedule.vpp} m={schedule.m}"
                           f"   makespan {sim.makespan:g}, bubble {sim.bubble_ratio:.1%}"))
    names = {"F": "F forward", "B": "B backward", "I": "I backward_b", "W": "W backward_w"}
    handles = [Patch(color=OP_COLORS[o], label=names[o]) for o in "FBIW" if o in ops_seen]
    if schedule.vpp > 1:
        handles.append(Patch(color="#BBBBBB", label="lighter = later chunk"))
    ax.legend(handles=handles,
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5, frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return path


# --------------------------------------------------------------------------- CSV / JSON

def to_csv(schedule: Schedule) -> str:
    """PyTorch compute-only CSV: one row per rank, one cell ``{stage}{op}{mb}`` per job in order
    (send / recv cells ``SEND_F`` ... and ``OPT`` appear when the schedule has them)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for rank in range(schedule.pp):
        writer.writerow([str(a) for a in schedule.actions(rank)])
    return buf.getvalue()


def schedule_from_actions(rows: Sequence[Sequence[Optional[Action]]], pp: Optional[int] = None,
                          vpp: Optional[int] = None, m: Optional[int] = None,
                          placement: str = LOOPED, name: str = "csv",
                          split_backward: Optional[bool] = None) -> Schedule:
    """Schedule of per-rank action lists (``None`` entries = idle, skipped).

    ``pp`` defaults to the number of rows, ``vpp`` to ``(max stage + 1) / pp``, ``m`` to the
    largest micro-batch + 1.  Every action must belong to the rank of its row.
    """
    rows = [[a for a in row if a is not None] for row in rows]
    if pp is None:
        pp = len(rows)
    check_positive_int("pp", pp)
    if len(rows) > pp:
        raise ValueError(f"pp is {pp} but the schedule has {len(rows)} rank rows")
    rows += [[] for _ in range(pp - len(rows))]
    stages = [a.stage for row in rows for a in row if a.stage is not None]
    mbs = [a.micro_batch for row in rows for a in row if a.micro_batch is not None]
    if vpp is None:
        num_stages = max(stages, default=pp - 1) + 1
        if num_stages % pp:
            raise ValueError(f"cannot infer vpp: the highest stage is {num_stages - 1}, so "
                             f"{num_stages} stages, not a multiple of pp ({pp}); pass vpp")
        vpp = num_stages // pp
    if m is None:
        m = max(mbs, default=0) + 1
    check_positive_int("vpp", vpp)
    check_positive_int("m", m)
    layout = Placement(placement, pp, vpp)
    proto = Schedule(name=name, pp=pp, vpp=vpp, m=m, placement=layout, ranks=[[] for _ in range(pp)])
    ranks: List[List[Job]] = []
    for rank, row in enumerate(rows):
        jobs = []
        for index, action in enumerate(row):
            if action.op == OPTIMIZER_ACTION:
                jobs.append(Job(OPTIMIZER))
                continue
            if action.micro_batch >= m:
                raise ValueError(f"rank {rank}, cell {index} ({action}): micro-batch must be < m ({m})")
            owner, job = proto.from_action(action)
            if owner != rank:
                raise ValueError(f"rank {rank}, cell {index} ({action}): stage {action.stage} "
                                 f"belongs to rank {owner} with {placement} placement "
                                 f"(pp={pp}, vpp={vpp})")
            jobs.append(job)
        ranks.append(jobs)
    all_jobs = [j for jobs in ranks for j in jobs]
    if split_backward is None:
        split_backward = any(j.kind in (BACKWARD_B, BACKWARD_W) for j in all_jobs)
    return proto.with_ranks(ranks, split_backward=split_backward,
                            lowered=any(j.is_comm for j in all_jobs))


def from_csv(text: str, pp: Optional[int] = None, vpp: Optional[int] = None,
             m: Optional[int] = None, placement: str = LOOPED, name: str = "csv") -> Schedule:
    """Parse PyTorch's compute-only CSV (row index = rank; empty cells ignored) into a
    :class:`Schedule`.  ``pp`` / ``vpp`` / ``m`` are inferred when not given (see
    :func:`schedule_from_actions`); ``placement`` must be given for V-shaped schedules."""
    if not isinstance(text, str):
        raise TypeError(f"from_csv text must be a str, got {type(text).__name__}")
    rows = []
    for line_no, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        actions = []
        for cell in row:
            cell = cell.strip()
            if not cell:
                actions.append(None)
                continue
            try:
                actions.append(Action.parse(cell))
            except ValueError as exc:
                raise ValueError(f"CSV line {line_no}: {exc}") from None
        rows.append(actions)
    if not any(cell is not None for row in rows for cell in row):
        raise ValueError("CSV text has no jobs: expected one row per rank of {stage}{op}{mb} "
                         "cells, e.g. '0F0,0B0'")
    return schedule_from_actions(rows, pp=pp, vpp=vpp, m=m, placement=placement, name=name)


def _json_safe(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def schedule_dict(schedule: Schedule, sim: Optional[SimResult] = None) -> dict:
    """The JSON-able dict behind :func:`to_json`."""
    data = {
        "name": schedule.name, "pp": schedule.pp, "vpp": schedule.vpp, "m": schedule.m,
        "placement": schedule.placement.kind, "split_backward": schedule.split_backward,
        "lowered": schedule.lowered, "options": _json_safe(schedule.options),
        "ranks": [[str(a) for a in schedule.actions(r)] for r in range(schedule.pp)],
    }
    if sim is not None:
        data["jobs"] = [
            {"rank": t.rank, "index": t.index, "job": str(sim.schedule.to_action(t.rank, t.job)),
             "kind": t.job.kind, "chunk": t.job.chunk, "micro_batch": t.job.micro_batch,
             "stage": t.stage, "start": t.start, "end": t.end}
            for row in sim.timeline for t in row]
        bound = lower_bound(sim.schedule.pp, sim.schedule.vpp, sim.schedule.m, sim.costs)
        data["summary"] = {
            "makespan": sim.makespan, "lower_bound": bound,
            "makespan_over_lower_bound": sim.makespan / bound if bound else None,
            "bubble_ratio": sim.bubble_ratio, "busy": list(sim.busy),
            "peak_memory": list(sim.peak_memory), "max_peak_memory": sim.max_peak_memory,
            "costs": sim.costs.to_dict(),
        }
    return data


def to_json(schedule: Schedule, sim: Optional[SimResult] = None, compact: bool = False) -> str:
    """JSON text of ``schedule`` (name, pp, vpp, m, placement, split_backward, lowered, options,
    ranks as short forms); with ``sim`` also every compute job's start / end and a summary
    (makespan, lower bound, bubble ratio, busy time and peak memory per rank, costs).

    Laid out one key per line, one rank (and one timed job) per line; ``compact`` gives one line.
    """
    data = schedule_dict(schedule, sim)
    if compact:
        return json.dumps(data, separators=(",", ":"))
    lines = ["{"]
    for i, (key, value) in enumerate(data.items()):
        if key in ("ranks", "jobs"):
            body = "[\n" + ",\n".join("  " + json.dumps(item) for item in value) + "\n ]"
        else:
            body = json.dumps(value)
        lines.append(f" {json.dumps(key)}: {body}" + ("," if i < len(data) - 1 else ""))
    lines.append("}")
    return "\n".join(lines)


def from_json(text: str) -> Schedule:
    """Schedule of :func:`to_json` text (timings, if any, are ignored)."""
    data = json.loads(text) if isinstance(text, str) else text
    if not isinstance(data, dict):
        raise ValueError(f"schedule JSON must be an object with pp, vpp, m and ranks, got "
                         f"{type(data).__name__}")
    missing = [k for k in ("pp", "vpp", "m", "ranks") if k not in data]
    if missing:
        raise ValueError(f"schedule JSON lacks {missing}")
    ranks = data["ranks"]
    if not isinstance(ranks, list) or not all(
            isinstance(row, list) and all(isinstance(cell, str) for cell in row) for row in ranks):
        raise ValueError("schedule JSON 'ranks' must be a list (one per rank) of lists of job "
                         f"strings such as '0F0', got {json.dumps(ranks)[:80]}")
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"schedule JSON 'options' must be an object, got "
                         f"{type(options).__name__}")
    rows = [[Action.parse(cell) for cell in row] for row in ranks]
    schedule = schedule_from_actions(rows, pp=data["pp"], vpp=data["vpp"], m=data["m"],
                                     placement=data.get("placement", LOOPED),
                                     name=data.get("name", "json"),
                                     split_backward=data.get("split_backward"))
    schedule.options = dict(options)
    if "lowered" in data:
        schedule.lowered = bool(data["lowered"])
    return schedule

"""Discrete-event simulation of a schedule: each rank runs its list in order; a job starts when
its rank is free and its dependencies are done (plus the latency ``comm`` when they ran on
another rank).  Send / recv jobs take no time of their own: the latency stands for them.

Memory model (units of one stage's activations for one micro-batch): +1 at the end of F(s, mb);
-1 at the end of its B, or -(1-h) at the end of I and -h at the end of W, with h =
``Costs.w_memory`` (1/2 by default, as in the zero-bubble paper).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .deps import DependencyGraph
from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, Job, Schedule

Number = Union[int, float]
PerStage = Union[Number, Sequence[Number]]
COST_FIELDS = ("forward", "backward", "backward_b", "backward_w")
EXTRA_FIELDS = ("comm", "w_memory")


@dataclass(frozen=True)
class Costs:
    """Time per job kind, a scalar or one value per global virtual stage, and the p2p latency.

    ``backward`` defaults to ``backward_b + backward_w``.  ``w_memory`` is the memory model's one
    calibrated number: the units of a stage's activations still alive between the end of its I
    and the end of its W (the zero-bubble paper's 1/2; ``pipesplit profile`` measures it, and in
    Paddle's executor it is larger, since W reads every matmul input plus the output gradients
    that I produced).
    """

    forward: PerStage = 1.0
    backward: Optional[PerStage] = None
    backward_b: PerStage = 1.0
    backward_w: PerStage = 1.0
    comm: Number = 0.0
    w_memory: Number = 0.5

    def __post_init__(self):
        for name in COST_FIELDS:
            value = getattr(self, name)
            if name == "backward" and value is None:
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            if isinstance(value, (list, tuple)) and not value:
                raise ValueError(f"costs.{name} must be a number or one number per stage, "
                                 "got an empty list")
            if not all(_is_cost(item) for item in values):
                raise ValueError(f"costs.{name} must be finite numbers >= 0, got {value!r}")
        for name in EXTRA_FIELDS:
            value = getattr(self, name)
            if not _is_cost(value):
                raise ValueError(f"costs.{name} must be a finite number >= 0, got {value!r}")

    def memory_delta(self, kind: str) -> float:
        """Change of live activation units at the end of a ``kind`` job (see class doc)."""
        return {FORWARD: 1.0, BACKWARD: -1.0, BACKWARD_B: self.w_memory - 1.0,
                BACKWARD_W: -self.w_memory}.get(kind, 0.0)

    def of(self, kind: str, stage: int) -> float:
        """Cost of a ``kind`` job on global ``stage`` (0 for send / recv / optimizer)."""
        if kind == BACKWARD and self.backward is None:
            return self.of(BACKWARD_B, stage) + self.of(BACKWARD_W, stage)
        if kind not in COST_FIELDS:
            return 0.0
        value = getattr(self, kind)
        if isinstance(value, (list, tuple)):
            if not 0 <= stage < len(value):
                raise ValueError(f"costs.{kind} has {len(value)} entries, stage {stage} needs more")
            return float(value[stage])
        return float(value)

    def check_stages(self, num_stages: int) -> None:
        for name in COST_FIELDS:
            value = getattr(self, name)
            if isinstance(value, (list, tuple)) and len(value) != num_stages:
                raise ValueError(f"costs.{name} has {len(value)} entries; the schedule has "
                                 f"{num_stages} virtual stages (pp*vpp)")

    @classmethod
    def from_string(cls, text: str, comm: Number = 0.0) -> "Costs":
        """``"tF,tB,tI,tW"`` (or ``"tF,tB"``, then tI = tW = tB/2)."""
        try:
            parts = [float(p) for p in text.split(",")]
        except ValueError:
            raise ValueError(f"cost must be numbers 'tF,tB,tI,tW', got {text!r}") from None
        if len(parts) == 2:
            parts += [parts[1] / 2, parts[1] / 2]
        if len(parts) != 4:
            raise ValueError(f"cost must be 'tF,tB,tI,tW' (4 numbers) or 'tF,tB', got {text!r}")
        return cls(*parts, comm=comm)

    def to_dict(self) -> dict:
        return {name: (list(v) if isinstance(v, (list, tuple)) else v)
                for name, v in ((n, getattr(self, n)) for n in COST_FIELDS + EXTRA_FIELDS)}

    @classmethod
    def from_dict(cls, data: dict) -> "Costs":
        if not isinstance(data, dict):
            raise TypeError(f"costs must be a dict of {COST_FIELDS + EXTRA_FIELDS}, got "
                            f"{type(data).__name__}")
        unknown = set(data) - set(COST_FIELDS) - set(EXTRA_FIELDS)
        if unknown:
            raise ValueError(f"unknown cost fields {sorted(unknown)}; expected {COST_FIELDS + EXTRA_FIELDS}")
        missing = [n for n in ("forward", "backward_b", "backward_w") if n not in data]
        if missing:
            raise ValueError(f"costs lack {missing}; every compute kind needs a time")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})

    @classmethod
    def load(cls, path: str) -> "Costs":
        """Costs of a JSON file: a :meth:`to_dict` object, or an object holding one under
        ``"costs"`` (a ``pipesplit profile`` file)."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError(f"cost file {path}: the top level must be a JSON object (cost "
                             f"fields, or a profile with a 'costs' object), got "
                             f"{_json_kind(data)}")
        if "costs" in data:
            data = data["costs"]
            if not isinstance(data, dict):
                raise ValueError(f"cost file {path}: 'costs' must be a JSON object of cost "
                                 f"fields, got {_json_kind(data)}")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cost file {path}: {exc}") from None


def _is_cost(value) -> bool:
    """A finite real number >= 0 (NaN would make every comparison false, inf every makespan)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0


def _json_kind(value) -> str:
    return {list: "a list", type(None): "null", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}")


@dataclass(frozen=True)
class TimedJob:
    rank: int
    index: int
    job: Job
    stage: int
    start: float
    end: float


@dataclass
class SimResult:
    schedule: Schedule
    costs: Costs
    timeline: List[List[TimedJob]]
    makespan: float
    busy: List[float]
    peak_memory: List[float]
    memory_curve: List[List[Tuple[float, float]]] = field(repr=False, default_factory=list)

    @property
    def bubble_ratio(self) -> float:
        """Idle share of all ranks' time up to the makespan."""
        total = self.makespan * self.schedule.pp
        return 0.0 if total == 0 else 1.0 - sum(self.busy) / total

    @property
    def max_peak_memory(self) -> float:
        return max(self.peak_memory)

    def start_of(self) -> Dict[Tuple[int, int], float]:
        """(rank, index in the rank's list) -> start time, compute jobs only."""
        return {(t.rank, t.index): t.start for row in self.timeline for t in row}


def simulate(schedule: Schedule, costs: Optional[Costs] = None) -> SimResult:
    """Time every compute job of ``schedule`` (send / recv jobs are skipped)."""
    from .validate import ScheduleError, explain_deadlock  # validate imports nothing of ours back

    costs = costs if costs is not None else Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, got {type(costs).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule (build_schedule(...)), got "
                        f"{type(schedule).__name__}")
    costs.check_stages(schedule.num_stages)
    graph = DependencyGraph(schedule)
    table = graph.dependency_table()
    stage_of_id = [stage for stage, _, _ in graph.keys]
    cost = _cost_table(costs, schedule.num_stages)
    comm = costs.comm
    end: List[Optional[float]] = [None] * len(graph.keys)  # per key id
    timeline: List[List[TimedJob]] = [[] for _ in range(schedule.pp)]
    clock = [0.0] * schedule.pp
    head = [0] * schedule.pp
    remaining = sum(1 for row in graph.key_ids for kid in row if kid >= 0)

    while remaining:
        progressed = False
        for rank, jobs in enumerate(schedule.ranks):
            index, count = head[rank], len(jobs)
            deps, ids, row = table[rank], graph.key_ids[rank], timeline[rank]
            while index < count:
                kid = ids[index]
                if kid < 0:  # send / recv / optimizer: no time of its own
                    index += 1
                    continue
                start = clock[rank]
                for dep, dep_rank in deps[index]:
                    if dep < 0:
                        continue  # no rank runs it: nothing to wait for (as dependencies())
                    finished = end[dep]
                    if finished is None:
                        break
                    if dep_rank != rank:
                        finished += comm
                    if finished > start:
                        start = finished
                else:
                    job = jobs[index]
                    stage = stage_of_id[kid]
                    try:
                        finish = start + cost[job.kind][stage]
                    except IndexError:  # placement has more stages than pp*vpp: costs.of raises
                        finish = start + costs.of(job.kind, stage)
                    end[kid] = finish
                    row.append(TimedJob(rank, index, job, stage, start, finish))
                    clock[rank] = finish
                    index += 1
                    remaining -= 1
                    progressed = True
                    continue
                break  # a dependency has not finished yet
            head[rank] = index
        if not progressed:
            raise ScheduleError(explain_deadlock(schedule.compute_only()))
    makespan = max(clock) if timeline else 0.0
    busy = [sum(t.end - t.start for t in row) for row in timeline]
    curves = [_memory_curve(row, costs) for row in timeline]
    peaks = [max((level for _, level in curve), default=0.0) for curve in curves]
    return SimResult(schedule, costs, timeline, makespan, busy, peaks, curves)


def _cost_table(costs: Costs, num_stages: int) -> Dict[str, List[float]]:
    """kind -> per-stage cost, so the event loop indexes lists instead of calling ``costs.of``."""
    return {kind: [costs.of(kind, stage) for stage in range(num_stages)]
            for kind in (FORWARD, BACKWARD, BACKWARD_B, BACKWARD_W)}


def _memory_curve(row: Sequence[TimedJob], costs: Costs) -> List[Tuple[float, float]]:
    """(time, live activation units) after each job of one rank; frees before allocations."""
    events = sorted(((t.end, costs.memory_delta(t.job.kind)) for t in row),
                    key=lambda e: (e[0], e[1]))
    level, curve = 0.0, []
    for time, delta in events:
        level += delta
        curve.append((time, level))
    return curve


def lower_bound(pp: int, vpp: int, m: int, costs: Optional[Costs] = None) -> float:
    """(p-1)(tF+c) + m*v*(tF+tB): the last rank cannot start before the first forward reaches
    it and must then do all of its own work (uniform costs; per-stage costs use the slowest
    rank's own work and the forward path to its first stage)."""
    costs = costs or Costs()
    from .placement import LOOPED, Placement

    placement = Placement(LOOPED, pp, vpp)
    best = 0.0
    for rank in range(pp):
        stages = [placement.stage(rank, c) for c in range(vpp)]
        work = m * sum(costs.of(FORWARD, s) + costs.of(BACKWARD, s) for s in stages)
        head = sum(costs.of(FORWARD, s) for s in range(rank)) + rank * costs.comm
        best = max(best, head + work)
    return best

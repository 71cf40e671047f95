"""``auto`` under a memory budget in bytes: the simulator's memory units, priced in bytes measured
through the engine.

During the measured training step (:mod:`pipesplit.passes.measure.replan`) Paddle's profiler
also records every allocation with the allocator's live bytes after it
(:func:`pipesplit.passes.measure.profile.record_jobs_and_memory`).  Per process that gives,
for each compute job, the live bytes at its end and the highest they reached while it ran
(:func:`job_memory`); per job kind and global stage, the (low) median over the micro-batches
of

* its **delta**: live bytes at its end minus at the end of the compute job before it (a recv's
  buffer is charged to the compute job that reads it);
* its **excess**: the highest live bytes while it ran minus the same start (its temporaries).

:func:`rank_memory` keeps these with the bytes live when the step began (parameters, optimizer
states, everything resident).  :class:`MemoryModel` turns every process's figures into one
price per pipeline rank (the worst process of that rank, under data / tensor parallelism):

* ``unit``: the bytes a forward keeps alive (the simulator's +1 unit; the largest chunk of the
  rank);
* ``rest``: the most any job holds above the level the simulator counts (a forward's
  temporaries beyond what it keeps, or a backward's on top of the level it started from);
* ``start``: the resident bytes;

and one ``w_memory`` for the simulator (what an I leaves for its W: the bytes every W frees
over the bytes every forward keeps, over the stages that ran W; Paddle's W reads the matmul
inputs, so nearly a whole unit).  A schedule's peak on
rank r is then ``start + units * unit + rest`` (units: the simulator's peak), an upper bound
that the rank reaches when its worst job runs at its highest level.  A budget in bytes becomes
the search's ``memory_limit`` in units, one per rank: ``(budget - start - rest) / unit`` of
that rank's price (rank 0 of a pipeline, which keeps the most forwards, often has the most
room: the last rank's logits and loss are its ``rest``).
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from pipesplit.job_list.bounds import minimum_memory
from pipesplit.job_list.costs import Costs
from pipesplit.job_list.ir import BACKWARD_W, COMPUTE_KINDS, FORWARD, parse_job_type
from pipesplit.job_list.placement import Placement
from pipesplit.job_list.text import format_bytes, parse_size



class MemoryBudgetError(ValueError):
    """The memory budget admits no schedule: it names the budget and the smallest that would
    serve (``budget`` / ``smallest``, bytes).  Raised at the re-plan, on every process alike
    (they share one measurement)."""

    def __init__(self, message: str, budget: int, smallest: int):
        super().__init__(message)
        self.budget, self.smallest = budget, smallest


def parse_budget(budget) -> int:
    """Bytes of a budget: an int of bytes, or a string with a binary suffix (``"48MB"``,
    ``"60 GiB"``; 1 KB = 1024 B)."""
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise TypeError(f"budget must be an int of bytes or a string such as '48MB', got "
                        f"{type(budget).__name__}")
    if isinstance(budget, int):
        value = budget
    else:
        size = parse_size(budget)
        if size is None or size[1] is None:
            raise ValueError(f"budget must be bytes with a suffix B/KB/MB/GB/TB (binary: 1 KB = "
                             f"1024 B), got {budget!r}")
        value = int(size[0] * size[1])
    if value <= 0:
        raise ValueError(f"budget must be > 0 bytes, got {budget!r}")
    return value


# --------------------------------------------------------------------------- one process

def job_memory(spans: Sequence[Tuple[str, int, int, int]],
               events: Sequence[Tuple[int, int]]) -> List[Tuple[str, int, int]]:
    """(job type, live bytes at its end, highest live bytes while it ran) of every job of
    ``spans`` ((type, micro-batch, start ns, end ns), in run order), from the allocator's
    ``events`` ((ns, live bytes after it), any order).  A job that allocated nothing has its
    start's level as its highest."""
    events = sorted(events)
    times = [t for t, _ in events]

    def level_at(t: int) -> int:
        i = bisect.bisect_right(times, t) - 1
        return events[i][1] if i >= 0 else 0

    out = []
    for job_type, _, start, end in spans:
        inside = [live for _, live in events[bisect.bisect_left(times, start):
                                             bisect.bisect_right(times, end)]]
        out.append((job_type, level_at(end), max(inside + [level_at(start)])))
    return out


def rank_memory(levels: Sequence[Tuple[str, int, int]], start: int, pp_stage: int,
                placement: Placement) -> dict:
    """This process's memory figures (see the module doc) from :func:`job_memory`'s
    ``levels``; ``start``: the live bytes when the step began; its chunks are pipeline rank
    ``pp_stage``'s under ``placement``."""
    delta: Dict[str, Dict[str, List[int]]] = {}
    excess: Dict[str, Dict[str, List[int]]] = {}
    before = start
    for job_type, end, highest in levels:
        try:
            kind, chunk = parse_job_type(job_type)
        except ValueError:
            continue
        if kind not in COMPUTE_KINDS:
            continue
        stage = str(placement.stage(pp_stage, chunk))
        delta.setdefault(kind, {}).setdefault(stage, []).append(end - before)
        excess.setdefault(kind, {}).setdefault(stage, []).append(highest - before)
        before = end
    return {"pp_stage": pp_stage, "start": int(start),
            "delta": _medians(delta), "excess": _medians(excess)}


def _medians(values: Dict[str, Dict[str, List[int]]]) -> Dict[str, Dict[str, float]]:
    """The low median per kind and stage: a sample, never the mean of two.  On CPU the
    executor frees on a thread of its own, so now and then a job's end still holds its
    temporaries (and the next job's is that much lower); with m = 4 micro-batches two such
    samples of a chunk made the median halfway (7.05 MiB for a 4.76 MiB forward)."""
    return {k: {s: float(statistics.median_low(v)) for s, v in per.items()}
            for k, per in values.items()}


# --------------------------------------------------------------------------- every process

@dataclass(frozen=True)
class RankPrice:
    """One pipeline rank's bytes: resident, per unit, and the most a job holds beyond its
    units."""

    start: float
    unit: float
    rest: float

    def peak(self, units: float) -> float:
        return self.start + units * self.unit + self.rest


@dataclass(frozen=True)
class MemoryModel:
    """The bytes of the simulator's memory model for one pipeline (see the module doc)."""

    ranks: Tuple[RankPrice, ...]
    w_memory: Optional[float]  # None: no stage ran an I / W split

    @classmethod
    def from_measurements(cls, memories: Sequence[dict], pp: int) -> "MemoryModel":
        """From every process's :func:`rank_memory` (the worst process per pipeline rank)."""
        worst: Dict[int, RankPrice] = {}
        freed, kept = 0.0, 0.0  # over every stage that ran W: bytes its W frees, its F keeps
        for mem in memories:
            delta, excess = mem["delta"], mem["excess"]
            forward = delta.get(FORWARD, {})
            if not forward:
                raise ValueError(f"pipeline rank {mem['pp_stage']} measured no forward job")
            price = RankPrice(
                start=mem["start"], unit=max(max(forward.values()), 0.0),
                rest=max(max(0.0, excess[k][s] - max(delta[k][s], 0.0))
                         for k in delta for s in delta[k]))
            for s, w in delta.get(BACKWARD_W, {}).items():
                if forward.get(s, 0) > 0:
                    freed, kept = freed - w, kept + forward[s]
            old = worst.get(mem["pp_stage"])
            worst[mem["pp_stage"]] = price if old is None else RankPrice(
                *(max(a, b) for a, b in ((old.start, price.start), (old.unit, price.unit),
                                         (old.rest, price.rest))))
        missing = [r for r in range(pp) if r not in worst]
        if missing:
            raise ValueError(f"no memory measurement of pipeline rank(s) {missing} of {pp}")
        # the ratio of the sums: a stage whose forward keeps almost nothing (a tiny model's
        # last stage) would make its own ratio any number
        w_memory = max(0.0, freed / kept) if kept > 0 else None
        return cls(tuple(worst[r] for r in range(pp)), w_memory)

    def costs(self, costs: Costs) -> Costs:
        """``costs`` with the measured ``w_memory`` (unchanged when no W ran)."""
        return costs if self.w_memory is None else replace(costs, w_memory=round(
            self.w_memory, 4))

    def peaks(self, schedule, costs: Costs) -> List[float]:
        """Bytes per pipeline rank ``schedule`` reaches at most under this model."""
        from pipesplit.job_list.simulate import simulate

        units = simulate(schedule, self.costs(costs).as_latency()).peak_memory
        return [price.peak(u) for price, u in zip(self.ranks, units)]

    def memory_limit(self, budget: int, schedule_name: str, pp: int, vpp: int, m: int,
                     costs: Costs) -> Tuple[float, ...]:
        """The search's ``memory_limit``, one per pipeline rank (units), that keeps each rank
        within ``budget`` bytes: rank r's is ``(budget - start - rest) / unit`` of its own
        price (a rank that keeps more resident, or larger units, holds fewer); no more than
        every forward of the step.  :class:`MemoryBudgetError` when a rank's is below the
        least any schedule needs, naming the smallest budget that would serve."""
        w_memory = self.costs(costs).w_memory
        least = minimum_memory(pp, vpp, m, w_memory)
        most = m * vpp + max(0.0, w_memory - 1.0)  # every forward of the step kept: no more
        limits = tuple(min(most, (budget - p.start - p.rest) / p.unit) if p.unit > 0 else most
                       for p in self.ranks)
        if min(limits) < least:
            smallest = max(p.peak(least) for p in self.ranks)
            raise MemoryBudgetError(
                f"memory budget {format_bytes(budget, exact=True)} is below what any "
                f"{schedule_name} schedule needs: the smallest budget that serves is "
                f"{format_bytes(smallest, exact=True)} (per pipeline rank: resident + "
                f"{least:g} forward(s) kept + temporaries = "
                + ", ".join(format_bytes(p.peak(least), exact=True) for p in self.ranks) + ")",
                budget, int(smallest))
        return limits

    def to_dict(self) -> dict:
        return {"w_memory": self.w_memory,
                "ranks": [{"start_bytes": int(p.start), "unit_bytes": int(p.unit),
                           "rest_bytes": int(p.rest)} for p in self.ranks]}


"""Lower bounds on the makespan, and the memory limits of the search: facts of the simulator's
model (:mod:`costs`) that hold for every schedule of a placement.

Both bounds take the placement the same way (``placement``, default looped).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

from .costs import Costs
from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD
from .placement import LOOPED, Placement

EPS = 1e-9

#: a memory limit in the simulator's units: one number for every pipeline rank, or one per rank
MemoryLimit = Union[float, Tuple[float, ...]]


def checked_memory_limit(memory_limit, pp: int) -> MemoryLimit:
    """``memory_limit`` checked, as a float (every rank's limit) or a tuple of ``pp`` floats
    (rank r's limit at r): each a finite number > 0 of activation units.  Per-rank limits
    serve a memory budget in bytes, where each rank keeps its own resident bytes and unit."""
    if isinstance(memory_limit, (list, tuple)):
        if len(memory_limit) != pp:
            raise ValueError(f"memory_limit must be one number or one per pipeline rank "
                             f"({pp}), got {len(memory_limit)} numbers: {memory_limit!r}")
        return tuple(_checked_units(v, memory_limit) for v in memory_limit)
    return _checked_units(memory_limit, memory_limit)


def _checked_units(value, given) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"memory_limit must be a number or a sequence of one number per "
                        f"pipeline rank (activation units), got {type(given).__name__} {given!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"memory_limit must be a finite number > 0 (per rank), got {given!r}")
    return float(value)


def rank_limits(memory_limit: MemoryLimit, pp: int) -> Tuple[float, ...]:
    """Each pipeline rank's limit (of a checked ``memory_limit``)."""
    if isinstance(memory_limit, (list, tuple)):
        return tuple(memory_limit)
    return (float(memory_limit),) * pp


def fits(peaks: Sequence[float], limits: Sequence[float]) -> bool:
    """Whether every rank's peak is within its limit."""
    return all(p <= lim + EPS for p, lim in zip(peaks, limits))


def format_limit(memory_limit: MemoryLimit) -> str:
    """``2.5``, or ``(2, 1.5)`` for one limit per rank (error messages)."""
    return (f"{memory_limit:g}" if not isinstance(memory_limit, tuple)
            else "(" + ", ".join(f"{v:g}" for v in memory_limit) + ")")


def default_memory_limit(pp: int, vpp: int, m: int) -> float:
    """1F1B's peak at full-stage size: ``min(pp, m)`` micro-batches of ``vpp`` virtual stages."""
    return float(min(pp, m) * vpp)


def minimum_memory(pp: int, vpp: int, m: int, w_memory: float = 0.5) -> float:
    """The least peak (units per rank) any valid schedule reaches: ``vpp`` (when the last stage
    runs a micro-batch's I, every rank still holds all vpp forwards of it), plus what that I
    adds when the calibrated ``w_memory`` exceeds a whole unit."""
    return float(vpp) + max(0.0, w_memory - 1.0)


def lower_bound(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
                placement: str = LOOPED) -> float:
    """(p-1)(tF+c) + m*v*(tF+tB): the last rank cannot start before the first forward reaches
    it and must then do all of its own work (uniform costs; per-stage costs use the slowest
    rank's own work, with the stages ``placement`` gives it, and the forward path to its first
    stage)."""
    costs = costs or Costs()
    layout = Placement(placement, pp, vpp)
    best = 0.0
    for rank in range(pp):
        stages = [layout.stage(rank, c) for c in range(vpp)]
        work = m * sum(costs.of(FORWARD, s) + costs.of(BACKWARD, s) for s in stages)
        head = sum(costs.of(FORWARD, s) for s in range(rank)) + rank * costs.comm
        best = max(best, head + work)
    return best


def memory_lower_bound(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
                       memory_limit: Optional[MemoryLimit] = None, placement: str = LOOPED
                       ) -> float:
    """A lower bound on the makespan of any schedule whose per-rank peak is <= ``memory_limit``
    (one limit, or one per rank: :func:`checked_memory_limit`).

    :func:`lower_bound` (rank work plus the forward path to it), tightened per rank by
    two idle periods the memory limit forces (same model as the simulator):

    * start: no W runs before the rank's first I, so before the earliest time an I can start
      there (forward chain to the last stage and input-gradient chain back) the rank runs at most
      ``floor(limit)`` forwards;
    * tail: after the rank's last F, the I of that micro-batch waits for the forward / backward
      round trip through the later stages; meanwhile the rank can only work on what it holds,
      at most ``limit - 1`` units.

    Both are idle time on top of the rank's work.  The search stops when it reaches the bound.
    """
    costs = costs or Costs()
    layout = Placement(placement, pp, vpp)
    S = pp * vpp
    if memory_limit is None:
        memory_limit = default_memory_limit(pp, vpp, m)
    tf = [costs.of(FORWARD, s) for s in range(S)]
    ti = [costs.of(BACKWARD_B, s) for s in range(S)]
    tw = [costs.of(BACKWARD_W, s) for s in range(S)]
    c = float(costs.comm)
    rank = [layout.rank_of(s) for s in range(S)]
    # earliest end of F(s) / earliest start of F(s) along the forward chain
    f_end = [0.0] * S
    t = 0.0
    for s in range(S):
        if s > 0 and rank[s] != rank[s - 1]:
            t += c
        t += tf[s]
        f_end[s] = t
    # earliest start of I(s): I(s+1) must end (plus c across ranks), F(s) must end
    i_start = [0.0] * S
    i_start[S - 1] = f_end[S - 1]
    for s in range(S - 2, -1, -1):
        arrive = i_start[s + 1] + ti[s + 1] + (c if rank[s + 1] != rank[s] else 0.0)
        i_start[s] = max(arrive, f_end[s])
    limits = rank_limits(checked_memory_limit(memory_limit, pp), pp)
    best = lower_bound(pp, vpp, m, costs, placement)
    for r in range(pp):
        held = int(limits[r] + EPS)
        stages = [layout.stage(r, ch) for ch in range(vpp)]
        work = m * sum(tf[s] + ti[s] + tw[s] for s in stages)
        head = min(f_end[s] - tf[s] for s in stages)
        first_i = min(i_start[s] for s in stages)
        n_f = min(held, m * vpp)
        idle_start = max(head, first_i - n_f * min(tf[s] for s in stages))
        # round trip from the end of F(s) to the start of I(s), same micro-batch
        trip = min(i_start[s] - f_end[s] for s in stages)
        unit = max(max(ti[s] + tw[s], 2 * tw[s]) for s in stages)
        idle_tail = max(0.0, trip - max(0, held - 1) * unit)
        if m * vpp > held:
            idle = idle_start + idle_tail
        else:
            idle = max(idle_start, idle_tail)
        best = max(best, work + idle)
    return best


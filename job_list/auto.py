"""``auto`` / ``autoV``: search for the fastest schedule under a memory limit, deciding per stage
whether its backward runs split (I / W jobs) or as one B job.

The search works in the simulator's model (:mod:`simulate`): a job starts when its rank is free
and its inputs are there (plus the latency ``costs.comm`` across ranks); memory is counted in units
of one virtual stage's activations for one micro-batch, +1 at the end of F, -1/2 at the end of I,
-1/2 at the end of W; the peak is per rank.

Steps, for one placement (``auto``: looped, ``autoV``: V / zig-zag):

0. **Split patterns.**  Steps 1-4 run once per set of split stages (:func:`split_patterns`):
   every stage split, none (every backward one B job), and, per stage, those where the split
   costs no extra time (tI + tW <= tB).  With profiled costs the split is often dearer than B
   (Paddle's executor runs more, smaller kernels), and then 1F1B's plain B wins.  An unsplit
   stage is searched as an I of cost tB that frees all of the stage's memory plus a W of cost
   0 (see :class:`SearchContext`), so the same greedy / layout / local search serves every
   pattern.
1. **Fixed schedules.**  Every registered schedule with that placement that serves
   ``(pp, vpp, m)`` is built split (``split_backward=True``) and, where it does not split by
   definition, also unsplit, and simulated; those whose peak fits the limit are the baseline
   (so the result is never worse than the best of them, split or not).
2. **Greedy list scheduling.**  Time runs forward; whenever a rank is free it picks one of its
   ready jobs by a :class:`GreedyPolicy`: I's first (they are on the critical path back to
   rank 0), an F when the memory allows it, W's to fill time nothing else can use; with
   lookahead, a rank waits for an I that arrives before the W / F it would start could finish.
   Several policies (F / I / W order, tie-breaks, lookahead, tighter internal memory caps) are
   tried.  With ``admit="reserve"`` a rank only starts a new micro-batch when the memory for all
   of that micro-batch's forwards on the rank is free, which never deadlocks for a limit >=
   ``vpp``.
3. **Layout search.**  (looped placement) Coordinate descent over the per-rank warm-up counts
   and W deferrals of the ZB-H1 / InterleavedZB layout (:func:`layout_search`), seeded from
   those schedules, evaluated with the simulator.
4. **Local search.**  The best order is improved by moving W's: a W is moved back into an idle
   gap of its rank, or pushed behind the F / I it delays; a move is kept if the simulated
   makespan drops and the peak still fits.  The number of moves tried is bounded, so the search
   is deterministic.

The best valid schedule wins (the fixed schedule on ties).  Steps 2-4 are skipped when a fixed
schedule already reaches :func:`memory_lower_bound` (then nothing can be faster), and the local
search stops at that bound.

``memory_limit`` (peak units per rank: one number for every rank, or one per rank, which is
what a memory budget in bytes gives: each rank has its own resident bytes and unit, see
:mod:`pipesplit.passes.measure.memory_budget`) defaults to 1F1B's peak at full-stage size:
``min(pp, m) * vpp`` — rank 0 of 1F1B holds ``min(pp, m)`` micro-batches of a whole stage, and a
whole stage is ``vpp`` virtual stages.  No valid schedule peaks below ``vpp`` (when the last stage
starts the I of a micro-batch, every rank still holds all ``vpp`` forwards of it), so a limit
below ``vpp`` raises ``ValueError`` stating that minimum.

**Rendezvous costs.**  The search always runs in the fast latency model
(``costs.as_latency()``).  When ``costs.comm_mode == "rendezvous"`` (blocking transfers, gloo
on CPU: see :class:`~.costs.Costs`), its finalists — every fixed schedule that fits the limit
and the best order of each placement and split pattern — are re-ranked at the end with the
rendezvous simulation (:func:`simulate.simulate` on the lowered schedule), and the fastest of
them whose peak fits wins (the baseline too is the fastest fixed schedule under that model).
So the result is never slower, under rendezvous, than any fixed schedule that fits.

To let the search also choose the placement, call :func:`auto_search` with
``placements=(LOOPED, V_SHAPE)``; its result records the placement it chose.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .bounds import (MemoryLimit, checked_memory_limit, default_memory_limit, fits,
                     format_limit, memory_lower_bound, minimum_memory, rank_limits)
from .costs import Costs
from .greedy import GreedyPolicy, default_policies, greedy_orders, warmup_vectors
from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, Job, Schedule
from .layout import layout_orders, layout_search
from .local_search import improve
from .placement import LOOPED, V_SHAPE, Placement, check_positive_int
from .registry import register_schedule, schedule_specs
from .search_context import EPS, INF, SearchContext
from .simulate import simulate

#: names importers use from here; the pieces live in the modules above
__all__ = ["AUTO_NAMES", "AutoResult", "GreedyPolicy", "SearchContext", "auto_search",
           "default_memory_limit", "default_policies", "fixed_candidates", "greedy_orders",
           "improve", "layout_orders", "layout_search", "memory_lower_bound", "minimum_memory",
           "split_patterns", "split_stages_of", "warmup_vectors"]

#: the names this module registers; whether a schedule searches is
#: :attr:`~pipesplit.job_list.registry.ScheduleSpec.searches` (its generator takes a memory limit)
AUTO_NAMES = ("auto", "autoV")
#: how many of the best distinct candidates the local search starts from
LOCAL_SEARCH_SEEDS = 3


# --------------------------------------------------------------------------- the search

@dataclass
class AutoResult:
    """What :func:`auto_search` found."""

    schedule: Schedule
    makespan: float
    peak: float                   # the highest rank's
    memory_limit: MemoryLimit     # one for every rank, or one per rank
    placement: str
    source: str                   # "fixed:<name>", "greedy[...]" or "greedy[...]+local"
    baseline: Optional[str]       # best fixed schedule that fits the limit
    baseline_makespan: float
    search_seconds: float
    bound: float = 0.0            # memory_lower_bound of the chosen placement
    tried: Dict[str, float] = field(default_factory=dict, repr=False)
    peaks: tuple = ()             # per rank





def split_stages_of(schedule: Schedule) -> frozenset:
    """Global stages whose backward ``schedule`` runs as I / W jobs (the others run B)."""
    return frozenset(schedule.placement.stage(r, j.chunk) for r, jobs in enumerate(schedule.ranks)
                     for j in jobs if j.kind in (BACKWARD_B, BACKWARD_W))


def fixed_candidates(pp: int, vpp: int, m: int, placement: str, costs: Costs):
    """(label, schedule, makespan, peak per rank) of every registered non-auto schedule with
    ``placement``: split (label = name) and, for the ones that do not split by definition,
    also unsplit (label ``name/B``: every backward a single B job)."""
    out = []
    for spec in schedule_specs():
        if spec.searches or spec.placement != placement:
            continue
        name = spec.name
        variants = [(name, True)] + ([] if spec.splits_backward else [(f"{name}/B", False)])
        for label, split in variants:
            try:
                schedule = spec.build(pp, vpp, m, split_backward=split)
                result = simulate(schedule, costs)
            except ValueError:
                break  # the schedule cannot serve this configuration
            out.append((label, schedule, result.makespan, tuple(result.peak_memory)))
    return out


def split_patterns(costs: Costs, num_stages: int) -> List[frozenset]:
    """The sets of split stages the search tries: all, none, and (per stage) those where the
    split costs no extra time (tI + tW <= tB), each once.

    Only "all" when the split is free on every stage and I holds no more than B did
    (``w_memory <= 1``): then any order with B jobs has a split twin (each B replaced by its
    I and W back to back) that ends no job later and peaks no higher."""
    every = frozenset(range(num_stages))
    cheap = frozenset(s for s in range(num_stages)
                      if costs.of(BACKWARD_B, s) + costs.of(BACKWARD_W, s)
                      <= costs.of(BACKWARD, s) + EPS)
    if cheap == every and costs.w_memory <= 1.0:
        return [every]
    out = []
    for pattern in (every, frozenset(), cheap):
        if pattern not in out:
            out.append(pattern)
    return out


def _pattern_label(pattern: frozenset, num_stages: int) -> str:
    if len(pattern) == num_stages:
        return "split"
    if not pattern:
        return "B"
    return "split{" + ",".join(map(str, sorted(pattern))) + "}"


def auto_search(pp: int, vpp: int = 1, m: int = 1, costs: Optional[Costs] = None,
                memory_limit: Optional[MemoryLimit] = None,
                placements: Sequence[str] = (LOOPED,), local_search: bool = True) -> AutoResult:
    """Fastest schedule found whose simulated peak on each rank is <= ``memory_limit`` (one
    number for every rank, or a sequence of one per rank), over the placements and the split
    patterns of :func:`split_patterns` (the backward of each stage split into I / W, or one
    B)."""
    check_positive_int("pp", pp)
    check_positive_int("vpp", vpp)
    check_positive_int("m", m)
    costs = costs if costs is not None else Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, got {type(costs).__name__}")
    least = minimum_memory(pp, vpp, m, costs.w_memory)
    if memory_limit is None:
        memory_limit = default_memory_limit(pp, vpp, m)
    memory_limit = checked_memory_limit(memory_limit, pp)
    limits = rank_limits(memory_limit, pp)
    if min(limits) < least - EPS:
        raise ValueError(f"memory_limit must be >= {least:g} on every rank (vpp={vpp} units: "
                         f"every valid schedule holds all vpp forwards of a micro-batch on each "
                         f"rank, plus max(0, w_memory-1)), got {format_limit(memory_limit)}")
    costs.check_stages(pp * vpp)
    search_costs = costs.as_latency()  # the fast model; rendezvous re-ranks the finalists
    began = time.perf_counter()
    best = None  # (makespan, placement, source, job lists, bound)
    baseline, baseline_span = None, INF
    tried: Dict[str, float] = {}
    finalists = []  # (placement, source, job lists, bound, is fixed) for the rendezvous re-rank
    patterns = split_patterns(search_costs, pp * vpp)
    for placement in placements:
        fixed = fixed_candidates(pp, vpp, m, placement, search_costs)
        for label, schedule, span, peak in fixed:
            tried[f"fixed:{label}@{placement}"] = span
            if fits(peak, limits) and span < baseline_span - EPS:
                baseline, baseline_span = label, span
        bounds = []
        for pattern in patterns:
            ctx = SearchContext(pp, vpp, m, placement, search_costs, pattern)
            fitting = [(label, schedule, span) for label, schedule, span, peak in fixed
                       if fits(peak, limits) and split_stages_of(schedule) == pattern]
            found = _search_pattern(ctx, memory_limit, fitting, tried, local_search)
            if found is None:
                continue
            span, source, orders, bound = found
            if len(patterns) > 1 and not source.startswith("fixed:"):
                source += f"/{_pattern_label(pattern, pp * vpp)}"
            finalists.append((placement, source, ctx.to_jobs(orders), bound, False))
            bounds.append(bound)
            if best is None or span < best[0] - EPS:
                best = (span, placement, source, ctx.to_jobs(orders), bound)
        # every fitting fixed schedule, split pattern searched or not (e.g. 1F1B/B when only
        # "all split" is searched); bound: the placement's weakest
        finalists.extend((placement, f"fixed:{label}", schedule.ranks, min(bounds, default=0.0),
                          True) for label, schedule, _, peak in fixed
                         if fits(peak, limits))
    if best is None:  # pragma: no cover - reserve policies always succeed for limit >= vpp
        raise ValueError(f"memory_limit {format_limit(memory_limit)} admits no schedule the "
                         f"search found for pp={pp}, vpp={vpp}, m={m}")
    if costs.rendezvous:  # the latency winner is a finalist too
        final, bound, baseline, baseline_span = _rerank_rendezvous(
            finalists, pp, vpp, m, costs, memory_limit)
        schedule = final.schedule
        placement, source = schedule.placement.kind, schedule.options["source"]
    else:
        _, placement, source, ranks, bound = best
        schedule = _auto_schedule(pp, vpp, m, placement, ranks, costs, memory_limit, source)
        final = simulate(schedule, costs)  # the reference simulator has the last word
    return AutoResult(schedule, final.makespan, final.max_peak_memory, memory_limit,
                      placement, source, baseline, baseline_span, time.perf_counter() - began,
                      bound, tried, tuple(final.peak_memory))


def _auto_schedule(pp: int, vpp: int, m: int, placement: str, ranks, costs: Costs,
                   memory_limit: MemoryLimit, source: str, **options) -> Schedule:
    """The Schedule auto / autoV return for the job lists ``ranks``."""
    split = any(j.kind in (BACKWARD_B, BACKWARD_W) for jobs in ranks for j in jobs)
    return Schedule(name="auto" if placement == LOOPED else "autoV", pp=pp, vpp=vpp, m=m,
                    placement=Placement(placement, pp, vpp), ranks=[list(j) for j in ranks],
                    split_backward=split,
                    options={"costs": costs, "memory_limit": memory_limit, "source": source,
                             **options})


def _rerank_rendezvous(finalists, pp: int, vpp: int, m: int, costs: Costs,
                       memory_limit: MemoryLimit):
    """(rendezvous simulation of the fastest finalist whose peak fits, its memory lower bound,
    baseline label, baseline makespan): the first in ``finalists``' order on ties."""
    best, best_bound = None, 0.0
    baseline, baseline_span = None, INF
    limits = rank_limits(memory_limit, pp)
    sims = {}  # the same job lists (a search that kept a fixed schedule) are simulated once
    for placement, source, ranks, bound, is_fixed in finalists:
        key = (placement, tuple(map(tuple, ranks)))
        if key not in sims:
            sims[key] = simulate(_auto_schedule(pp, vpp, m, placement, ranks, costs,
                                                memory_limit, source), costs)
        sim = sims[key]
        if not fits(sim.peak_memory, limits):
            continue
        if is_fixed and sim.makespan < baseline_span - EPS:
            baseline, baseline_span = source[len("fixed:"):], sim.makespan
        if best is None or sim.makespan < best.makespan - EPS:
            best, best_bound = sim, bound
    return best, best_bound, baseline, baseline_span


def _search_pattern(ctx: SearchContext, memory_limit: MemoryLimit, fitting,
                    tried: Dict[str, float], local_search: bool):
    """Steps 1-4 of the module doc for one placement and split pattern: (makespan, source,
    orders, memory lower bound) of the best order found, None if none fits."""
    placement = ctx.placement.kind
    pp, vpp, m = ctx.pp, ctx.vpp, ctx.m
    target = memory_lower_bound(pp, vpp, m, ctx.effective_costs, memory_limit, placement)
    limits = rank_limits(memory_limit, pp)
    pool = []  # (makespan, sum of finish times, source, orders) of every fitting candidate
    for label, schedule, span in fitting:
        orders = ctx.from_schedule(schedule)
        fast = ctx.simulate(orders)
        pool.append((span, fast[2] if fast else INF, f"fixed:{label}", orders))
    if pool and min(item[0] for item in pool) <= target + EPS:
        policies = []  # a fixed schedule reaches the lower bound: nothing can beat it
    else:
        policies = default_policies(pp, vpp, m)
    suffix = f"@{placement}/{_pattern_label(ctx.split_stages, ctx.S)}"
    for policy in policies:
        orders = greedy_orders(ctx, memory_limit, policy)
        result = None if orders is None else ctx.simulate(orders)
        if result is None:
            continue
        span, peak, total = result
        tried[policy.label() + suffix] = span
        if fits(peak, limits):
            pool.append((span, total, policy.label(), orders))
    layout = layout_search(ctx, memory_limit) if policies else None
    if layout is not None:
        tried[layout[2] + suffix] = layout[0]
        pool.append(layout)
    pool.sort(key=lambda item: (item[0], item[1]))
    seen = set()
    starts = []
    for item in pool:  # the few best distinct orders seed the local search
        key = tuple(map(tuple, item[3]))
        if key not in seen:
            seen.add(key)
            starts.append(item)
        if len(starts) == LOCAL_SEARCH_SEEDS:
            break
    best = None
    for span, _, source, orders in starts:
        if local_search and span > target + EPS:
            new_orders, new_span = improve(ctx, orders, memory_limit, target=target)
            if new_span < span - EPS:
                orders, span, source = new_orders, new_span, source + "+local"
        if best is None or span < best[0] - EPS:
            best = (span, source, orders, target)
    return best


@register_schedule("auto", placement=LOOPED, splits_backward=True)
def auto(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
         memory_limit: Optional[MemoryLimit] = None) -> List[List[Job]]:
    """Searched zero-bubble schedule (looped placement): fastest simulated under memory_limit."""
    return auto_search(pp, vpp, m, costs, memory_limit, (LOOPED,)).schedule.ranks


@register_schedule("autoV", aliases=("auto-v",), placement=V_SHAPE, splits_backward=True)
def auto_v(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
           memory_limit: Optional[MemoryLimit] = None) -> List[List[Job]]:
    """Searched zero-bubble schedule (V placement): fastest simulated under memory_limit."""
    return auto_search(pp, vpp, m, costs, memory_limit, (V_SHAPE,)).schedule.ranks

"""``auto`` / ``autoV``: search for the fastest zero-bubble schedule under a memory limit.

The search works in the simulator's model (:mod:`simulate`): a job starts when its rank is free
and its inputs are there (plus the latency ``costs.comm`` across ranks); memory is counted in units
of one virtual stage's activations for one micro-batch, +1 at the end of F, -1/2 at the end of I,
-1/2 at the end of W; the peak is per rank.

Steps, for one placement (``auto``: looped, ``autoV``: V / zig-zag):

1. **Fixed schedules.**  Every registered schedule with that placement that serves
   ``(pp, vpp, m)`` is built with ``split_backward=True`` and simulated; those whose peak fits
   the limit are the baseline (so the result is never worse than the best of them).
2. **Greedy list scheduling.**  Time runs forward; whenever a rank is free it picks one of its
   ready jobs by a :class:`GreedyPolicy`: I's first (they are on the critical path back to
   rank 0), an F when the memory allows it, W's to fill time nothing else can use; with
   lookahead, a rank waits for an I that arrives before the W / F it would start could finish.
   Several policies (F / I / W order, tie-breaks, lookahead, tighter internal memory caps) are
   tried.  With ``admit="reserve"`` a rank only starts a new micro-batch when the memory for all
   of that micro-batch's forwards on the rank is free, which never deadlocks for a limit >=
   ``vpp``.
3. **Local search.**  The best order is improved by moving W's: a W is moved back into an idle
   gap of its rank, or pushed behind the F / I it delays; a move is kept if the simulated
   makespan drops and the peak still fits.  The number of moves tried is bounded, so the search
   is deterministic.

The best valid schedule wins (the fixed schedule on ties).

``memory_limit`` (peak units per rank) defaults to 1F1B's peak at full-stage size:
``min(pp, m) * vpp`` — rank 0 of 1F1B holds ``min(pp, m)`` micro-batches of a whole stage, and a
whole stage is ``vpp`` virtual stages.  No valid schedule peaks below ``vpp`` (when the last stage
starts the I of a micro-batch, every rank still holds all ``vpp`` forwards of it), so a limit
below ``vpp`` raises ``ValueError`` stating that minimum.

To let the search also choose the placement, call :func:`auto_search` with
``placements=(LOOPED, V_SHAPE)``; its result records the placement it chose.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from .ir import BACKWARD_B, BACKWARD_W, FORWARD, Job, Schedule
from .placement import LOOPED, V_SHAPE, Placement, check_positive_int
from .registry import build_schedule, get_spec, register_schedule, schedule_names
from .simulate import Costs, simulate

F, I, W = 0, 1, 2
KIND_NAMES = (FORWARD, BACKWARD_B, BACKWARD_W)
MEMORY_DELTA = (1.0, -0.5, -0.5)
EPS = 1e-9
INF = float("inf")
AUTO_NAMES = ("auto", "autoV")


# --------------------------------------------------------------------------- search context

class SearchContext:
    """Job numbering, costs and a fast simulator for one (pp, vpp, m, placement, costs).

    Job id of (kind, stage, mb) is ``(kind * S + stage) * m + mb`` with S = pp*vpp stages.
    """

    def __init__(self, pp: int, vpp: int, m: int, placement: str = LOOPED,
                 costs: Optional[Costs] = None):
        self.pp, self.vpp, self.m = pp, vpp, m
        self.placement = Placement(placement, pp, vpp)
        self.costs = costs or Costs()
        self.S = S = pp * vpp
        self.costs.check_stages(S)
        self.comm = float(self.costs.comm)
        self.rank_of = [0] * S
        self.chunk_of = [0] * S
        for s in range(S):
            self.rank_of[s], self.chunk_of[s] = self.placement.rank_chunk(s)
        #: stages held by each rank, in model order (= chunk order)
        self.stages_of = [[self.placement.stage(r, c) for c in range(vpp)] for r in range(pp)]
        self.cost = [[self.costs.of(kind, s) for s in range(S)] for kind in KIND_NAMES]
        self.N = 3 * S * m
        # per job: kind, stage, mb, rank, cost, dependency ids
        self.kind_of: List[int] = []
        self.stage_of: List[int] = []
        self.rank_of_job: List[int] = []
        self.cost_of: List[float] = []
        self.deps: List[Tuple[int, ...]] = []
        for kind in (F, I, W):
            for s in range(S):
                for mb in range(m):
                    self.kind_of.append(kind)
                    self.stage_of.append(s)
                    self.rank_of_job.append(self.rank_of[s])
                    self.cost_of.append(self.cost[kind][s])
                    if kind == F:
                        deps = (self.id(F, s - 1, mb),) if s > 0 else ()
                    elif kind == I:
                        deps = (self.id(F, s, mb),) + ((self.id(I, s + 1, mb),) if s + 1 < S else ())
                    else:
                        deps = (self.id(I, s, mb),)
                    self.deps.append(deps)

    def id(self, kind: int, stage: int, mb: int) -> int:
        return (kind * self.S + stage) * self.m + mb

    def job(self, jid: int) -> Job:
        kind, rest = divmod(jid, self.S * self.m)
        stage, mb = divmod(rest, self.m)
        return Job(KIND_NAMES[kind], self.chunk_of[stage], mb)

    def to_jobs(self, orders: Sequence[Sequence[int]]) -> List[List[Job]]:
        return [[self.job(j) for j in order] for order in orders]

    def from_schedule(self, schedule: Schedule) -> List[List[int]]:
        """Job ids of a compute-only, split-backward schedule with this placement."""
        index = {FORWARD: F, BACKWARD_B: I, BACKWARD_W: W}
        return [[self.id(index[j.kind], self.placement.stage(r, j.chunk), j.micro_batch)
                 for j in jobs if j.is_compute] for r, jobs in enumerate(schedule.ranks)]

    def simulate(self, orders: Sequence[Sequence[int]]) -> Optional[Tuple[float, float]]:
        """(makespan, max per-rank peak) of ``orders``, or None if they deadlock.

        Same timing as :func:`simulate.simulate`; the peak is the running level after each job
        in list order, never below the simulator's (which frees first on equal end times).
        """
        end = [-1.0] * self.N
        deps, cost, comm, rank_of = self.deps, self.cost_of, self.comm, self.rank_of_job
        kind_of = self.kind_of
        clock = [0.0] * self.pp
        head = [0] * self.pp
        level = [0.0] * self.pp
        peak = 0.0
        remaining = sum(len(o) for o in orders)
        while remaining:
            progressed = False
            for r, order in enumerate(orders):
                h, t, lv = head[r], clock[r], level[r]
                n = len(order)
                while h < n:
                    j = order[h]
                    ok = True
                    for d in deps[j]:
                        e = end[d]
                        if e < 0:
                            ok = False
                            break
                        if rank_of[d] != r:
                            e += comm
                        if e > t:
                            t = e
                    if not ok:
                        break
                    t += cost[j]
                    end[j] = t
                    lv += MEMORY_DELTA[kind_of[j]]
                    if lv > peak:
                        peak = lv
                    h += 1
                if h != head[r]:
                    remaining -= h - head[r]
                    head[r], clock[r], level[r] = h, t, lv
                    progressed = True
            if not progressed:
                return None
        return max(clock), peak


# --------------------------------------------------------------------------- greedy

@dataclass(frozen=True)
class GreedyPolicy:
    """How a free rank picks among its ready jobs.

    ``order``: kind preference, e.g. "IFW" (I, else F, else W) or "FIW".
    ``f_key`` / ``i_key``: which stage first among ready F's / I's: "deep" (highest stage, i.e.
    finish a micro-batch) or "shallow" (lowest stage, i.e. fill the pipeline) — micro-batches of
    one stage always run in order.
    ``hold``: lookahead; a rank about to start an F or W waits instead for an I that becomes
    ready within ``hold`` times that job's cost (0 = never wait).
    ``w_fill``: 1 = a W runs whenever nothing else is ready; 0 = a W runs only when it fits
    before the next F / I is ready or memory blocks every F (otherwise W's wait for the end).
    ``w_first_at``: run W's before F's once the level is within this many units of the cap.
    ``admit``: when a rank may start a new micro-batch (its first forward there): "reserve" only
    when all forwards of every started micro-batch still fit (never deadlocks); "soft" when
    ``vpp`` units are free (room for one micro-batch to pass); "free" whenever one unit is.
    ``cap_drop``: run under ``limit - cap_drop`` (but at least vpp).
    """

    order: str = "IFW"
    f_key: str = "deep"
    i_key: str = "deep"
    hold: float = 0.0
    w_fill: int = 1
    w_first_at: float = 0.0
    admit: str = "soft"
    cap_drop: float = 0.0

    def label(self) -> str:
        return (f"greedy[{self.order},F:{self.f_key},I:{self.i_key},hold={self.hold},"
                f"wfill={self.w_fill},wfirst={self.w_first_at},admit={self.admit},"
                f"cap-{self.cap_drop}]")


def greedy_orders(ctx: SearchContext, limit: float, policy: GreedyPolicy) -> Optional[List[List[int]]]:
    """Per-rank job-id orders built by list scheduling under ``policy``; None on a deadlock."""
    pp, vpp, m, S = ctx.pp, ctx.vpp, ctx.m, ctx.S
    cap = max(float(vpp), limit - policy.cap_drop) + EPS
    comm, cost, rank_of = ctx.comm, ctx.cost, ctx.rank_of
    endF = [[-1.0] * m for _ in range(S)]
    endI = [[-1.0] * m for _ in range(S)]
    nf = [0] * S                      # next micro-batch of each stage's F / I
    ni = [0] * S
    clock = [0.0] * pp
    level = [0.0] * pp
    reserve = [0] * pp                # forwards still owed to started micro-batches
    wq: List[List[Tuple[int, int]]] = [[] for _ in range(pp)]   # pending W (stage, mb), FIFO
    whead = [0] * pp
    orders: List[List[int]] = [[] for _ in range(pp)]
    remaining = 3 * S * m
    first_stage = [stages[0] for stages in ctx.stages_of]
    f_deep = policy.f_key == "deep"
    i_deep = policy.i_key == "deep"
    prefer_f = policy.order.index("F") < policy.order.index("I")
    w_before_f = policy.order.index("W") < policy.order.index("F")

    def f_ready(s: int) -> float:
        mb = nf[s]
        if mb >= m:
            return INF
        if s == 0:
            return 0.0
        e = endF[s - 1][mb]
        if e < 0:
            return INF
        return e + comm if rank_of[s - 1] != rank_of[s] else e

    def i_ready(s: int) -> float:
        mb = ni[s]
        if mb >= m:
            return INF
        e = endF[s][mb]
        if e < 0:
            return INF
        if s + 1 < S:
            e2 = endI[s + 1][mb]
            if e2 < 0:
                return INF
            if rank_of[s + 1] != rank_of[s]:
                e2 += comm
            if e2 > e:
                e = e2
        return e

    def f_allowed(r: int, s: int) -> bool:
        if level[r] + 1.0 > cap:
            return False
        if s == first_stage[r]:
            if policy.admit == "reserve":
                return level[r] + reserve[r] + vpp <= cap
            if policy.admit == "soft":
                return level[r] + vpp <= cap
        return True

    def candidates(r: int):
        """(best F stage, its ready time), (best I stage, ready), over the rank's stages."""
        fb = ib = None
        ft = it = INF
        for s in ctx.stages_of[r]:
            t = i_ready(s)
            if t < INF and (ib is None or t < it - EPS or (abs(t - it) <= EPS and (s > ib) == i_deep)):
                ib, it = s, t
            t = f_ready(s)
            if t < INF and f_allowed(r, s) and (
                    fb is None or t < ft - EPS or (abs(t - ft) <= EPS and (s > fb) == f_deep)):
                fb, ft = s, t
        return fb, ft, ib, it

    def commit(r: int, kind: int, s: int, mb: int, start: float) -> None:
        nonlocal remaining
        end = start + cost[kind][s]
        clock[r] = end
        level[r] += MEMORY_DELTA[kind]
        orders[r].append(ctx.id(kind, s, mb))
        remaining -= 1
        if kind == F:
            endF[s][mb] = end
            nf[s] += 1
            if policy.admit == "reserve":
                reserve[r] += (vpp - 1) if s == first_stage[r] else -1
        elif kind == I:
            endI[s][mb] = end
            ni[s] += 1
            wq[r].append((s, mb))

    # cached earliest start per rank; recomputed when the rank or a neighbour stage changes
    while remaining:
        best_r, best = -1, None
        best_t = INF
        for r in range(pp):
            fb, ft, ib, it = candidates(r)
            has_w = whead[r] < len(wq[r])
            t = min(ft, it)
            if has_w:
                t = clock[r]
            t = max(t, clock[r])
            if t < best_t - EPS:
                best_r, best_t, best = r, t, (fb, ft, ib, it, has_w)
        if best_r < 0:
            return None
        r, t = best_r, best_t
        fb, ft, ib, it, has_w = best
        i_now = ib is not None and it <= t + EPS
        f_now = fb is not None and ft <= t + EPS
        choice = None
        if i_now and f_now:
            choice = F if prefer_f else I
        elif i_now:
            choice = I
        elif f_now:
            choice = F
        if choice == F and has_w and (w_before_f or level[r] + 1.0 > cap - policy.w_first_at):
            choice = W
        if choice is None:
            # only W's are ready now
            nxt = min(ft, it)
            if policy.w_fill or nxt == INF or nxt >= t + cost[W][wq[r][whead[r]][0]] - EPS \
                    or (fb is None and ft == INF and level[r] + 1.0 > cap):
                choice = W
            else:
                clock[r] = nxt
                continue
        if policy.hold and choice != I and ib is not None and t < it < INF:
            c = cost[choice][fb if choice == F else wq[r][whead[r]][0]]
            if it < t + c - EPS and it - t <= policy.hold * c:
                clock[r] = it
                continue
        if choice == I:
            commit(r, I, ib, ni[ib], t)
        elif choice == F:
            commit(r, F, fb, nf[fb], t)
        else:
            s, mb = wq[r][whead[r]]
            whead[r] += 1
            commit(r, W, s, mb, t)
    return orders


def default_policies() -> List[GreedyPolicy]:
    """The policy variants the search tries (order fixed, so results are reproducible)."""
    base = [
        GreedyPolicy(),
        GreedyPolicy(hold=1.0),
        GreedyPolicy(w_fill=0),
        GreedyPolicy(w_fill=0, hold=1.0),
        GreedyPolicy(f_key="shallow"),
        GreedyPolicy(f_key="shallow", hold=1.0),
        GreedyPolicy(order="FIW"),
        GreedyPolicy(order="FIW", f_key="shallow"),
        GreedyPolicy(i_key="shallow"),
        GreedyPolicy(w_first_at=1.0),
        GreedyPolicy(w_first_at=1.0, hold=1.0, w_fill=0),
        GreedyPolicy(hold=0.5, f_key="shallow", w_fill=0),
    ]
    variants = list(base)
    for drop in (1.0, 2.0):
        variants += [replace(p, cap_drop=drop) for p in base[:6]]
    variants += [replace(p, admit="free") for p in base[:4]]
    variants += [replace(p, admit="reserve") for p in base[:4]]
    return variants


# --------------------------------------------------------------------------- local search

def improve(ctx: SearchContext, orders: List[List[int]], limit: float, makespan: float,
            max_evals: Optional[int] = None) -> Tuple[List[List[int]], float]:
    """Move W's into idle gaps / behind the jobs they delay while the makespan drops."""
    if max_evals is None:
        max_evals = max(16, min(400, 300000 // max(1, ctx.N)))
    evals = 0
    kind_of = ctx.kind_of
    improved = True
    while improved and evals < max_evals:
        improved = False
        for move in _candidate_moves(ctx, orders):
            if evals >= max_evals:
                break
            r, src, dst = move
            trial = [list(o) for o in orders]
            job = trial[r].pop(src)
            trial[r].insert(dst if dst < src else dst - 1, job)
            if not _local_order_ok(ctx, trial[r]):
                continue
            evals += 1
            result = ctx.simulate(trial)
            if result is None:
                continue
            span, peak = result
            if span < makespan - EPS and peak <= limit + EPS:
                orders, makespan, improved = trial, span, True
                break
    return orders, makespan


def _local_order_ok(ctx: SearchContext, order: Sequence[int]) -> bool:
    seen = set()
    for j in order:
        for d in ctx.deps[j]:
            if ctx.rank_of_job[d] == ctx.rank_of_job[j] and d not in seen and \
                    ctx.kind_of[j] != F:
                return False
        seen.add(j)
    return True


def _candidate_moves(ctx: SearchContext, orders: List[List[int]]):
    """(rank, from, to) moves: a later W into an idle gap; a W behind the job right after it."""
    starts = _start_times(ctx, orders)
    moves = []
    for r, order in enumerate(orders):
        prev_end = 0.0
        for k, j in enumerate(order):
            st = starts[j]
            if st > prev_end + EPS:
                # idle gap before position k: bring the first later W whose I ran before k
                done = set(order[:k])
                for k2 in range(k + 1, len(order)):
                    j2 = order[k2]
                    if ctx.kind_of[j2] == W and ctx.deps[j2][0] in done:
                        moves.append((st - prev_end, (r, k2, k)))
                        break
            if ctx.kind_of[j] == W and k + 1 < len(order):
                nxt = order[k + 1]
                if ctx.kind_of[nxt] != W and abs(starts[nxt] - (st + ctx.cost_of[j])) <= EPS:
                    moves.append((ctx.cost_of[j], (r, k, k + 2)))
            prev_end = st + ctx.cost_of[j]
    moves.sort(key=lambda item: -item[0])
    return [move for _, move in moves]


def _start_times(ctx: SearchContext, orders) -> Dict[int, float]:
    end: Dict[int, float] = {}
    start: Dict[int, float] = {}
    clock = [0.0] * ctx.pp
    head = [0] * ctx.pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r, order in enumerate(orders):
            while head[r] < len(order):
                j = order[head[r]]
                t = clock[r]
                if any(d not in end for d in ctx.deps[j]):
                    break
                for d in ctx.deps[j]:
                    t = max(t, end[d] + (ctx.comm if ctx.rank_of_job[d] != r else 0.0))
                start[j] = t
                end[j] = clock[r] = t + ctx.cost_of[j]
                head[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            break
    return start


# --------------------------------------------------------------------------- the search

@dataclass
class AutoResult:
    """What :func:`auto_search` found."""

    schedule: Schedule
    makespan: float
    peak: float
    memory_limit: float
    placement: str
    source: str                   # "fixed:<name>", "greedy[...]" or "greedy[...]+local"
    baseline: Optional[str]       # best fixed schedule that fits the limit
    baseline_makespan: float
    search_seconds: float
    tried: Dict[str, float] = field(default_factory=dict, repr=False)


def default_memory_limit(pp: int, vpp: int, m: int) -> float:
    """1F1B's peak at full-stage size: ``min(pp, m)`` micro-batches of ``vpp`` virtual stages."""
    return float(min(pp, m) * vpp)


def minimum_memory(pp: int, vpp: int, m: int) -> float:
    """The least peak (units per rank) any valid schedule reaches: ``vpp``."""
    return float(vpp)


def fixed_candidates(pp: int, vpp: int, m: int, placement: str, costs: Costs):
    """(name, schedule, makespan, peak) of every registered non-auto schedule with ``placement``."""
    out = []
    for name in schedule_names():
        spec = get_spec(name)
        if name in AUTO_NAMES or spec.placement != placement:
            continue
        try:
            schedule = build_schedule(name, pp, vpp, m, split_backward=True)
        except ValueError:
            continue
        try:
            result = simulate(schedule, costs)
        except ValueError:
            continue
        out.append((name, schedule, result.makespan, result.max_peak_memory))
    return out


def auto_search(pp: int, vpp: int = 1, m: int = 1, costs: Optional[Costs] = None,
                memory_limit: Optional[float] = None,
                placements: Sequence[str] = (LOOPED,), local_search: bool = True) -> AutoResult:
    """Fastest schedule found whose simulated peak per rank is <= ``memory_limit``."""
    check_positive_int("pp", pp)
    check_positive_int("vpp", vpp)
    check_positive_int("m", m)
    costs = costs if costs is not None else Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, got {type(costs).__name__}")
    least = minimum_memory(pp, vpp, m)
    if memory_limit is None:
        memory_limit = default_memory_limit(pp, vpp, m)
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)):
        raise TypeError(f"memory_limit must be a number, got {memory_limit!r}")
    if memory_limit < least - EPS:
        raise ValueError(f"memory_limit must be >= {least:g} (vpp={vpp} units: every valid schedule "
                         f"holds all vpp forwards of a micro-batch on each rank), got {memory_limit:g}")
    began = time.perf_counter()
    best = None  # (makespan, peak, placement, source, ranks)
    baseline, baseline_span = None, INF
    tried: Dict[str, float] = {}
    for placement in placements:
        ctx = SearchContext(pp, vpp, m, placement, costs)
        for name, schedule, span, peak in fixed_candidates(pp, vpp, m, placement, costs):
            tried[f"fixed:{name}"] = span
            if peak <= memory_limit + EPS:
                if span < baseline_span - EPS:
                    baseline, baseline_span = name, span
                if best is None or span < best[0] - EPS:
                    best = (span, peak, placement, f"fixed:{name}", schedule.ranks)
        greedy_best = None
        for policy in default_policies():
            orders = greedy_orders(ctx, memory_limit, policy)
            if orders is None:
                continue
            result = ctx.simulate(orders)
            if result is None:  # pragma: no cover - greedy orders are executions
                continue
            span, peak = result
            tried[policy.label() + f"@{placement}"] = span
            if peak <= memory_limit + EPS and (greedy_best is None or span < greedy_best[0] - EPS):
                greedy_best = (span, peak, policy.label(), orders)
        if greedy_best is not None:
            span, peak, label, orders = greedy_best
            if local_search:
                orders, new_span = improve(ctx, orders, memory_limit, span)
                if new_span < span - EPS:
                    span, label = new_span, label + "+local"
            jobs = ctx.to_jobs(orders)
            if best is None or span < best[0] - EPS:
                best = (span, peak, placement, label, jobs)
    if best is None:  # pragma: no cover - reserve policies always succeed for limit >= vpp
        raise ValueError(f"memory_limit {memory_limit:g} admits no schedule the search found "
                         f"for pp={pp}, vpp={vpp}, m={m}")
    span, _, placement, source, ranks = best
    schedule = Schedule(name="auto" if placement == LOOPED else "autoV", pp=pp, vpp=vpp, m=m,
                        placement=Placement(placement, pp, vpp), ranks=[list(j) for j in ranks],
                        split_backward=True,
                        options={"costs": costs, "memory_limit": memory_limit, "source": source})
    final = simulate(schedule, costs)  # the reference simulator has the last word
    return AutoResult(schedule, final.makespan, final.max_peak_memory, float(memory_limit),
                      placement, source, baseline, baseline_span, time.perf_counter() - began, tried)


@register_schedule("auto", placement=LOOPED, splits_backward=True)
def auto(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
         memory_limit: Optional[float] = None) -> List[List[Job]]:
    """Searched zero-bubble schedule (looped placement): fastest simulated under memory_limit."""
    return auto_search(pp, vpp, m, costs, memory_limit, (LOOPED,)).schedule.ranks


@register_schedule("autoV", aliases=("auto-v",), placement=V_SHAPE, splits_backward=True)
def auto_v(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
           memory_limit: Optional[float] = None) -> List[List[Job]]:
    """Searched zero-bubble schedule (V placement): fastest simulated under memory_limit."""
    return auto_search(pp, vpp, m, costs, memory_limit, (V_SHAPE,)).schedule.ranks

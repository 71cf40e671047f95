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

``memory_limit`` (peak units per rank) defaults to 1F1B's peak at full-stage size:
``min(pp, m) * vpp`` — rank 0 of 1F1B holds ``min(pp, m)`` micro-batches of a whole stage, and a
whole stage is ``vpp`` virtual stages.  No valid schedule peaks below ``vpp`` (when the last stage
starts the I of a micro-batch, every rank still holds all ``vpp`` forwards of it), so a limit
below ``vpp`` raises ``ValueError`` stating that minimum.

To let the search also choose the placement, call :func:`auto_search` with
``placements=(LOOPED, V_SHAPE)``; its result records the placement it chose.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, Job, Schedule
from .placement import LOOPED, V_SHAPE, Placement, check_positive_int
from .registry import build_schedule, get_spec, register_schedule, schedule_names
from .simulate import Costs, lower_bound, simulate

F, I, W = 0, 1, 2
KIND_NAMES = (FORWARD, BACKWARD_B, BACKWARD_W)
EPS = 1e-9
INF = float("inf")
AUTO_NAMES = ("auto", "autoV")
#: how many of the best distinct candidates the local search starts from
LOCAL_SEARCH_SEEDS = 3


# --------------------------------------------------------------------------- search context

class SearchContext:
    """Job numbering, costs and a fast simulator for one (pp, vpp, m, placement, costs) and one
    choice of the stages whose backward is split (``split_stages``, default: all).

    Job id of (kind, stage, mb) is ``(kind * S + stage) * m + mb`` with S = pp*vpp stages.
    An unsplit stage's full backward B is searched as its I job with B's cost and memory
    release, followed by a W job of cost 0 that changes nothing; :meth:`to_jobs` turns that
    I into B and drops the W (which only waits on its I, on the same rank, so removing it
    changes no start time).
    """

    def __init__(self, pp: int, vpp: int, m: int, placement: str = LOOPED,
                 costs: Optional[Costs] = None, split_stages: Optional[Sequence[int]] = None):
        self.pp, self.vpp, self.m = pp, vpp, m
        self.placement = Placement(placement, pp, vpp)
        self.costs = costs or Costs()
        self.S = S = pp * vpp
        self.costs.check_stages(S)
        self.split_stages = frozenset(range(S) if split_stages is None else split_stages)
        self.comm = float(self.costs.comm)
        split = [s in self.split_stages for s in range(S)]
        #: live-unit change at the end of an F, I, W job per stage (the simulator's model;
        #: an unsplit stage's "I" is its B)
        self.memory_delta = [
            [self.costs.memory_delta(FORWARD)] * S,
            [self.costs.memory_delta(BACKWARD_B if split[s] else BACKWARD) for s in range(S)],
            [self.costs.memory_delta(BACKWARD_W) if split[s] else 0.0 for s in range(S)]]
        self.rank_of = [0] * S
        self.chunk_of = [0] * S
        for s in range(S):
            self.rank_of[s], self.chunk_of[s] = self.placement.rank_chunk(s)
        #: stages held by each rank, in model order (= chunk order)
        self.stages_of = [[self.placement.stage(r, c) for c in range(vpp)] for r in range(pp)]
        self.cost = [[self.costs.of(FORWARD, s) for s in range(S)],
                     [self.costs.of(BACKWARD_B if split[s] else BACKWARD, s) for s in range(S)],
                     [self.costs.of(BACKWARD_W, s) if split[s] else 0.0 for s in range(S)]]
        #: the costs the search sees (an unsplit stage: I = tB, W = 0), for the bounds
        self.effective_costs = replace(self.costs, backward=None,
                                       backward_b=tuple(self.cost[I]),
                                       backward_w=tuple(self.cost[W]))
        self.N = 3 * S * m
        # per job: kind, stage, mb, rank, cost, dependency ids
        self.kind_of: List[int] = []
        self.stage_of: List[int] = []
        self.rank_of_job: List[int] = []
        self.cost_of: List[float] = []
        self.deps: List[Tuple[int, ...]] = []
        self.delta_of: List[float] = []
        for kind in (F, I, W):
            for s in range(S):
                for mb in range(m):
                    self.kind_of.append(kind)
                    self.stage_of.append(s)
                    self.rank_of_job.append(self.rank_of[s])
                    self.cost_of.append(self.cost[kind][s])
                    self.delta_of.append(self.memory_delta[kind][s])
                    if kind == F:
                        deps = (self.id(F, s - 1, mb),) if s > 0 else ()
                    elif kind == I:
                        deps = (self.id(F, s, mb),) + ((self.id(I, s + 1, mb),) if s + 1 < S else ())
                    else:
                        deps = (self.id(I, s, mb),)
                    self.deps.append(deps)

    def id(self, kind: int, stage: int, mb: int) -> int:
        return (kind * self.S + stage) * self.m + mb

    def job(self, jid: int) -> Optional[Job]:
        """The job of id ``jid`` (None for the W stand-in of an unsplit stage)."""
        kind, rest = divmod(jid, self.S * self.m)
        stage, mb = divmod(rest, self.m)
        if stage not in self.split_stages and kind != F:
            if kind == W:
                return None
            return Job(BACKWARD, self.chunk_of[stage], mb)
        return Job(KIND_NAMES[kind], self.chunk_of[stage], mb)

    def to_jobs(self, orders: Sequence[Sequence[int]]) -> List[List[Job]]:
        return [[job for job in map(self.job, order) if job is not None] for order in orders]

    def from_schedule(self, schedule: Schedule) -> List[List[int]]:
        """Job ids of a compute-only schedule with this placement whose split stages are
        ``split_stages`` (a B becomes its I id followed by its W id)."""
        index = {FORWARD: F, BACKWARD_B: I, BACKWARD_W: W}
        out = []
        for r, jobs in enumerate(schedule.ranks):
            row = []
            for j in jobs:
                if not j.is_compute:
                    continue
                stage = self.placement.stage(r, j.chunk)
                if j.kind == BACKWARD:
                    row += [self.id(I, stage, j.micro_batch), self.id(W, stage, j.micro_batch)]
                else:
                    row.append(self.id(index[j.kind], stage, j.micro_batch))
            out.append(row)
        return out

    def simulate(self, orders: Sequence[Sequence[int]], starts: Optional[List[float]] = None
                 ) -> Optional[Tuple[float, float, float]]:
        """(makespan, max per-rank peak, sum of rank finish times) of ``orders``; None if they
        deadlock.  ``starts`` (a list of N floats), when given, receives each job's start.

        Same timing as :func:`simulate.simulate`; the peak is the running level after each job
        in list order, never below the simulator's (which frees first on equal end times).
        """
        end = [-1.0] * self.N
        deps, cost, comm, rank_of = self.deps, self.cost_of, self.comm, self.rank_of_job
        delta = self.delta_of
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
                    st = t
                    ok = True
                    for d in deps[j]:
                        e = end[d]
                        if e < 0:
                            ok = False
                            break
                        if rank_of[d] != r:
                            e += comm
                        if e > st:
                            st = e
                    if not ok:
                        break
                    if starts is not None:
                        starts[j] = st
                    t = st + cost[j]
                    end[j] = t
                    lv += delta[j]
                    if lv > peak:
                        peak = lv
                    h += 1
                if h != head[r]:
                    remaining -= h - head[r]
                    head[r], clock[r], level[r] = h, t, lv
                    progressed = True
            if not progressed:
                return None
        return max(clock), peak, sum(clock)


# --------------------------------------------------------------------------- greedy

@dataclass(frozen=True)
class GreedyPolicy:
    """How a free rank picks among its ready jobs.

    ``warmup``: None = free choice by ``order``; a tuple (one count per rank) = 1F1B discipline:
    that many F's first, then F and I alternate (the expected one is waited for, W's fill the
    wait; with ``strict=False`` the other kind runs if it is ready before the expected one).
    ``order``: kind preference of the free choice, "IFW" (I, else F, else W) or "FIW".
    ``f_key`` / ``i_key``: which stage first among ready F's / I's: "deep" (highest stage, i.e.
    finish a micro-batch) or "shallow" (lowest stage, i.e. fill the pipeline) — micro-batches of
    one stage always run in order.
    ``hold``: lookahead; a rank about to start an F or W waits instead for an I that becomes
    ready within ``hold`` times that job's cost (0 = never wait).
    ``w_fill``: 1 = a W runs whenever the wanted job is not ready; 0 = only when it ends before
    the wanted job is ready (otherwise W's wait for the end, or for memory pressure).
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
    warmup: Optional[Tuple[int, ...]] = None
    strict: bool = True

    def label(self) -> str:
        head = "free" if self.warmup is None else \
            f"1f1b(warmup={','.join(map(str, self.warmup))},strict={int(self.strict)})"
        return (f"greedy[{head},{self.order},F:{self.f_key},I:{self.i_key},hold={self.hold},"
                f"wfill={self.w_fill},wfirst={self.w_first_at},admit={self.admit},"
                f"cap-{self.cap_drop}]")


def greedy_orders(ctx: SearchContext, limit: float, policy: GreedyPolicy) -> Optional[List[List[int]]]:
    """Per-rank job-id orders built by list scheduling under ``policy``; None on a deadlock.

    Each round every rank states its next action (job and start time) under the policy; the
    earliest one is committed.  Nothing committed later can start before it, so the orders are
    an actual execution: valid and deadlock-free by construction.
    """
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
    fdone = [0] * pp
    idone = [0] * pp
    last = [I] * pp                   # last of F / I run (alternation)
    per_rank = vpp * m
    wq: List[List[Tuple[int, int]]] = [[] for _ in range(pp)]   # pending W (stage, mb), FIFO
    whead = [0] * pp
    orders: List[List[int]] = [[] for _ in range(pp)]
    remaining = 3 * S * m
    first_stage = [stages[0] for stages in ctx.stages_of]
    f_deep = policy.f_key == "deep"
    i_deep = policy.i_key == "deep"
    prefer_f = policy.order.index("F") < policy.order.index("I")
    w_before_f = policy.order.index("W") < policy.order.index("F")
    warmup = policy.warmup

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

    def pick(r: int, kind: int):
        """(stage, ready time) of the best F / I of rank r (F: admissible only)."""
        best_s, best_t = -1, INF
        deep = f_deep if kind == F else i_deep
        for s in ctx.stages_of[r]:
            if kind == F:
                t = f_ready(s)
                if t == INF or not f_allowed(r, s):
                    continue
            else:
                t = i_ready(s)
                if t == INF:
                    continue
            if best_s < 0 or t < best_t - EPS or (abs(t - best_t) <= EPS and (s > best_s) == deep):
                best_s, best_t = s, t
        return best_s, best_t

    def decide(r: int):
        """(start time, kind, stage) of rank r's next job, or None if it must wait for others."""
        t0 = clock[r]
        fs, ft = pick(r, F)
        is_, it = pick(r, I)
        has_w = whead[r] < len(wq[r])
        w_cost = cost[W][wq[r][whead[r]][0]] if has_w else 0.0
        f_now, i_now = ft <= t0 + EPS, it <= t0 + EPS
        memory_tight = has_w and level[r] + 1.0 > cap - policy.w_first_at
        if warmup is not None:
            if fdone[r] >= per_rank:
                want = I
            elif idone[r] >= per_rank or fdone[r] < warmup[r]:
                want = F
            else:
                want = F if last[r] == I else I
            if want == F and fs < 0 and fdone[r] < per_rank and level[r] + 1.0 > cap:
                want = I  # memory blocks the F: run an I (or W) instead
            wt = ft if want == F else it
            ws = fs if want == F else is_
            if wt <= t0 + EPS:
                if want == F and memory_tight:
                    return t0, W, -1
                return t0, want, ws
            other_t, other_s = (it, is_) if want == F else (ft, fs)
            if has_w and (policy.w_fill or wt == INF or wt >= t0 + w_cost - EPS):
                if policy.strict or other_t > t0 + EPS:
                    return t0, W, -1
            if not policy.strict and other_t < wt:
                return max(t0, other_t), (I if want == F else F), other_s
            if wt < INF:
                return wt, want, ws
            if has_w:
                return t0, W, -1
            return None
        # free choice
        if i_now and f_now:
            choice = F if prefer_f else I
        elif i_now:
            choice = I
        elif f_now:
            choice = F
        else:
            choice = None
        if choice == F and (w_before_f and has_w or memory_tight):
            choice = W
        if choice is None:
            nxt = min(ft, it)
            if has_w and (policy.w_fill or nxt == INF or nxt >= t0 + w_cost - EPS
                          or (fs < 0 and level[r] + 1.0 > cap)):
                return t0, W, -1
            if nxt == INF:
                return None
            kind = I if it <= ft and not (prefer_f and ft <= it + EPS) else F
            return nxt, kind, (is_ if kind == I else fs)
        if policy.hold and choice != I and is_ >= 0 and t0 < it:
            c = cost[F][fs] if choice == F else w_cost
            if it < t0 + c - EPS and it - t0 <= policy.hold * c:
                return it, I, is_
        return t0, choice, (is_ if choice == I else fs if choice == F else -1)

    while remaining:
        best_r, best = -1, None
        for r in range(pp):
            action = decide(r)
            if action is not None and (best is None or action[0] < best[0] - EPS):
                best_r, best = r, action
        if best is None:
            return None
        r = best_r
        start, kind, s = best
        if kind == W:
            s, mb = wq[r][whead[r]]
            whead[r] += 1
        elif kind == F:
            mb = nf[s]
            nf[s] += 1
            fdone[r] += 1
            last[r] = F
        else:
            mb = ni[s]
            ni[s] += 1
            idone[r] += 1
            last[r] = I
        end = start + cost[kind][s]
        clock[r] = end
        level[r] += ctx.memory_delta[kind][s]
        orders[r].append(ctx.id(kind, s, mb))
        remaining -= 1
        if kind == F:
            endF[s][mb] = end
            if policy.admit == "reserve":
                reserve[r] += (vpp - 1) if s == first_stage[r] else -1
        elif kind == I:
            endI[s][mb] = end
            wq[r].append((s, mb))
    return orders


def warmup_vectors(pp: int, vpp: int, m: int) -> List[Tuple[int, ...]]:
    """1F1B-discipline warm-up counts tried: ``a + b*(pp-1-r)`` forwards on rank r."""
    fill = (vpp - 1) * min(m, pp)
    total = vpp * m
    out = []
    for b in (1, 2):
        for a in (fill, fill + 1, fill + 2, fill + pp // 2):
            vec = tuple(min(total, a + b * (pp - 1 - r)) for r in range(pp))
            if vec not in out:
                out.append(vec)
    return out


def default_policies(pp: int = 1, vpp: int = 1, m: int = 1) -> List[GreedyPolicy]:
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
    variants += [replace(p, cap_drop=1.0) for p in base[:4]]
    variants += [replace(p, admit="free") for p in base[:2]]
    variants += [replace(p, admit="reserve") for p in base[:2]]
    for vec in warmup_vectors(pp, vpp, m):
        for w_fill in (0,):
            for strict in (True, False):
                variants.append(GreedyPolicy(warmup=vec, w_fill=w_fill, strict=strict,
                                             f_key="shallow", admit="free"))
    return variants


# --------------------------------------------------------------------------- bound

def memory_lower_bound(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
                       memory_limit: Optional[float] = None, placement: str = LOOPED) -> float:
    """A lower bound on the makespan of any schedule whose per-rank peak is <= ``memory_limit``.

    :func:`simulate.lower_bound` (rank work plus the forward path to it), tightened per rank by
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
    ctx_place = Placement(placement, pp, vpp)
    S = pp * vpp
    if memory_limit is None:
        memory_limit = default_memory_limit(pp, vpp, m)
    tf = [costs.of(FORWARD, s) for s in range(S)]
    ti = [costs.of(BACKWARD_B, s) for s in range(S)]
    tw = [costs.of(BACKWARD_W, s) for s in range(S)]
    c = float(costs.comm)
    rank = [ctx_place.rank_of(s) for s in range(S)]
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
    held = int(memory_limit + EPS)
    best = lower_bound(pp, vpp, m, costs)
    for r in range(pp):
        stages = [ctx_place.stage(r, ch) for ch in range(vpp)]
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


# --------------------------------------------------------------------------- layout search

def layout_orders(ctx: SearchContext, warmup: Sequence[int], deferred: Sequence[int],
                  group_size: int) -> List[List[int]]:
    """Job-id orders of the ZB-H1 / InterleavedZB layout (looped placement) with per-rank
    warm-up forwards ``warmup[r]`` and ``deferred[r]`` W's kept back for the cool-down."""
    from .classic import grouped_order, micro_batch_groups
    from .zero_bubble import zb_rank_jobs

    groups = micro_batch_groups(ctx.m, group_size)
    forwards = grouped_order(ctx.vpp, groups)
    backwards = grouped_order(ctx.vpp, groups, reverse_chunks=True)
    index = {FORWARD: F, BACKWARD_B: I, BACKWARD_W: W}
    out = []
    for r in range(ctx.pp):
        jobs = zb_rank_jobs(forwards, backwards, warmup[r], deferred[r])
        out.append([ctx.id(index[j.kind], ctx.stages_of[r][j.chunk], j.micro_batch) for j in jobs])
    return out


def layout_search(ctx: SearchContext, limit: float, max_evals: int = 400
                  ) -> Optional[Tuple[float, float, str, List[List[int]]]]:
    """Coordinate descent over the per-rank warm-up counts and W deferrals of the ZB-H1 /
    InterleavedZB layout (the zero-bubble paper's knobs), seeded from those schedules.

    Moves: one rank's warm-up +-1, one rank's deferral +-1, and +1 warm-up on every rank up to
    ``r`` (more forwards on the early ranks hide the p2p latency of the forward chain).  A move
    is kept when (makespan, sum of finish times) drops and the peak fits ``limit``.  Returns
    (makespan, sum of finish times, label, orders) of the best layout found, or None when no
    layout fits.  Only for the looped placement.
    """
    if ctx.placement.kind != LOOPED:
        return None
    from .classic import interleaved_warmup

    pp, vpp, m = ctx.pp, ctx.vpp, ctx.m
    total = vpp * m
    best = None  # (span, sum, warmup, deferred, group, orders)
    evals = 0
    cache: Dict[Tuple, Optional[Tuple[float, float, float]]] = {}

    def evaluate(warmup, deferred, group):
        nonlocal evals
        key = (tuple(warmup), tuple(deferred), group)
        if key not in cache:
            evals += 1
            orders = layout_orders(ctx, warmup, deferred, group)
            result = ctx.simulate(orders)
            cache[key] = None if result is None or result[1] > limit + EPS else \
                (result[0], result[2], orders)
        return cache[key]

    groups = sorted({pp, m} if m < 2 * pp else {pp})
    for group in groups:
        for per_hop in (1, 2):
            warmup = [min(total, w) for w in interleaved_warmup(pp, vpp, m, per_hop=per_hop,
                                                                  group_size=group)]
            for deferred in ([r for r in range(pp)], [0] * pp):
                found = evaluate(warmup, deferred, group)
                if found and (best is None or (found[0], found[1]) < (best[0], best[1])):
                    best = (found[0], found[1], list(warmup), list(deferred), group, found[2])
    if best is None:
        return None
    improved = True
    while improved and evals < max_evals:
        improved = False
        span, total_end, warmup, deferred, group, _ = best
        moves = []
        for r in range(pp):
            for delta in (1, -1):
                w = list(warmup)
                w[r] += delta
                moves.append((w, deferred))
                d = list(deferred)
                d[r] += delta
                moves.append((warmup, d))
            w = [x + 1 if q <= r else x for q, x in enumerate(warmup)]
            moves.append((w, deferred))
        for w, d in moves:
            if evals >= max_evals:
                break
            if any(x < 0 or x > total for x in w) or any(x < 0 or x > total for x in d):
                continue
            found = evaluate(w, d, group)
            if found and (found[0] < span - EPS or
                          (found[0] <= span + EPS and found[1] < total_end - EPS)):
                best = (found[0], found[1], list(w), list(d), group, found[2])
                improved = True
                break
    span, total_end, warmup, deferred, group, orders = best
    label = (f"layout[warmup={','.join(map(str, warmup))},defer={','.join(map(str, deferred))},"
             f"group={group}]")
    return span, total_end, label, orders


# --------------------------------------------------------------------------- local search

def improve(ctx: SearchContext, orders: List[List[int]], limit: float,
            max_evals: Optional[int] = None, target: float = 0.0) -> Tuple[List[List[int]], float]:
    """First-improvement local search on the per-rank orders.

    Moves: a job that waited for its rank although its inputs were there swaps with the job
    before it (this defers a W, or runs an I before an F); a later W moves into an idle gap of
    its rank.  A move is kept when (makespan, sum of rank finish times) drops and the peak
    still fits ``limit``.  At most ``max_evals`` simulations (default: scaled to the size).
    """
    if max_evals is None:
        max_evals = max(16, min(600, 150000 // max(1, ctx.N)))
    starts = [0.0] * ctx.N
    result = ctx.simulate(orders, starts)
    if result is None:
        return orders, INF
    best = (result[0], result[2])
    evals = 0
    while evals < max_evals and best[0] > target + EPS:
        accepted = False
        for r, src, dst in _candidate_moves(ctx, orders, starts):
            if evals >= max_evals:
                break
            trial = list(orders[r])
            job = trial.pop(src)
            trial.insert(dst, job)
            candidate = orders[:r] + [trial] + orders[r + 1:]
            evals += 1
            new_starts = [0.0] * ctx.N
            result = ctx.simulate(candidate, new_starts)
            if result is None or result[1] > limit + EPS:
                continue
            key = (result[0], result[2])
            if key[0] < best[0] - EPS or (key[0] <= best[0] + EPS and key[1] < best[1] - EPS):
                orders, starts, best, accepted = candidate, new_starts, key, True
                break
        if not accepted:
            break
    return orders, best[0]


def _candidate_moves(ctx: SearchContext, orders: List[List[int]], starts: List[float]):
    """(rank, from, to) moves, most promising (largest wait or gap) first."""
    deps, kind_of, cost, comm, rank_of = ctx.deps, ctx.kind_of, ctx.cost_of, ctx.comm, ctx.rank_of_job
    moves = []
    for r, order in enumerate(orders):
        prev_end = 0.0
        position = {j: k for k, j in enumerate(order)}
        for k, j in enumerate(order):
            st = starts[j]
            ready = 0.0
            for d in deps[j]:
                e = starts[d] + cost[d] + (comm if rank_of[d] != r else 0.0)
                if e > ready:
                    ready = e
            if k > 0 and ready < st - EPS:
                before = order[k - 1]
                if before not in deps[j]:
                    moves.append((st - ready, (r, k, k - 1)))
            if st > prev_end + EPS:
                for k2 in range(k + 1, len(order)):
                    j2 = order[k2]
                    if kind_of[j2] == W and position[deps[j2][0]] < k:
                        moves.append((st - prev_end, (r, k2, k)))
                        break
            prev_end = st + cost[j]
    moves.sort(key=lambda item: -item[0])
    return [move for _, move in moves]


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
    bound: float = 0.0            # memory_lower_bound of the chosen placement
    tried: Dict[str, float] = field(default_factory=dict, repr=False)


def default_memory_limit(pp: int, vpp: int, m: int) -> float:
    """1F1B's peak at full-stage size: ``min(pp, m)`` micro-batches of ``vpp`` virtual stages."""
    return float(min(pp, m) * vpp)


def minimum_memory(pp: int, vpp: int, m: int, w_memory: float = 0.5) -> float:
    """The least peak (units per rank) any valid schedule reaches: ``vpp`` (when the last stage
    runs a micro-batch's I, every rank still holds all vpp forwards of it), plus what that I
    adds when the calibrated ``w_memory`` exceeds a whole unit."""
    return float(vpp) + max(0.0, w_memory - 1.0)


def split_stages_of(schedule: Schedule) -> frozenset:
    """Global stages whose backward ``schedule`` runs as I / W jobs (the others run B)."""
    return frozenset(schedule.placement.stage(r, j.chunk) for r, jobs in enumerate(schedule.ranks)
                     for j in jobs if j.kind in (BACKWARD_B, BACKWARD_W))


def fixed_candidates(pp: int, vpp: int, m: int, placement: str, costs: Costs):
    """(label, schedule, makespan, peak) of every registered non-auto schedule with
    ``placement``: split (label = name) and, for the ones that do not split by definition,
    also unsplit (label ``name/B``: every backward a single B job)."""
    out = []
    for name in schedule_names():
        spec = get_spec(name)
        if name in AUTO_NAMES or spec.placement != placement:
            continue
        variants = [(name, True)] + ([] if spec.splits_backward else [(f"{name}/B", False)])
        for label, split in variants:
            try:
                schedule = build_schedule(name, pp, vpp, m, split_backward=split)
                result = simulate(schedule, costs)
            except ValueError:
                break  # the schedule cannot serve this configuration
            out.append((label, schedule, result.makespan, result.max_peak_memory))
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
                memory_limit: Optional[float] = None,
                placements: Sequence[str] = (LOOPED,), local_search: bool = True) -> AutoResult:
    """Fastest schedule found whose simulated peak per rank is <= ``memory_limit``, over the
    placements and the split patterns of :func:`split_patterns` (the backward of each stage
    split into I / W, or one B)."""
    check_positive_int("pp", pp)
    check_positive_int("vpp", vpp)
    check_positive_int("m", m)
    costs = costs if costs is not None else Costs()
    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a Costs, got {type(costs).__name__}")
    least = minimum_memory(pp, vpp, m, costs.w_memory)
    if memory_limit is None:
        memory_limit = default_memory_limit(pp, vpp, m)
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)):
        raise TypeError(f"memory_limit must be a number, got {memory_limit!r}")
    if not math.isfinite(memory_limit):
        raise ValueError(f"memory_limit must be a finite number (peak activation units per "
                         f"rank), got {memory_limit!r}")
    if memory_limit < least - EPS:
        raise ValueError(f"memory_limit must be >= {least:g} (vpp={vpp} units: every valid schedule "
                         f"holds all vpp forwards of a micro-batch on each rank, plus "
                         f"max(0, w_memory-1)), got {memory_limit:g}")
    costs.check_stages(pp * vpp)
    began = time.perf_counter()
    best = None  # (makespan, placement, source, job lists, bound)
    baseline, baseline_span = None, INF
    tried: Dict[str, float] = {}
    patterns = split_patterns(costs, pp * vpp)
    for placement in placements:
        fixed = fixed_candidates(pp, vpp, m, placement, costs)
        for label, schedule, span, peak in fixed:
            tried[f"fixed:{label}@{placement}"] = span
            if peak <= memory_limit + EPS and span < baseline_span - EPS:
                baseline, baseline_span = label, span
        for pattern in patterns:
            ctx = SearchContext(pp, vpp, m, placement, costs, pattern)
            fits = [(label, schedule, span) for label, schedule, span, peak in fixed
                    if peak <= memory_limit + EPS and split_stages_of(schedule) == pattern]
            found = _search_pattern(ctx, memory_limit, fits, tried, local_search)
            if found is not None and (best is None or found[0] < best[0] - EPS):
                span, source, orders, bound = found
                if len(patterns) > 1 and not source.startswith("fixed:"):
                    source += f"/{_pattern_label(pattern, pp * vpp)}"
                best = (span, placement, source, ctx.to_jobs(orders), bound)
    if best is None:  # pragma: no cover - reserve policies always succeed for limit >= vpp
        raise ValueError(f"memory_limit {memory_limit:g} admits no schedule the search found "
                         f"for pp={pp}, vpp={vpp}, m={m}")
    span, placement, source, ranks, bound = best
    split = any(j.kind in (BACKWARD_B, BACKWARD_W) for jobs in ranks for j in jobs)
    schedule = Schedule(name="auto" if placement == LOOPED else "autoV", pp=pp, vpp=vpp, m=m,
                        placement=Placement(placement, pp, vpp), ranks=[list(j) for j in ranks],
                        split_backward=split,
                        options={"costs": costs, "memory_limit": memory_limit, "source": source})
    final = simulate(schedule, costs)  # the reference simulator has the last word
    return AutoResult(schedule, final.makespan, final.max_peak_memory, float(memory_limit),
                      placement, source, baseline, baseline_span, time.perf_counter() - began,
                      bound, tried)


def _search_pattern(ctx: SearchContext, memory_limit: float, fits, tried: Dict[str, float],
                    local_search: bool):
    """Steps 1-4 of the module doc for one placement and split pattern: (makespan, source,
    orders, memory lower bound) of the best order found, None if none fits."""
    placement = ctx.placement.kind
    pp, vpp, m = ctx.pp, ctx.vpp, ctx.m
    target = memory_lower_bound(pp, vpp, m, ctx.effective_costs, memory_limit, placement)
    pool = []  # (makespan, sum of finish times, source, orders) of every fitting candidate
    for label, schedule, span in fits:
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
        if peak <= memory_limit + EPS:
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
         memory_limit: Optional[float] = None) -> List[List[Job]]:
    """Searched zero-bubble schedule (looped placement): fastest simulated under memory_limit."""
    return auto_search(pp, vpp, m, costs, memory_limit, (LOOPED,)).schedule.ranks


@register_schedule("autoV", aliases=("auto-v",), placement=V_SHAPE, splits_backward=True)
def auto_v(pp: int, vpp: int, m: int, costs: Optional[Costs] = None,
           memory_limit: Optional[float] = None) -> List[List[Job]]:
    """Searched zero-bubble schedule (V placement): fastest simulated under memory_limit."""
    return auto_search(pp, vpp, m, costs, memory_limit, (V_SHAPE,)).schedule.ranks

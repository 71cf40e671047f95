"""Greedy list scheduling for the search (:mod:`auto`, step 2) and for ZBVPP.

Time runs forward; whenever a rank is free it picks one of its ready jobs by a
:class:`GreedyPolicy`.  :class:`GreedyScheduler` holds the state of one run (per stage: the next
micro-batch of F / I and their end times; per rank: clock, memory level, pending W's), and
:func:`greedy_orders` runs it.  Imports no schedule generator, so generators may use it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from .bounds import MemoryLimit, rank_limits
from .search_context import EPS, F, I, INF, W, SearchContext


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
    ``cap_drop``: run each rank under its limit ``- cap_drop`` (but at least vpp).
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


def greedy_orders(ctx: SearchContext, limit: MemoryLimit, policy: GreedyPolicy
                  ) -> Optional[List[List[int]]]:
    """Per-rank job-id orders built by list scheduling under ``policy``; None on a deadlock.

    Each round every rank states its next action (job and start time) under the policy; the
    earliest one is committed.  Nothing committed later can start before it, so the orders are
    an actual execution: valid and deadlock-free by construction.
    """
    return GreedyScheduler(ctx, limit, policy).run()


#: a rank's next action: (start time, kind, stage; -1 for the W at the head of its queue)
Action = Tuple[float, int, int]


class GreedyScheduler:
    """The state of one greedy run (see :func:`greedy_orders`)."""

    def __init__(self, ctx: SearchContext, limit: MemoryLimit, policy: GreedyPolicy):
        pp, vpp, m, S = ctx.pp, ctx.vpp, ctx.m, ctx.S
        self.ctx, self.policy, self.m, self.S, self.vpp = ctx, policy, m, S, vpp
        self.caps = [max(float(vpp), lim - policy.cap_drop) + EPS
                     for lim in rank_limits(limit, pp)]
        self.comm, self.cost, self.rank_of = ctx.comm, ctx.cost, ctx.rank_of
        self.end_f = [[-1.0] * m for _ in range(S)]
        self.end_i = [[-1.0] * m for _ in range(S)]
        self.next_f = [0] * S             # next micro-batch of each stage's F / I
        self.next_i = [0] * S
        self.clock = [0.0] * pp
        self.level = [0.0] * pp
        self.reserve = [0] * pp           # forwards still owed to started micro-batches
        self.f_done = [0] * pp
        self.i_done = [0] * pp
        self.last = [I] * pp              # last of F / I run (alternation)
        self.per_rank = vpp * m
        self.w_queue: List[List[Tuple[int, int]]] = [[] for _ in range(pp)]  # (stage, mb), FIFO
        self.w_head = [0] * pp
        self.orders: List[List[int]] = [[] for _ in range(pp)]
        self.first_stage = [stages[0] for stages in ctx.stages_of]
        self.f_deep = policy.f_key == "deep"
        self.i_deep = policy.i_key == "deep"
        self.prefer_f = policy.order.index("F") < policy.order.index("I")
        self.w_before_f = policy.order.index("W") < policy.order.index("F")

    def run(self) -> Optional[List[List[int]]]:
        pp = self.ctx.pp
        for _ in range(3 * self.S * self.m):
            best_r, best = -1, None
            for r in range(pp):
                action = self.decide(r)
                if action is not None and (best is None or action[0] < best[0] - EPS):
                    best_r, best = r, action
            if best is None:
                return None
            self.commit(best_r, best)
        return self.orders

    # ------------------------------------------------------------------ readiness

    def f_ready(self, s: int) -> float:
        mb = self.next_f[s]
        if mb >= self.m:
            return INF
        if s == 0:
            return 0.0
        e = self.end_f[s - 1][mb]
        if e < 0:
            return INF
        return e + self.comm if self.rank_of[s - 1] != self.rank_of[s] else e

    def i_ready(self, s: int) -> float:
        mb = self.next_i[s]
        if mb >= self.m:
            return INF
        e = self.end_f[s][mb]
        if e < 0:
            return INF
        if s + 1 < self.S:
            e2 = self.end_i[s + 1][mb]
            if e2 < 0:
                return INF
            if self.rank_of[s + 1] != self.rank_of[s]:
                e2 += self.comm
            if e2 > e:
                e = e2
        return e

    def f_allowed(self, r: int, s: int) -> bool:
        level, cap = self.level[r], self.caps[r]
        if level + 1.0 > cap:
            return False
        if s == self.first_stage[r]:
            admit = self.policy.admit
            if admit == "reserve":
                return level + self.reserve[r] + self.vpp <= cap
            if admit == "soft":
                return level + self.vpp <= cap
        return True

    def pick(self, r: int, kind: int) -> Tuple[int, float]:
        """(stage, ready time) of the best F / I of rank r (F: admissible only)."""
        best_s, best_t = -1, INF
        deep = self.f_deep if kind == F else self.i_deep
        for s in self.ctx.stages_of[r]:
            if kind == F:
                t = self.f_ready(s)
                if t == INF or not self.f_allowed(r, s):
                    continue
            else:
                t = self.i_ready(s)
                if t == INF:
                    continue
            if best_s < 0 or t < best_t - EPS or (abs(t - best_t) <= EPS and (s > best_s) == deep):
                best_s, best_t = s, t
        return best_s, best_t

    # ------------------------------------------------------------------ decisions

    def decide(self, r: int) -> Optional[Action]:
        """Rank r's next job, or None if it must wait for others."""
        fs, ft = self.pick(r, F)
        is_, it = self.pick(r, I)
        queue, head = self.w_queue[r], self.w_head[r]
        has_w = head < len(queue)
        w_cost = self.cost[W][queue[head][0]] if has_w else 0.0
        memory_tight = has_w and self.level[r] + 1.0 > self.caps[r] - self.policy.w_first_at
        if self.policy.warmup is not None:
            return self._decide_1f1b(r, (fs, ft), (is_, it), has_w, w_cost, memory_tight)
        return self._decide_free(r, (fs, ft), (is_, it), has_w, w_cost, memory_tight)

    def _wanted_1f1b(self, r: int, fs: int) -> int:
        """The kind the 1F1B discipline expects next on rank r."""
        f_done, per_rank = self.f_done[r], self.per_rank
        if f_done >= per_rank:
            want = I
        elif self.i_done[r] >= per_rank or f_done < self.policy.warmup[r]:
            want = F
        else:
            want = F if self.last[r] == I else I
        if want == F and fs < 0 and f_done < per_rank and self.level[r] + 1.0 > self.caps[r]:
            want = I  # memory blocks the F: run an I (or W) instead
        return want

    def _decide_1f1b(self, r: int, f_pick, i_pick, has_w: bool, w_cost: float,
                     memory_tight: bool) -> Optional[Action]:
        policy, t0 = self.policy, self.clock[r]
        want = self._wanted_1f1b(r, f_pick[0])
        ws, wt = f_pick if want == F else i_pick
        if wt <= t0 + EPS:
            if want == F and memory_tight:
                return t0, W, -1
            return t0, want, ws
        other_s, other_t = i_pick if want == F else f_pick
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

    def _decide_free(self, r: int, f_pick, i_pick, has_w: bool, w_cost: float,
                     memory_tight: bool) -> Optional[Action]:
        policy, t0 = self.policy, self.clock[r]
        (fs, ft), (is_, it) = f_pick, i_pick
        f_now, i_now = ft <= t0 + EPS, it <= t0 + EPS
        if i_now and f_now:
            choice = F if self.prefer_f else I
        elif i_now:
            choice = I
        elif f_now:
            choice = F
        else:
            choice = None
        if choice == F and (self.w_before_f and has_w or memory_tight):
            choice = W
        if choice is None:
            nxt = min(ft, it)
            if has_w and (policy.w_fill or nxt == INF or nxt >= t0 + w_cost - EPS
                          or (fs < 0 and self.level[r] + 1.0 > self.caps[r])):
                return t0, W, -1
            if nxt == INF:
                return None
            kind = I if it <= ft and not (self.prefer_f and ft <= it + EPS) else F
            return nxt, kind, (is_ if kind == I else fs)
        if policy.hold and choice != I and is_ >= 0 and t0 < it:
            c = self.cost[F][fs] if choice == F else w_cost
            if it < t0 + c - EPS and it - t0 <= policy.hold * c:
                return it, I, is_
        return t0, choice, (is_ if choice == I else fs if choice == F else -1)

    # ------------------------------------------------------------------ commit

    def commit(self, r: int, action: Action) -> None:
        """Run ``action`` on rank r: record it and advance the state."""
        start, kind, s = action
        if kind == W:
            s, mb = self.w_queue[r][self.w_head[r]]
            self.w_head[r] += 1
        elif kind == F:
            mb = self.next_f[s]
            self.next_f[s] += 1
            self.f_done[r] += 1
            self.last[r] = F
        else:
            mb = self.next_i[s]
            self.next_i[s] += 1
            self.i_done[r] += 1
            self.last[r] = I
        end = start + self.cost[kind][s]
        self.clock[r] = end
        self.level[r] += self.ctx.memory_delta[kind][s]
        self.orders[r].append(self.ctx.id(kind, s, mb))
        if kind == F:
            self.end_f[s][mb] = end
            if self.policy.admit == "reserve":
                self.reserve[r] += (self.vpp - 1) if s == self.first_stage[r] else -1
        elif kind == I:
            self.end_i[s][mb] = end
            self.w_queue[r].append((s, mb))


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

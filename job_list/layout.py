"""Layout search (:mod:`auto`, step 3): coordinate descent over the per-rank warm-up counts and
W deferrals of the ZB-H1 / InterleavedZB layout (looped placement), built with the generators'
own phases (:func:`zero_bubble.zb_rank_jobs`).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .bounds import MemoryLimit, fits, rank_limits
from .classic import grouped_order, interleaved_warmup, micro_batch_groups
from .ir import BACKWARD_B, BACKWARD_W, FORWARD
from .placement import LOOPED
from .search_context import EPS, F, I, W, SearchContext
from .zero_bubble import zb_rank_jobs


def layout_orders(ctx: SearchContext, warmup: Sequence[int], deferred: Sequence[int],
                  group_size: int) -> List[List[int]]:
    """Job-id orders of the ZB-H1 / InterleavedZB layout (looped placement) with per-rank
    warm-up forwards ``warmup[r]`` and ``deferred[r]`` W's kept back for the cool-down."""
    groups = micro_batch_groups(ctx.m, group_size)
    forwards = grouped_order(ctx.vpp, groups)
    backwards = grouped_order(ctx.vpp, groups, reverse_chunks=True)
    index = {FORWARD: F, BACKWARD_B: I, BACKWARD_W: W}
    out = []
    for r in range(ctx.pp):
        jobs = zb_rank_jobs(forwards, backwards, warmup[r], deferred[r])
        out.append([ctx.id(index[j.kind], ctx.stages_of[r][j.chunk], j.micro_batch) for j in jobs])
    return out


class _LayoutEvaluator:
    """Simulates layouts once each (cached) and counts the simulations."""

    def __init__(self, ctx: SearchContext, limit: MemoryLimit):
        self.ctx, self.limits, self.evals = ctx, rank_limits(limit, ctx.pp), 0
        self.cache: Dict[Tuple, Optional[Tuple[float, float, List[List[int]]]]] = {}

    def __call__(self, warmup: Sequence[int], deferred: Sequence[int], group: int
                 ) -> Optional[Tuple[float, float, List[List[int]]]]:
        """(makespan, sum of finish times, orders) of the layout; None if it does not fit."""
        key = (tuple(warmup), tuple(deferred), group)
        if key not in self.cache:
            self.evals += 1
            orders = layout_orders(self.ctx, warmup, deferred, group)
            result = self.ctx.simulate(orders)
            self.cache[key] = None if result is None or not fits(result[1], self.limits) else \
                (result[0], result[2], orders)
        return self.cache[key]


def _layout_moves(warmup: List[int], deferred: List[int]):
    """(warmup, deferred) neighbours of a layout, in the order the descent tries them."""
    moves = []
    for r in range(len(warmup)):
        for delta in (1, -1):
            w = list(warmup)
            w[r] += delta
            moves.append((w, deferred))
            d = list(deferred)
            d[r] += delta
            moves.append((warmup, d))
        moves.append(([x + 1 if q <= r else x for q, x in enumerate(warmup)], deferred))
    return moves


def _layout_seeds(ctx: SearchContext, evaluate: _LayoutEvaluator):
    """The best of the ZB-H1 / InterleavedZB layouts (warm-up per hop 1 or 2, W's deferred
    or not, micro-batch groups of pp or m): (span, sum, warmup, deferred, group, orders)."""
    pp, vpp, m = ctx.pp, ctx.vpp, ctx.m
    best = None
    for group in sorted({pp, m} if m < 2 * pp else {pp}):
        for per_hop in (1, 2):
            warmup = [min(vpp * m, w) for w in interleaved_warmup(pp, vpp, m, per_hop=per_hop,
                                                                    group_size=group)]
            for deferred in ([r for r in range(pp)], [0] * pp):
                found = evaluate(warmup, deferred, group)
                if found and (best is None or (found[0], found[1]) < (best[0], best[1])):
                    best = (found[0], found[1], list(warmup), list(deferred), group, found[2])
    return best


def layout_search(ctx: SearchContext, limit: MemoryLimit, max_evals: int = 400
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
    total = ctx.vpp * ctx.m
    evaluate = _LayoutEvaluator(ctx, limit)
    best = _layout_seeds(ctx, evaluate)  # (span, sum, warmup, deferred, group, orders)
    if best is None:
        return None
    improved = True
    while improved and evaluate.evals < max_evals:
        improved = False
        span, total_end, warmup, deferred, group, _ = best
        for w, d in _layout_moves(warmup, deferred):
            if evaluate.evals >= max_evals:
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

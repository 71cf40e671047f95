"""Local search (:mod:`auto`, step 4): improve per-rank job-id orders by moving single jobs,
evaluated with :meth:`SearchContext.simulate`."""
from __future__ import annotations

from typing import List, Optional, Tuple

from .bounds import MemoryLimit, fits, rank_limits
from .search_context import EPS, INF, W, SearchContext


# --------------------------------------------------------------------------- local search

def improve(ctx: SearchContext, orders: List[List[int]], limit: MemoryLimit,
            max_evals: Optional[int] = None, target: float = 0.0) -> Tuple[List[List[int]], float]:
    """First-improvement local search on the per-rank orders.

    Moves: a job that waited for its rank although its inputs were there swaps with the job
    before it (this defers a W, or runs an I before an F); a later W moves into an idle gap of
    its rank.  A move is kept when (makespan, sum of rank finish times) drops and the peak
    still fits ``limit`` (one, or one per rank) on every rank.  At most ``max_evals``
    simulations (default: scaled to the size).
    """
    if max_evals is None:
        max_evals = max(16, min(600, 150000 // max(1, ctx.N)))
    limits = rank_limits(limit, ctx.pp)
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
            if result is None or not fits(result[1], limits):
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

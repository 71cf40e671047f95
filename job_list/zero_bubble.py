"""Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).

Every generator here emits split backwards: ``backward_b`` (I, input gradient) and
``backward_w`` (W, weight gradient).  Nothing depends on a W, so a W may sit anywhere after its I
on its rank: the schedules differ in the F / I skeleton (which decides deadlock freedom) and in
where the W's go (which fills the bubbles and sets the memory peak).

* ``ZBH1``   — 1F1B's F / I skeleton; rank ``r`` keeps its first ``r`` W's back for the end, so
  the I's of the cool-down travel up the pipeline without waiting (PyTorch's
  ``_get_1f1b_rank_ops(enable_zero_bubble=True, num_1f1b_microbatches=rank)``).  Peak = 1F1B's.
* ``ZBH2``   — warm-up of ``2*(pp-1-r)`` forwards fills the start-up bubble, W's fill the rest:
  zero bubble (tF = tI = tW) at up to ``2*pp-1`` units, about twice 1F1B's.
* ``InterleavedZB`` — the looped interleaved skeleton with one warm-up forward per hop and the
  ZB-H1 W deferral (PyTorch's ``ScheduleInterleavedZeroBubble``); any vpp.
* ``ZBV``    — V placement, vpp = 2, PyTorch's ``ScheduleZBVZeroBubble`` phases.
* ``ZBVPP``  — V / zig-zag placement, any even vpp: the zero-bubble V schedule built by the
  greedy list scheduler of :mod:`greedy` at unit costs under 1F1B's memory (``pp*vpp`` units),
  as Paddle's ZBVPP builds its job list with sail-sg's ``v_schedule`` greedy.

Memory is counted as in :mod:`simulate` (units of one virtual stage's activations for one
micro-batch).
"""
from __future__ import annotations

from collections import deque
from typing import List, Sequence

from .classic import looped_orders
from .costs import Costs
from .greedy import GreedyPolicy, greedy_orders
from .ir import BACKWARD_B, BACKWARD_W, FORWARD, Job, Slot
from .placement import LOOPED, V_SHAPE, SizeError
from .registry import register_schedule
from .search_context import SearchContext


def _f(slot: Slot) -> Job:
    return Job(FORWARD, slot[0], slot[1])


def _i(slot: Slot) -> Job:
    return Job(BACKWARD_B, slot[0], slot[1])


def _w(slot: Slot) -> Job:
    return Job(BACKWARD_W, slot[0], slot[1])


def require_vpp(name: str, vpp: int, *, exactly: int = None, even: bool = False) -> None:
    if exactly is not None and vpp != exactly:
        raise SizeError("vpp", f"must be {exactly} for {name}", vpp)
    if even and vpp % 2:
        raise SizeError("vpp", f"must be even for {name} (V placement pairs the chunks)", vpp)


# --------------------------------------------------------------------------- shared phases

def zb_rank_jobs(forwards: Sequence[Slot], backwards: Sequence[Slot], warmup: int,
                 deferred: int) -> List[Job]:
    """One rank's jobs: warm-up F's, steady F-I-W, cool-down I-W, then the kept-back W's.

    The first ``deferred`` steady steps run F-I without their W (the W queue keeps its order),
    so ``deferred`` W's end up after the last I: they fill the cool-down bubble while the I's
    pass through.  ``warmup`` is clamped to the number of forwards.
    """
    n = len(forwards)
    if len(backwards) != n:
        raise ValueError(f"zb_rank_jobs needs as many backwards ({len(backwards)}) as forwards ({n})")
    warmup = max(0, min(warmup, n))
    steady = n - warmup
    jobs: List[Job] = []
    waiting: deque = deque()  # (chunk, mb) whose I has run and whose W has not, oldest first
    for i in range(warmup):                    # warm-up: forwards only
        jobs.append(_f(forwards[i]))
    for i in range(steady):                    # steady: F, I, and the oldest W once `deferred`
        jobs.append(_f(forwards[warmup + i]))  # W's are held back
        jobs.append(_i(backwards[i]))
        waiting.append(backwards[i])
        if i >= deferred:
            jobs.append(_w(waiting.popleft()))
    for i in range(steady, n):                 # cool-down: I, then the oldest W
        jobs.append(_i(backwards[i]))
        waiting.append(backwards[i])
        jobs.append(_w(waiting.popleft()))
    for slot in waiting:                       # the kept-back W's fill the cool-down bubble
        jobs.append(_w(slot))
    return jobs


# --------------------------------------------------------------------------- looped placement

@register_schedule("ZBH1", aliases=("ZB-H1",), placement=LOOPED, splits_backward=True)
def zbh1(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """ZB-H1: 1F1B's skeleton and peak memory; rank r keeps r W's back to fill the cool-down."""
    require_vpp("ZBH1", vpp, exactly=1)
    order = [(0, mb) for mb in range(m)]
    ranks = []
    for rank in range(pp):
        warmup = pp - 1 - rank                 # 1F1B's
        deferred = rank
        ranks.append(zb_rank_jobs(order, order, warmup, deferred))
    return ranks


@register_schedule("ZBH2", aliases=("ZB-H2",), placement=LOOPED, splits_backward=True)
def zbh2(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """ZB-H2: 2*(pp-1-r) warm-up forwards, W's fill the rest; about twice 1F1B's memory."""
    require_vpp("ZBH2", vpp, exactly=1)
    order = [(0, mb) for mb in range(m)]
    ranks = []
    for rank in range(pp):
        warmup = 2 * (pp - 1 - rank)           # fills the start-up bubble
        deferred = rank
        ranks.append(zb_rank_jobs(order, order, warmup, deferred))
    return ranks


@register_schedule("InterleavedZB", aliases=("InterleavedZeroBubble", "ZBVPP-looped"),
                   placement=LOOPED, splits_backward=True)
def interleaved_zb(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """Interleaved zero bubble (PyTorch): looped VPP skeleton, one warm-up F per hop, ZB-H1 W's."""
    orders = looped_orders(vpp, m, group_size=pp)
    ranks = []
    for rank in range(pp):
        warmup = orders.fill + (pp - 1 - rank)  # interleaved 1F1B's
        deferred = rank
        ranks.append(zb_rank_jobs(orders.forwards, orders.backwards, warmup, deferred))
    return ranks


# --------------------------------------------------------------------------- V placement

@register_schedule("ZBV", aliases=("ZB-V", "ZBVZeroBubble"), placement=V_SHAPE, splits_backward=True)
def zbv(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """ZB-V (PyTorch ScheduleZBVZeroBubble): V placement, vpp = 2, 1F1B's peak memory."""
    require_vpp("ZBV", vpp, exactly=2)
    return [_zbv_rank(pp, m, r) for r in range(pp)]


def _zbv_rank(pp: int, m: int, rank: int) -> List[Job]:
    """PyTorch's ZBV phases for one rank.

    As PyTorch does, the phases are laid out for ``max(m, 2*pp-1)`` micro-batches (the fewest
    that fill the V) and the jobs of the micro-batches that do not exist are dropped afterwards:
    a job only needs jobs of its own micro-batch, so a subsequence of a deadlock-free order
    stays deadlock-free.
    """
    n = max(m, 2 * pp - 1)
    jobs: List[Job] = []
    f_cnt, i_cnt, w_cnt = [0, 0], [0, 0], [0, 0]

    def f(chunk: int) -> None:
        jobs.append(_f((chunk, f_cnt[chunk])))
        f_cnt[chunk] += 1

    def i(chunk: int) -> None:
        jobs.append(_i((chunk, i_cnt[chunk])))
        i_cnt[chunk] += 1

    def w(chunk: int) -> None:
        jobs.append(_w((chunk, w_cnt[chunk])))
        w_cnt[chunk] += 1

    for _ in range(2 * (pp - rank) - 1):      # warm-up 1: chunk-0 forwards
        f(0)
    for _ in range(rank):                     # warm-up 2: F1 F0
        f(1)
        f(0)
    for _ in range(pp - rank):                # warm-up 3: F1 I1 W1 at the turn of the V
        f(1)
        i(1)
        w(1)
    while f_cnt[1] < f_cnt[0] or f_cnt[0] < n:    # steady: F0 I0 W0 F1 I1 W1
        if f_cnt[0] < n:
            f(0)
        i(0)
        w(0)
        f(1)
        i(1)
        w(1)
    for _ in range(rank):                     # cool-down 1: I0 I1, their W's kept back
        i(0)
        i(1)
    for _ in range(pp - rank):                # cool-down 2: I0 W0
        i(0)
        w(0)
    while w_cnt[1] < i_cnt[1]:                # the kept-back W's
        w(1)
    while w_cnt[0] < i_cnt[0]:
        w(0)
    return [job for job in jobs if job.micro_batch < m]


@register_schedule("ZBVPP", aliases=("ZB-VPP",), placement=V_SHAPE, splits_backward=True)
def zbvpp(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """ZB-VPP: zero-bubble V / zig-zag schedule for any even vpp at 1F1B's memory (pp*vpp units)."""
    require_vpp("ZBVPP", vpp, even=True)
    context = SearchContext(pp, vpp, m, V_SHAPE, Costs(1.0, None, 1.0, 1.0))
    orders = greedy_orders(context, float(pp * vpp), GreedyPolicy())
    if orders is None:  # the strict reservation rule never deadlocks
        orders = greedy_orders(context, float(pp * vpp), GreedyPolicy(admit="reserve"))
    if orders is None:  # pragma: no cover
        raise RuntimeError(f"ZBVPP greedy found no schedule for pp={pp}, vpp={vpp}, m={m}")
    return context.to_jobs(orders)

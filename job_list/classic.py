"""Classic (full-backward) pipeline schedules on the looped placement.

Every generator here is the three-phase shape of PyTorch's ``schedules.py``, Megatron's
interleaved schedule and sail-sg zero-bubble's 1F1B, written out per rank: ``warmup = ...``
forwards, then one forward / one backward (steady state), then the remaining backwards
(cool-down) -- :func:`interleave`.  The schedules differ only in the warm-up count per rank
(which each generator states) and, for LoopedBFS, in the order.

Orders (Megatron's ``microbatch_group_size_per_vp_stage``): micro-batches go in groups;
forwards run group by group and, within a group, chunk by chunk; backwards the same with the
chunks reversed.  Groups are never shorter than ``pp`` (unless ``m < pp``): a short group lets a
micro-batch's next chunk come up on rank 0 before its previous chunk has left rank pp-1, while
the steady state has already put backwards of the earlier group in between -- a dependency
cycle (Paddle 3.3.1's VPP at pp=4, vpp=4, m=5; Megatron refuses such ``m``).  So ``m`` is cut
into ``m // pp`` groups as equal as possible (sizes differ by at most one, larger first), and
with vpp > 1 the warm-up also covers the largest group of the other chunks (``fill``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from .ir import BACKWARD, FORWARD, Job, Slot
from .placement import check_positive_int
from .registry import register_schedule


# --------------------------------------------------------------------------- shared pieces

def micro_batch_groups(m: int, group_size: int) -> List[range]:
    """Cut ``range(m)`` into ``max(1, m // group_size)`` consecutive groups of near-equal size.

    Every group has at least ``group_size`` micro-batches (one group of ``m`` when m is smaller);
    sizes differ by at most one, larger groups first.
    """
    count = max(1, m // group_size)
    base, larger = divmod(m, count)
    groups, start = [], 0
    for index in range(count):
        size = base + (index < larger)
        groups.append(range(start, start + size))
        start += size
    return groups


def grouped_order(vpp: int, groups: Sequence[range], reverse_chunks: bool = False) -> List[Slot]:
    """(chunk, mb) pairs group by group, chunk by chunk within a group."""
    chunks = range(vpp - 1, -1, -1) if reverse_chunks else range(vpp)
    return [(chunk, mb) for group in groups for chunk in chunks for mb in group]


@dataclass(frozen=True)
class LoopedOrders:
    """Megatron's grouped orders of a rank's (chunk, mb) pairs; every rank has the same."""

    forwards: List[Slot]
    backwards: List[Slot]  # the chunks reversed within each group
    #: ``(vpp-1) * largest group``: the forwards that fill the last rank until the last chunk's
    #: first backward of a group appears there (fewer make that backward wait on a forward
    #: queued behind it); 0 for vpp = 1.
    fill: int


def looped_orders(vpp: int, m: int, group_size: int) -> LoopedOrders:
    groups = micro_batch_groups(m, group_size)
    return LoopedOrders(forwards=grouped_order(vpp, groups),
                        backwards=grouped_order(vpp, groups, reverse_chunks=True),
                        fill=(vpp - 1) * max(len(group) for group in groups))


def interleave(forward_jobs: Sequence[Job], backward_jobs: Sequence[Job], num_warmup: int) -> List[Job]:
    """Warm-up forwards, then one forward / one backward (steady), then the rest (cool-down).

    ``num_warmup`` is clamped to ``[0, len(forward_jobs)]``; both lists must be equally long.
    """
    n = len(forward_jobs)
    if len(backward_jobs) != n:
        raise ValueError(f"interleave needs as many backwards ({len(backward_jobs)}) as "
                         f"forwards ({n})")
    warmup = max(0, min(num_warmup, n))
    steady = n - warmup
    jobs: List[Job] = []
    for i in range(warmup):                    # warm-up: forwards only
        jobs.append(forward_jobs[i])
    for i in range(steady):                    # steady: one forward, one backward
        jobs.append(forward_jobs[warmup + i])
        jobs.append(backward_jobs[i])
    for i in range(steady, n):                 # cool-down: the backwards still owed
        jobs.append(backward_jobs[i])
    return jobs


def one_forward_one_backward(orders: LoopedOrders, warmup: int) -> List[Job]:
    """:func:`interleave` of ``orders`` as forward / full-backward jobs."""
    return interleave([Job(FORWARD, c, mb) for c, mb in orders.forwards],
                      [Job(BACKWARD, c, mb) for c, mb in orders.backwards], warmup)


def interleaved_warmup(pp: int, vpp: int, m: int, per_hop: int, extra: int = 0,
                       group_size: Optional[int] = None) -> List[int]:
    """Warm-up forwards per rank: ``fill + per_hop*(pp-1-rank) + extra``, at most ``m*vpp``.

    ``fill`` is :attr:`LoopedOrders.fill`; the second term covers the time the last chunk's
    backward needs to travel back to ``rank`` (``per_hop`` = 2 keeps a rank busy while
    tB = 2 tF and hides p2p latency); ``extra`` is Paddle's eager one.  (The generators below
    write their count out; the auto search varies ``per_hop`` and ``extra``.)
    """
    fill = looped_orders(vpp, m, pp if group_size is None else group_size).fill
    return [min(m * vpp, fill + per_hop * (pp - 1 - rank) + extra) for rank in range(pp)]


# --------------------------------------------------------------------------- schedules

@register_schedule("FThenB", aliases=("GPipe",))
def fthenb(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """FThenB (GPipe): every forward first, then every backward.

    vpp > 1 keeps the grouped interleaved order (forwards of a group chunk by chunk).
    """
    orders = looped_orders(vpp, m, group_size=pp)
    warmup = m * vpp                           # every forward: no steady state
    return [one_forward_one_backward(orders, warmup) for _rank in range(pp)]


@register_schedule("1F1B")
def one_f_one_b(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """1F1B: pp-1-rank warm-up forwards, then one forward / one backward.

    vpp > 1 is served as an interleaved 1F1B with the least warm-up (one forward per hop).
    """
    orders = looped_orders(vpp, m, group_size=pp)
    ranks = []
    for rank in range(pp):
        warmup = orders.fill + (pp - 1 - rank)
        ranks.append(one_forward_one_backward(orders, warmup))
    return ranks


@register_schedule("Eager1F1B")
def eager_1f1b(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """Eager 1F1B (Paddle): 2*(pp-rank)-1 warm-up forwards so sends overlap compute.

    vpp > 1 adds the interleaved fill ``(vpp-1)*pp`` in front, as VPP does.
    """
    orders = looped_orders(vpp, m, group_size=pp)
    ranks = []
    for rank in range(pp):
        warmup = orders.fill + 2 * (pp - 1 - rank) + 1
        ranks.append(one_forward_one_backward(orders, warmup))
    return ranks


@register_schedule("VPP", aliases=("Interleaved1F1B",))
def vpp_schedule(pp: int, vpp: int, m: int, group_size: Optional[int] = None) -> List[List[Job]]:
    """Interleaved 1F1B (Megatron / Paddle VPP): grouped chunk order, 2 warm-up forwards per hop.

    ``group_size`` is Megatron's ``microbatch_group_size_per_vp_stage`` (default ``pp``); it
    must be >= pp or the last chunk's backward cannot come back in time.
    """
    if group_size is not None:
        check_positive_int("group_size", group_size)
        if group_size < pp:
            raise ValueError(f"group_size must be >= pp ({pp}) for VPP, got {group_size}")
    orders = looped_orders(vpp, m, group_size=pp if group_size is None else group_size)
    ranks = []
    for rank in range(pp):
        warmup = orders.fill + 2 * (pp - 1 - rank)
        ranks.append(one_forward_one_backward(orders, warmup))
    return ranks


@register_schedule("LoopedBFS")
def looped_bfs(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """Looped BFS (PyTorch): chunk by chunk all forwards, then chunks reversed all backwards."""
    jobs = [Job(FORWARD, chunk, mb) for chunk in range(vpp) for mb in range(m)]
    jobs += [Job(BACKWARD, chunk, mb) for chunk in reversed(range(vpp)) for mb in range(m)]
    return [list(jobs) for _rank in range(pp)]

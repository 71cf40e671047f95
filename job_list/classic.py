"""Classic (full-backward) pipeline schedules on the looped placement.

Every generator here is the same three-phase shape, as in PyTorch's ``schedules.py`` and
Megatron's interleaved schedule: each rank has one *forward order* and one *backward order* of
its (chunk, micro-batch) pairs, runs ``num_warmup`` forwards, then alternates one forward / one
backward (steady state), then drains the remaining backwards (cool-down).  The schedules differ
only in the orders and in the warm-up count per rank, so they share :func:`interleave`.

Orders (Megatron's ``microbatch_group_size_per_vp_stage``): micro-batches go in groups;
forwards run group by group and, within a group, chunk by chunk; backwards the same with the
chunks reversed.  Groups are never shorter than ``pp`` (unless ``m < pp``): a short group lets a
micro-batch's next chunk come up on rank 0 before its previous chunk has left rank pp-1, while
the steady state has already put backwards of the earlier group in between -- a dependency
cycle (Paddle 3.3.1's VPP at pp=4, vpp=4, m=5; Megatron refuses such ``m``).  So ``m`` is cut
into ``m // pp`` groups as equal as possible (sizes differ by at most one, larger first), and
the warm-up covers the largest group.
"""
from __future__ import annotations

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


def interleave(forward_jobs: Sequence[Job], backward_jobs: Sequence[Job], num_warmup: int) -> List[Job]:
    """Warm-up forwards, then one forward / one backward (steady), then the rest (cool-down).

    ``num_warmup`` is clamped to ``[0, len(forward_jobs)]``; both lists must be equally long.
    """
    if len(forward_jobs) != len(backward_jobs):
        raise ValueError(f"interleave needs as many backwards ({len(backward_jobs)}) as "
                         f"forwards ({len(forward_jobs)})")
    warmup = max(0, min(num_warmup, len(forward_jobs)))
    jobs = list(forward_jobs[:warmup])
    steady = len(forward_jobs) - warmup
    for i in range(steady):
        jobs.append(forward_jobs[warmup + i])
        jobs.append(backward_jobs[i])
    jobs.extend(backward_jobs[steady:])
    return jobs


def _jobs(kind: str, order: Sequence[Slot]) -> List[Job]:
    return [Job(kind, chunk, mb) for chunk, mb in order]


def looped_1f1b(pp: int, vpp: int, m: int, warmup_per_rank: Sequence[int],
                group_size: Optional[int] = None) -> List[List[Job]]:
    """Per-rank job lists of a grouped, interleaved 1F1B with the given warm-up counts."""
    group_size = pp if group_size is None else check_positive_int("group_size", group_size)
    groups = micro_batch_groups(m, group_size)
    forwards = _jobs(FORWARD, grouped_order(vpp, groups))
    backwards = _jobs(BACKWARD, grouped_order(vpp, groups, reverse_chunks=True))
    return [interleave(forwards, backwards, warmup_per_rank[rank]) for rank in range(pp)]


def interleaved_warmup(pp: int, vpp: int, m: int, per_hop: int, extra: int = 0,
                       group_size: Optional[int] = None) -> List[int]:
    """Warm-up forwards per rank: ``(vpp-1)*largest_group + per_hop*(pp-1-rank) + extra``.

    The first term fills the last rank until the last chunk's first backward of a group appears
    there (a smaller fill makes that backward wait on a forward queued behind it); the second
    covers the time that backward needs to travel back to ``rank`` (``per_hop`` = 2 keeps a
    rank busy while tB = 2 tF and hides p2p latency); ``extra`` is Paddle's eager one.
    """
    groups = micro_batch_groups(m, pp if group_size is None else group_size)
    fill = (vpp - 1) * max(len(group) for group in groups)
    return [min(m * vpp, fill + per_hop * (pp - 1 - rank) + extra) for rank in range(pp)]


# --------------------------------------------------------------------------- schedules

@register_schedule("FThenB", aliases=("GPipe",))
def fthenb(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """FThenB (GPipe): every forward first, then every backward.

    vpp > 1 keeps the grouped interleaved order (forwards of a group chunk by chunk).
    """
    return looped_1f1b(pp, vpp, m, [m * vpp] * pp)


@register_schedule("1F1B")
def one_f_one_b(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """1F1B: pp-1-rank warm-up forwards, then one forward / one backward.

    vpp > 1 is served as an interleaved 1F1B with the least warm-up (one forward per hop).
    """
    return looped_1f1b(pp, vpp, m, interleaved_warmup(pp, vpp, m, per_hop=1))


@register_schedule("Eager1F1B")
def eager_1f1b(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """Eager 1F1B (Paddle): 2*(pp-rank)-1 warm-up forwards so sends overlap compute.

    vpp > 1 adds the interleaved fill ``(vpp-1)*pp`` in front, as VPP does.
    """
    return looped_1f1b(pp, vpp, m, interleaved_warmup(pp, vpp, m, per_hop=2, extra=1))


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
    return looped_1f1b(pp, vpp, m, interleaved_warmup(pp, vpp, m, per_hop=2, group_size=group_size),
                       group_size=group_size)


@register_schedule("LoopedBFS")
def looped_bfs(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """Looped BFS (PyTorch): chunk by chunk all forwards, then chunks reversed all backwards."""
    forwards = _jobs(FORWARD, [(c, mb) for c in range(vpp) for mb in range(m)])
    backwards = _jobs(BACKWARD, [(c, mb) for c in reversed(range(vpp)) for mb in range(m)])
    return [forwards + backwards for _ in range(pp)]

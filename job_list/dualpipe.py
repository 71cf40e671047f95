"""DualPipeV (DeepSeek's V-shaped DualPipe, "cut-in-half" DualPipe).

V placement with two chunks per rank: chunk 0 runs down the ranks, chunk 1 back up.  Each rank
runs DeepSeek's eight compact phases (``dualpipev.py``):

1. ``2*(pp-r-1)`` F0               5. ``pp-r-1`` × (B1, F1 B0)
2. ``r+1`` × (F0, F1)              6. ``r+1`` × (B1, B0), the second half zero-bubble (I only)
3. ``pp-r-1`` × (I1 W, F1)         7. ``pp-r-1`` × (W, I0)
4. ``m-2*pp+r+1`` × (F0 B1, F1 B0) 8. ``r+1`` × W

A full backward B is emitted as I immediately followed by its W; an "overlapped" pair F/B (which
DualPipe runs as one fused step overlapping compute with communication) becomes F then B.  A
zero-bubble backward emits only the I and queues its W; each ``W`` step runs the oldest queued W.

DeepSeek requires ``m >= 2*pp``.  For fewer micro-batches the phases are laid out for
``2*pp`` micro-batches and the jobs of the missing ones are dropped (as PyTorch does for ZB-V): a
job needs only jobs of its own micro-batch, so a subsequence of a deadlock-free order stays
deadlock-free.
"""
from __future__ import annotations

from collections import deque
from typing import List

from .ir import BACKWARD_B, BACKWARD_W, FORWARD, Job
from .placement import V_SHAPE
from .registry import register_schedule
from .zero_bubble import require_vpp


def _dualpipev_rank(pp: int, m: int, rank: int) -> List[Job]:
    n = max(m, 2 * pp)
    jobs: List[Job] = []
    next_f, next_b = [0, 0], [0, 0]
    weights: deque = deque()

    def forward(chunk: int) -> None:
        jobs.append(Job(FORWARD, chunk, next_f[chunk]))
        next_f[chunk] += 1

    def backward(chunk: int, zero_bubble: bool = False) -> None:
        mb = next_b[chunk]
        next_b[chunk] += 1
        jobs.append(Job(BACKWARD_B, chunk, mb))
        if zero_bubble:
            weights.append((chunk, mb))
        else:
            jobs.append(Job(BACKWARD_W, chunk, mb))

    def weight() -> None:
        chunk, mb = weights.popleft()
        jobs.append(Job(BACKWARD_W, chunk, mb))

    def forward_backward(f_chunk: int, b_chunk: int) -> None:
        forward(f_chunk)
        backward(b_chunk)

    for _ in range(2 * (pp - rank - 1)):           # 1: nF0
        forward(0)
    for _ in range(rank + 1):                      # 2: nF0F1
        forward(0)
        forward(1)
    for _ in range(pp - rank - 1):                 # 3: nB1W1F1 (zero bubble)
        backward(1, zero_bubble=True)
        weight()
        forward(1)
    for i in range(n - 2 * pp + rank + 1):         # 4: nF0B1F1B0 (main)
        forward_backward(0, 1)
        forward_backward(1, 0)
    for _ in range(pp - rank - 1):                 # 5: nB1F1B0
        backward(1)
        forward_backward(1, 0)
    zero_bubble = False                            # 6: nB1B0, second half zero bubble
    half = (rank + 1) // 2
    for i in range(rank + 1):
        if i == half and rank % 2 == 1:
            zero_bubble = True
        backward(1, zero_bubble)
        if i == half and rank % 2 == 0:
            zero_bubble = True
        backward(0, zero_bubble)
    for _ in range(pp - rank - 1):                 # 7: nWB0 (zero bubble)
        weight()
        backward(0, zero_bubble=True)
    while weights:                                 # 8: nW
        weight()
    return [job for job in jobs if job.micro_batch < m]


@register_schedule("DualPipeV", aliases=("DualPipe-V",), placement=V_SHAPE, splits_backward=True)
def dualpipev(pp: int, vpp: int, m: int) -> List[List[Job]]:
    """DualPipeV (DeepSeek): V placement, vpp = 2, eight compact phases per rank."""
    require_vpp("DualPipeV", vpp, exactly=2)
    return [_dualpipev_rank(pp, m, r) for r in range(pp)]

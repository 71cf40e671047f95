"""The rank x step grid of a schedule's lists as written (:func:`step_grid`).

Its own module because the validator draws it into its deadlock messages and must not import
the views (which time schedules through the simulator, itself built on the validator).
"""
from __future__ import annotations

from typing import AbstractSet, Tuple

from .ir import Job, Schedule


def step_grid(schedule: Schedule, marked: AbstractSet[Tuple[int, int]] = frozenset()) -> str:
    """Rank x step grid of ``schedule``'s lists as written: row ``r`` is rank r, column ``k``
    its k-th job, shown in short form ``{stage}{op}{mb}`` (``SEND_F`` ... and ``OPT`` too).
    Cells in ``marked`` ((rank, index) pairs) are bracketed, e.g. ``[1B0]``.  Needs no times,
    so it shows schedules that cannot be simulated (a deadlock) as well as valid ones."""
    labels = [[_step_label(schedule, rank, job) for job in jobs]
              for rank, jobs in enumerate(schedule.ranks)]
    width = max([len(text) for row in labels for text in row] + [1]) + 2
    columns = max([len(row) for row in labels] + [0])
    rank_width = len(str(max(len(labels) - 1, 0)))
    lines = [f"step {'':>{rank_width}} |" + "".join(f"{k:^{width}}" for k in range(columns)).rstrip()]
    for rank, row in enumerate(labels):
        cells = "".join((f"[{text}]" if (rank, index) in marked else f" {text} ").center(width)
                        for index, text in enumerate(row))
        lines.append(f"rank {rank:>{rank_width}} |" + cells.rstrip())
    return "\n".join(lines)


def _step_label(schedule: Schedule, rank: int, job: Job) -> str:
    try:
        return str(schedule.to_action(rank, job))
    except ValueError:  # a chunk the placement lacks: still show the job
        return str(job)

"""The covering design of the two-process semantics grid (``test_multirank_semantics`` and its
worker ``workers/multirank_semantics.py``): schedules x optimizer x clipping x LR schedule x
tied embeddings x B / W split on programs written with ``paddle.nn`` layers."""
from __future__ import annotations

import _user_programs as U

M = 4
LAYOUTS = {"1F1B": 1, "ZBH1": 1, "ZBV": 2, "VPP": 2}  # schedule -> vpp, pp = 2
GRID = U.pairwise_rows(dict(schedule=list(LAYOUTS), optimizer=U.OPTIMIZERS, clip=U.CLIPS,
                            lr_schedule=U.LR_SCHEDULES, tied=(False, True),
                            split_backward=(False, True)))


def case_of(row) -> U.Case:
    return U.Case(optimizer=row["optimizer"], clip=row["clip"], lr_schedule=row["lr_schedule"],
                  tied=row["tied"])

"""A plan's schedule opened once, for every builder: validated, simulated and lowered (the
lowering validated) - the schedule side of the plan opening, which needs no Paddle (the
builders in ``passes`` add what the program says: whether it has a backward)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .costs import Costs
from .ir import Schedule
from .latency import simulate_latency
from .lower import RankJob, lower_with_order
from .simulate import SimResult
from .validate import validate


@dataclass(frozen=True)
class OpenedSchedule:
    """A plan's schedule, opened once by :func:`open_schedule` for every builder."""

    schedule: Schedule      # compute-only (forward-only for a program without backward)
    lowered: Schedule       # with send / recv jobs, validated
    order: List[RankJob]    # one sequential execution of every rank's lowered jobs
    timing: SimResult       # the latency model's times of ``schedule`` (steered the lowering)


def open_schedule(schedule: Schedule, costs: Optional[Costs] = None,
                  forward_only: bool = False) -> OpenedSchedule:
    """Validate ``schedule`` once; for a program without a backward (evaluation, prediction)
    take its forward order (``Schedule.forward_only``); simulate and lower it once under
    ``costs``, the lowering validated before anything runs."""
    validate(schedule)
    if forward_only:
        schedule = schedule.forward_only()
    timing = simulate_latency(schedule, costs)
    lowered, order = lower_with_order(schedule, costs, timing=timing)
    validate(lowered)
    return OpenedSchedule(schedule, lowered, order, timing)

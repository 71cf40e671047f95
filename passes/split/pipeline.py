"""From one PIR training program to a ``core.Plan``: complete, split, schedule, lower, merge.

In one process every rank is emulated: the program holds all ``pp*vpp`` virtual stages, each a
chunk of its own (chunk id = global stage), and the ranks' lowered job lists are merged into one
global order by the simulator's start times.  Send / recv sub-programs are empty there (the
handoffs live in the micro-batch scope), but they stay in the order so the plan has the same
shape as a real multi-rank one.  The order of the build is the builders' one
(:class:`~pipesplit.passes.split.builder.PlanBuilder`); :class:`OneProcessBuilder` fills step 3.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from pipesplit.job_list import OPTIMIZER, Job, Schedule
from pipesplit.job_list.lower import global_order

from pipesplit.job_list.opening import OpenedSchedule
from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.passes.split.builder import PlanBuilder, RankJobs
from pipesplit.passes.split.checks import check_pass_inputs
from pipesplit.job_list.request import PipelineConfig, RequestedSchedule, make_schedule
from pipesplit.passes.split.core import PipelinePlan, split_sub_programs
from pipesplit.passes.split.per_rank import build_rank_plan

paddle = require_supported_paddle()

__all__ = ["PipelinePlan", "emulated_job_order", "make_schedule", "split_and_schedule",
           "split_sub_programs"]


def emulated_job_order(schedule: Schedule, costs=None, sequence=None) -> List[Tuple[str, int]]:
    """Every rank's lowered jobs in one executable global order, typed by global stage
    (``sequence``: that order, where the plan opening has it already)."""
    order = []
    for rank, job in sequence if sequence is not None else global_order(schedule, costs):
        if job.kind == OPTIMIZER:
            continue
        stage = schedule.placement.stage(rank, job.chunk)
        order.append((Job(job.kind, stage, job.micro_batch).type, job.micro_batch))
    if not schedule.is_forward_only:
        order.append((OPTIMIZER, 0))
    return order


class OneProcessBuilder(PlanBuilder):
    """Every rank in this process: the whole model split by global stage, with accumulation
    and fetches (the base's split)."""

    def communicate(self, opened: OpenedSchedule, split) -> RankJobs:
        """No transport: the handoffs stay in the micro-batch scope, and the order merges
        every rank's lowered list (:func:`emulated_job_order`), typed by global stage."""
        order = emulated_job_order(opened.schedule, sequence=opened.order)
        return RankJobs(order, split.programs, split, required_vars=split.required_vars)


def split_and_schedule(main_program, startup_program, config: PipelineConfig,
                       requested: Optional[RequestedSchedule] = None) -> PipelinePlan:
    """Apply pipesplit to ``main_program`` (never modified) and return the plan with its parts.
    ``requested``: the request a check already resolved, its schedule built (see
    ``open_schedule``).
    The ops are made as static ones whatever Paddle's mode (a pass applied from a dygraph
    script: ``paddle._C_ops`` would take the program's values for eager tensors)."""
    with paddle.base.framework._dygraph_guard(None):
        return _split_and_schedule(main_program, startup_program, config, requested)


def _split_and_schedule(main_program, startup_program, config, requested):
    check_pass_inputs(main_program, startup_program, config)
    if config.pp_stage is not None:
        return build_rank_plan(main_program, startup_program, config, requested=requested)
    return OneProcessBuilder(main_program, config, requested).build()

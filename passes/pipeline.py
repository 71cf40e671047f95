"""From one PIR training program to a ``core.Plan``: complete, split, schedule, lower, merge.

In one process every rank is emulated: the program holds all ``pp*vpp`` virtual stages, each a
chunk of its own (chunk id = global stage), and the ranks' lowered job lists are merged into one
global order by the simulator's start times.  Send / recv sub-programs are empty there (the
handoffs live in the micro-batch scope), but they stay in the order so the plan has the same
shape as a real multi-rank one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from pipesplit.job_list import OPTIMIZER, Job, Schedule, build_schedule
from pipesplit.job_list.lower import global_order, lower_comm
from pipesplit.job_list.simulate import SimResult, simulate
from pipesplit.job_list.validate import validate

from ._paddle import require_supported_paddle
from .checks import check_pass_inputs
from .config import PipelineConfig

paddle = require_supported_paddle()

from pipesplit.ir_utils import (complete_program, make_plan, split_program,  # noqa: E402
                                without_op_callstacks)
from pipesplit.ir_utils.split_backward import SplitReport, split_backward  # noqa: E402


@dataclass
class PipelinePlan:
    """Everything one application of the pass produced; ``plan`` goes to the executor."""

    config: PipelineConfig
    schedule: Schedule          # compute-only, per rank
    lowered: Schedule           # with send / recv jobs
    job_order: List[Tuple[str, int]]  # (Paddle job type, micro-batch), as the plan runs it
    split: object               # pipesplit.ir_utils.SplitProgram
    plan: object                # paddle core.Plan
    backward_split: Optional[SplitReport] = None

    def simulate(self, costs=None) -> SimResult:
        return simulate(self.schedule, costs or self.config.costs)

    def init_scope(self, scope, place=None):
        """Create and zero the gradient accumulators in ``scope`` (after running startup)."""
        self.split.init_scope(scope, place or paddle.CPUPlace())


def make_schedule(config: PipelineConfig) -> Schedule:
    """The validated compute schedule the config asks for."""
    options = {}
    if config.costs is not None:
        options["costs"] = config.costs
    if config.memory_limit is not None:
        options["memory_limit"] = config.memory_limit
    from pipesplit.job_list.registry import accepted_options

    schedule = build_schedule(config.schedule, config.pp_degree, config.vpp_degree,
                              config.num_micro_batches, split_backward=config.split_backward,
                              **accepted_options(config.schedule, options))
    validate(schedule)
    return schedule


def emulated_job_order(schedule: Schedule, costs=None) -> List[Tuple[str, int]]:
    """Every rank's lowered jobs in one executable global order, typed by global stage."""
    order = []
    for rank, job in global_order(schedule, costs):
        if job.kind == OPTIMIZER:
            continue
        stage = schedule.placement.stage(rank, job.chunk)
        order.append((Job(job.kind, stage, job.micro_batch).type, job.micro_batch))
    order.append((OPTIMIZER, 0))
    return order


def split_sub_programs(main_program, config: PipelineConfig):
    """(SplitProgram, SplitReport or None): one sub-program per (kind, global stage), with the
    backward split into B / W when the schedule needs it and gradient accumulation added.
    Works on a clone; the op-creation call stacks Paddle would record are skipped (speed)."""
    with without_op_callstacks():
        work = main_program.clone()
        complete_program(work)
        report = split_backward(work) if config.splits_backward else None
        split = split_program(work, config.num_stages, split_backward=config.splits_backward,
                              accumulate=config.grad_accumulation, completed=True)
    return split, report


def split_and_schedule(main_program, startup_program, config: PipelineConfig) -> PipelinePlan:
    """Apply pipesplit to ``main_program`` (never modified) and return the plan with its parts."""
    check_pass_inputs(main_program, startup_program, config)
    if config.pp_stage is not None:
        # one rank's programs for a multi-process run (pipesplit.passes.per_rank)
        from .per_rank import build_rank_plan

        return build_rank_plan(main_program, startup_program, config)
    schedule = make_schedule(config)
    lowered = lower_comm(schedule, config.costs)
    validate(lowered)
    split, report = split_sub_programs(main_program, config)
    job_order = emulated_job_order(schedule, config.costs)
    plan = make_plan(job_order, split.programs, config.num_micro_batches, split.required_vars)
    return PipelinePlan(config, schedule, lowered, job_order, split, plan, report)

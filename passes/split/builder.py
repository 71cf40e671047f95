"""The one order every plan builder follows (:meth:`PlanBuilder.build`).

Paddle's pipeline pass keeps its order in one method (``PipelinePassBase.
_apply_pir_single_impl``: partial programs, job list, ``core.Plan``) and a schedule fills two
hooks.  pipesplit's three builders, one per kind of input program (docs/design.md, "Three
programs the passes accept"), share this base the same way:

1. open the plan's schedule (:func:`~.core.open_schedule`);
2. split the program into sub-programs (:func:`~.core.split_sub_programs`), as the builder's
   program needs: its class attributes say whether its chunk ids are global stages, whether
   the split adds the gradient accumulation and the fetches, and :meth:`PlanBuilder.prepare`
   edits the clone before completion;
3. the rank's communication (:meth:`PlanBuilder.communicate`), answered as :class:`RankJobs`:
   for one rank of a launch, asked of the plan's transport (:class:`RankPlanBuilder`); for
   every rank in one process, no transport (the handoffs stay in the micro-batch scope);
4. make the plan (:func:`~pipesplit.ir_utils.make_plan`) and record it
   (:class:`~.core.PipelinePlan`).

A builder subclasses :class:`PlanBuilder` (or :class:`RankPlanBuilder`) and fills only what
differs; none overrides :meth:`PlanBuilder.build`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, Iterable, List, Optional, Tuple

from pipesplit.job_list.opening import OpenedSchedule
from pipesplit.job_list.request import PipelineConfig, RequestedSchedule
from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.passes.split.core import PipelinePlan, open_schedule, split_sub_programs
from pipesplit.passes.transport.base import Transport
from pipesplit.passes.transport.rank_comm import RankComm, RankPrograms

require_supported_paddle()

from pipesplit.ir_utils import make_plan  # noqa: E402


@dataclass
class RankJobs:
    """Step 3's answer: what the plan runs and what it records of the rank."""

    #: (job type, micro-batch) in the order the plan runs them, the optimizer last
    order: List[Tuple[str, int]]
    #: the program of every job type of ``order`` (others may be there: make_plan takes those
    #: the order names)
    programs: Dict[str, object]
    #: the split as the plan records it (a rank's view: its programs under local job types)
    split: object
    #: the non-persistable named values of the programs the split recorded them for (make_plan
    #: walks the others), by job type; None: walk every program
    required_vars: Optional[Dict[str, Iterable[str]]] = None
    #: what else the plan records of the rank: PipelinePlan fields (``rank_info``,
    #: ``comm_progress``, ``scope_variables``) by name
    recorded: Dict[str, object] = field(default_factory=dict)


class PlanBuilder:
    """One application of the pass to one program: :meth:`build` runs the four steps in
    order; a subclass fills step 2's attributes and :meth:`prepare`, and step 3."""

    #: the program's chunk ids are global stages (a whole model: one sub-program per virtual
    #: stage), not this rank's local chunks (the engine's per-rank program)
    chunk_ids_are_stages: ClassVar[bool] = True
    #: the split adds the config's gradient accumulation (the engine's gradient merge has
    #: accumulated already)
    adds_accumulation: ClassVar[bool] = True
    #: the split adds a fetch op for every value the forward hands out (the engine fetches
    #: what it wants itself)
    adds_fetches: ClassVar[bool] = True

    def __init__(self, main_program, config: PipelineConfig,
                 requested: Optional[RequestedSchedule] = None):
        self.main_program = main_program      # never modified: the split works on a clone
        self.config = config
        self.requested = requested            # resolved by a check, schedule built (or None)

    def build(self) -> PipelinePlan:
        """The plan: open, split, communicate, make.  The one order; no builder changes it."""
        opened = open_schedule(self.config, self.main_program, self.requested)
        split, report = self._split(opened)
        jobs = self.communicate(opened, split)
        plan = make_plan(jobs.order, jobs.programs, self.config.num_micro_batches,
                         jobs.required_vars)
        return PipelinePlan(self.config, opened.schedule, opened.lowered, jobs.order,
                            jobs.split, plan, report, timing=opened.timing, **jobs.recorded)

    def _split(self, opened: OpenedSchedule):
        """Step 2: (SplitProgram, SplitReport or None), as the class attributes say."""
        config = self.config
        return split_sub_programs(
            self.main_program, config,
            num_chunks=config.num_stages if self.chunk_ids_are_stages else config.vpp_degree,
            accumulate="config" if self.adds_accumulation else None,
            prepare=lambda work: self.prepare(work, opened),
            fetch_names=None if self.adds_fetches else [], schedule=opened.schedule)

    def prepare(self, work, opened: OpenedSchedule) -> None:
        """Edit ``work``, the split's clone of the program, before its completion (by default
        nothing)."""

    def communicate(self, opened: OpenedSchedule, split) -> RankJobs:
        """Step 3: the jobs and programs the plan runs, from the split."""
        raise NotImplementedError


class RankPlanBuilder(PlanBuilder):
    """A builder of one rank of a launch: its communication is the plan's transport's answer
    (:meth:`~pipesplit.passes.transport.base.Transport.rank_comm`) to the rank its
    subclass describes, with the jobs the subclass puts around the comm order."""

    def communicate(self, opened: OpenedSchedule, split) -> RankJobs:
        rank = self.rank_programs(opened, split)
        transport = self.plan_transport(rank)
        return self.rank_jobs(split, rank, transport.rank_comm(rank), transport)

    def rank_programs(self, opened: OpenedSchedule, split) -> RankPrograms:
        """The rank as its transport builds its comm jobs: its programs by local job type, the
        transfers of each comm job, where their values are made and read."""
        raise NotImplementedError

    def plan_transport(self, rank: RankPrograms) -> Transport:
        """The plan's transport, its way chosen (``Transport.for_plan``)."""
        raise NotImplementedError

    def rank_jobs(self, split, rank: RankPrograms, comm: RankComm, transport: Transport
                  ) -> RankJobs:
        """The plan's jobs from the transport's comm order (which has no optimizer): the jobs
        around it, the optimizer last."""
        raise NotImplementedError

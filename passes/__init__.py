"""pipesplit.passes — pipesplit's pipeline passes for Paddle's standalone executor.

``apply_pass(main, startup, "ZBV", {"num_micro_batches": 8, "pp_degree": 2, "vpp_degree": 2})``
returns a ``core.Plan``; ``apply_pipeline`` returns it with the schedule and sub-programs.

Its rooms: :mod:`.split` (the splitter: per-chunk sub-programs and the plan builders),
:mod:`.engine` (Paddle's auto-parallel engine), :mod:`.transport` (what moves between
processes), :mod:`.measure` (measuring jobs and re-planning); the user's entry points
:mod:`.strategy` and :mod:`.cpu_support`.
"""
from pipesplit.passes._paddle import SUPPORTED_PADDLE_VERSIONS, require_supported_paddle

require_supported_paddle()

from pipesplit.job_list.request import KNOWN_ATTRS, PipelineConfig  # noqa: E402
from pipesplit.passes.split.pipeline import (PipelinePlan, emulated_job_order,  # noqa: E402
                                             make_schedule, split_and_schedule)
from pipesplit.passes.split.registration import (PipesplitSchedulerPass, apply_pass,  # noqa: E402
                                                 apply_pipeline, disable, enable, is_enabled,
                                                 paddle_pass_class, register_all)

# The one registration at import, and why it cannot wait for a call of ours: the user's path is
# ``import pipesplit.passes`` then Paddle's own ``new_pass("pipeline_scheduler_ZBV", attrs)``
# (README, docs/splitting.md), which reads Paddle's registry directly.  Idempotent.
register_all()

__all__ = ["SUPPORTED_PADDLE_VERSIONS", "KNOWN_ATTRS", "PipelineConfig", "PipelinePlan",
           "PipesplitSchedulerPass", "apply_pass", "apply_pipeline", "disable", "enable",
           "emulated_job_order", "is_enabled", "make_schedule", "paddle_pass_class",
           "register_all", "split_and_schedule"]

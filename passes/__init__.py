"""pipesplit.passes — pipesplit's pipeline passes for Paddle's standalone executor.

``apply_pass(main, startup, "ZBV", {"num_micro_batches": 8, "pp_degree": 2, "vpp_degree": 2})``
returns a ``core.Plan``; ``apply_pipeline`` returns it with the schedule and sub-programs.
"""
from pipesplit.passes._paddle import SUPPORTED_PADDLE_VERSIONS, require_supported_paddle

require_supported_paddle()

from pipesplit.job_list.request import KNOWN_ATTRS, PipelineConfig  # noqa: E402
from pipesplit.passes.pipeline import PipelinePlan, emulated_job_order, make_schedule, split_and_schedule  # noqa: E402
from pipesplit.passes.registration import (PipesplitSchedulerPass, apply_pass, apply_pipeline, disable,  # noqa: E402
                           enable, is_enabled, paddle_pass_class, register_all)

register_all()

__all__ = ["SUPPORTED_PADDLE_VERSIONS", "KNOWN_ATTRS", "PipelineConfig", "PipelinePlan",
           "PipesplitSchedulerPass", "apply_pass", "apply_pipeline", "disable", "enable",
           "emulated_job_order", "is_enabled", "make_schedule", "paddle_pass_class",
           "register_all", "split_and_schedule"]

"""PIR program surgery for pipesplit: role / chunk completion, gradient accumulation,
sub-program extraction and a single-process plan runner."""
from ._callstack import without_op_callstacks
from .accumulate import BACKWARD_W_ATTR, AccumulationInfo, add_gradient_accumulation
from .complete import check_program, complete_program, has_backward
from .extract import Handoff, SplitProgram, job_types_for, split_program
from .models import BuiltModel, build_gpt, build_mlp
from .runner import (PlanRunner, apply_lr_scheduler, fthenb_order, init_scope, lr_program_of, make_plan, read_params,
                     required_vars_of, run_plan, run_unsplit_baseline)

__all__ = [
    "BACKWARD_W_ATTR", "AccumulationInfo", "add_gradient_accumulation",
    "check_program", "complete_program", "has_backward",
    "Handoff", "SplitProgram", "job_types_for", "split_program",
    "BuiltModel", "build_gpt", "build_mlp",
    "PlanRunner", "apply_lr_scheduler", "fthenb_order", "init_scope", "lr_program_of", "make_plan", "read_params",
    "required_vars_of", "run_plan",
    "run_unsplit_baseline", "without_op_callstacks",
]

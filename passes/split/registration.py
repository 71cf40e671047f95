"""pipesplit's passes in Paddle's pass registry.

Every schedule of the job_list registry (and its aliases) is registered as
``pipesplit_scheduler_<NAME>``, and as ``pipeline_scheduler_<NAME>`` where Paddle has no pass of
that name (ZBV, DualPipeV, auto ...), so ``new_pass("pipeline_scheduler_ZBV", attrs)`` works.
Paddle's own ``pipeline_scheduler_{FThenB,1F1B,Eager1F1B,VPP,ZBH1,ZBVPP}`` stay untouched until
:func:`enable` routes them to pipesplit; :func:`disable` puts them back.

:func:`register_all` is called once, by ``import pipesplit.passes`` (the user's ``new_pass``
needs the names then: see there), and by :func:`enable`; this module registers nothing when it
is imported.  Not through the patch table (:mod:`pipesplit.passes.engine.paddle_patches`):
Paddle's pass registry is a table of names, not attributes, written by Paddle's own
``PassBase._register``; :data:`ROUTING` keeps Paddle's classes and :func:`disable` puts them
back.
"""
from __future__ import annotations

from typing import Dict, Optional

from pipesplit.job_list import get_spec, schedule_names

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.job_list.request import request_schedule
from pipesplit.passes.split.pipeline import PipelinePlan, split_and_schedule

require_supported_paddle()
from paddle.distributed.passes.pass_base import PassBase, PassContext  # noqa: E402

PIPESPLIT_PREFIX = "pipesplit_scheduler_"
PADDLE_PREFIX = "pipeline_scheduler_"
PLAN_ATTR = "plan"                  # where Paddle's callers look for the core.Plan
PIPELINE_PLAN_ATTR = "pipesplit_plan"  # the PipelinePlan with schedule, sub-programs ...



class _Routing:
    """Whether Paddle's own pass names are routed to pipesplit, and by whom (the user, the
    strategy hook): the routing stays until each one that asked for it has taken it back."""

    def __init__(self):
        self.paddle_originals: Dict[str, type] = {}
        self.by: set = set()


#: this process's routing of Paddle's pass registry (with paddle_patches.DOOR, the only
#: process-wide state of pipesplit: both stand for changes made to Paddle's own registries)
ROUTING = _Routing()


class PipesplitSchedulerPass(PassBase):
    """Base of every pipesplit pass: ``schedule_name`` picks the job_list schedule."""

    schedule_name: Optional[str] = None

    def _check_self(self):
        return True

    def _check_conflict(self, other_pass):
        return True

    def apply(self, main_programs, startup_programs, context=None):
        # Paddle's auto-parallel pipeline step passes single programs, PassBase wants lists.
        if not isinstance(main_programs, list):
            main_programs, startup_programs = [main_programs], [startup_programs]
        return super().apply(main_programs, startup_programs, context)

    def _apply_single_impl(self, main_program, startup_program, context):
        requested = request_schedule(self.schedule_name, dict(self._attrs))
        result = split_and_schedule(main_program, startup_program, requested.config, requested)
        context.set_attr(PLAN_ATTR, result.plan)
        context.set_attr(PIPELINE_PLAN_ATTR, result)


def _pass_class(name: str) -> type:
    cls_name = "Pipesplit" + "".join(ch for ch in name if ch.isalnum()) + "Pass"
    return type(cls_name, (PipesplitSchedulerPass,), {"schedule_name": name, "__module__": __name__,
                                                      "__doc__": get_spec(name).description})


def register_all() -> None:
    """Register (again) every schedule of the job_list registry; idempotent."""
    for name in schedule_names():
        cls = _pass_class(name)
        for key in (name, *get_spec(name).aliases):
            PassBase._register(PIPESPLIT_PREFIX + key, cls)
            paddle_name = PADDLE_PREFIX + key
            current = PassBase._REGISTERED_PASSES.get(paddle_name)
            if current is None or issubclass(current, PipesplitSchedulerPass):
                PassBase._register(paddle_name, cls)
                cls.name = paddle_name


def enable(by: str = "user") -> None:
    """Route Paddle's own ``pipeline_scheduler_<NAME>`` passes (FThenB, 1F1B, VPP, ...) to
    pipesplit, asked by ``by``.  Undo with :func:`disable` (the same ``by``)."""
    ROUTING.by.add(by)
    register_all()
    for name in schedule_names():
        for key in (name, *get_spec(name).aliases):
            paddle_name = PADDLE_PREFIX + key
            current = PassBase._REGISTERED_PASSES.get(paddle_name)
            if current is not None and not issubclass(current, PipesplitSchedulerPass):
                ROUTING.paddle_originals[paddle_name] = current
            PassBase._register(paddle_name, PassBase._REGISTERED_PASSES[PIPESPLIT_PREFIX + key])


def disable(by: str = "user") -> None:
    """Take back ``by``'s routing: Paddle's own pipeline passes get their names back once
    nobody else asked for it."""
    ROUTING.by.discard(by)
    if ROUTING.by:
        return
    for paddle_name, cls in ROUTING.paddle_originals.items():
        PassBase._register(paddle_name, cls)
    ROUTING.paddle_originals.clear()


def is_enabled() -> bool:
    return bool(ROUTING.by)


def paddle_pass_class(name: str) -> Optional[type]:
    """Paddle's own pass class for ``pipeline_scheduler_<name>``, even while pipesplit is enabled."""
    key = PADDLE_PREFIX + name
    return ROUTING.paddle_originals.get(key) or (
        None if issubclass(PassBase._REGISTERED_PASSES.get(key, PipesplitSchedulerPass),
                           PipesplitSchedulerPass) else PassBase._REGISTERED_PASSES[key])


def apply_pipeline(main_program, startup_program, name: str, attrs: Optional[dict] = None
                   ) -> PipelinePlan:
    """Run pipesplit's pass for schedule ``name``; returns the plan with all its parts."""
    if attrs is not None and not isinstance(attrs, dict):
        raise TypeError(f"attrs must be a dict of pass attributes, got {type(attrs).__name__}")
    pass_obj = PassBase._REGISTERED_PASSES[PIPESPLIT_PREFIX + get_spec(name).name]()
    for key, value in (attrs or {}).items():
        pass_obj.set_attr(key, value)
    context = pass_obj.apply(main_program, startup_program, PassContext())
    return context.get_attr(PIPELINE_PLAN_ATTR)


def apply_pass(main_program, startup_program, name: str, attrs: Optional[dict] = None):
    """Paddle-style entry point: the ``core.Plan`` for schedule ``name`` (input never modified)."""
    return apply_pipeline(main_program, startup_program, name, attrs).plan

"""The plan the pipeline pass built last in this context: what
``pipesplit.passes.strategy.last_pipeline()`` returns, so a user who applied the pass by hand can
zero its gradient accumulators (``last_pipeline().init_scope(scope)``).  A record for the user,
read by nothing inside pipesplit (an engine's plans are at its session)."""
from __future__ import annotations

from contextvars import ContextVar
from typing import Optional

from pipesplit.passes.split.core import PipelinePlan

_LAST_PIPELINE: ContextVar[Optional[PipelinePlan]] = ContextVar("pipesplit_last_pipeline",
                                                                default=None)


def record(built: PipelinePlan) -> PipelinePlan:
    _LAST_PIPELINE.set(built)
    return built


def last_pipeline() -> Optional[PipelinePlan]:
    """The :class:`PipelinePlan` of the last call through the pipeline pass in this context."""
    return _LAST_PIPELINE.get()

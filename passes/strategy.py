"""Route Paddle's auto-parallel pipeline step to pipesplit, so ``strategy.pipeline.schedule_mode``
can be any pipesplit schedule (ZBH1, ZBV, ZBVPP, DualPipeV, auto ...).

Paddle 3.3.1's engine (``auto_parallel/static/engine.py``) calls
``pipeline_pass([dense_program], [dense_program], self._strategy.pipeline)``, a function that
accepts only FThenB, 1F1B and VPP, and tests ``schedule_mode == "VPP"`` for its chunk
completion, its chunk check and the loss fetch.  :func:`enable_strategy`:

* replaces ``pipeline_pass`` in ``pir_pass`` and in the engine (which imported the name);
* wraps ``Engine.__init__``: the strategy is checked (a schedule that cannot serve it is a
  ``ValueError`` naming the field) and the request resolved once into the engine's state;
* wraps ``Engine._parallel_pir`` and ``Engine.run``: Paddle's code in them sees
  ``schedule_mode == "VPP"`` (the user's name again after each call), so its chunk completion,
  chunk check and loss fetch serve every pipesplit schedule;
* wraps the engine's ``complete_chunk_id`` (the session completes the chunks itself for vpp
  > 1: :mod:`pipesplit.passes.engine.chunk_completion`) and ``check_chunk_id`` (skipped when
  no op has a chunk id: pipesplit gives them chunk 0);
* routes Paddle's ``pipeline_scheduler_<NAME>`` passes to pipesplit
  (:func:`pipesplit.passes.split.registration.enable`).

:func:`disable_strategy` restores all of it.  The engine's per-rank program goes to
:mod:`pipesplit.passes.engine.engine_rank`; a whole-model program (chunk id = global stage) to
:mod:`pipesplit.passes.split.pipeline` (``pp_stage`` from this process's rank, or every rank
emulated in one process); zero its gradient accumulators with
``last_pipeline().init_scope(scope)``.

The Paddle names are replaced by :mod:`pipesplit.passes.engine.paddle_patches` (group
``"engine"``, the full list there), the trampolines :mod:`pipesplit.passes.engine.hooks`,
which call the engine's session (:mod:`pipesplit.passes.engine.session`: its moments, and the
one step list of ``Engine.run``),
the strategy's translation :mod:`pipesplit.passes.engine.strategy_config`, its checks
(``check_strategy`` ...) :mod:`pipesplit.passes.engine.strategy_checks`, the user's options
(``use_costs`` ...) :mod:`pipesplit.passes.engine.user_options`, the session opened by
:mod:`pipesplit.passes.engine.open_state`.
"""
from __future__ import annotations

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.passes.engine import strategy_config
from pipesplit.passes.engine.hooks import pipeline_pass
from pipesplit.passes.last_built import last_pipeline
from pipesplit.passes.engine.replanning import Replanned, check_costs
from pipesplit.passes.engine.replanning import replan as _replan_engine
from pipesplit.passes.engine.session import session_of, session_of_engine
from pipesplit.passes.engine import strategy_checks
from pipesplit.passes.engine.section import held_request
from pipesplit.passes.engine.user_options import (measure_costs, reshard_after_forward, use_costs,
                                                  use_memory_budget)
from pipesplit.passes.measure.memory_budget import MemoryBudgetError
from pipesplit.passes.split import registration
from pipesplit.passes.engine import paddle_patches

require_supported_paddle()

__all__ = ["MemoryBudgetError", "Replanned", "check_strategy", "config_from_strategy", "disable_strategy",
           "enable_strategy", "is_strategy_enabled", "last_pipeline", "measure_costs", "notices",
           "pipe_from_strategy", "pipeline_pass", "plan_of", "record_pipe", "replan", "replanned",
           "requested_schedule", "reshard_after_forward", "use_costs", "use_memory_budget"]

_GROUP = "engine"
_ROUTES = "engine_routes"
_NAMES = "schedule_names"

# From this import on, Paddle's own engine asked for a schedule only pipesplit has (an engine
# built before enable_strategy(), whose train() may come before it too) says to call
# enable_strategy() before dist.to_static (a ValueError), where Paddle asserts; every other call
# of Paddle's pipeline_pass is Paddle's, unchanged.  disable_strategy() leaves it on.  The one
# patch at import, and why it cannot wait for a call: that user made no call of ours yet.
paddle_patches.enable(_NAMES)


def enable_strategy() -> None:
    """Route ``pir_pass.pipeline_pass`` (and the engine's imported name) to pipesplit, and let
    the engines built from now on serve any pipesplit schedule name in
    ``strategy.pipeline.schedule_mode``.  Call it before ``dist.to_static``: an engine built
    before it gets a ``ValueError`` saying so at its next call (``train()``, a step), whatever
    its schedule; with a schedule only pipesplit has, a ``train()`` before this call stops with
    that ``ValueError`` already (this module's import named the schedule to Paddle's engine)."""
    if paddle_patches.is_enabled(_GROUP):
        return
    for group in (_GROUP, _ROUTES):
        paddle_patches.check_names(group)  # before the pass registry changes
    registration.enable(by="strategy")
    paddle_patches.enable(_ROUTES)
    paddle_patches.enable(_GROUP)


def disable_strategy() -> None:
    """Engines built from now on are Paddle's own: Paddle gets its ``pipeline_pass``, chunk
    completion and engine back (and its pass names, unless they were routed to pipesplit before
    :func:`enable_strategy`).  An engine built with pipesplit keeps working as it was built:
    its engine functions stay routed while it lives (and route Paddle's own engines to Paddle)."""
    if not paddle_patches.is_enabled(_GROUP):
        return
    paddle_patches.disable(_GROUP)
    paddle_patches.release(_ROUTES)
    registration.disable(by="strategy")


def is_strategy_enabled() -> bool:
    return paddle_patches.is_enabled(_GROUP)


def _engine_of(dist_model):
    engine = getattr(dist_model, "_engine", dist_model)
    if not hasattr(engine, "_strategy") or not hasattr(engine, "_executor"):
        raise TypeError(f"dist_model must be what dist.to_static returned (a DistModel), got "
                        f"{type(dist_model).__name__}")
    return engine


def replan(dist_model, costs):
    """Build the training plan of ``dist_model`` (what ``dist.to_static`` returned) again with
    ``costs`` (a :class:`~pipesplit.job_list.Costs`) and train with it from the next step on;
    every process calls it between the same two steps.  Returns the new
    :class:`~pipesplit.passes.split.core.PipelinePlan`.  ``auto`` does this by itself once with
    the costs it measures (:func:`measure_costs`)."""
    engine = _engine_of(dist_model)
    check_costs(costs)
    return _replan_engine(session_of_engine(engine), engine, costs)


def replanned(dist_model):
    """The last re-plan of ``dist_model``'s training plan (:class:`Replanned`: the step
    measured, the costs, the plans before and after), or None."""
    session = session_of_engine(_engine_of(dist_model))
    return None if session is None else session.replanned


def notices(dist_model) -> tuple:
    """The lines ``dist_model``'s engine said once about the strategy fields it set that have
    no effect here or are done differently from what they ask (the table in
    ``docs/engine.md``, "Every knob"); () for Paddle's own schedules."""
    session = session_of_engine(_engine_of(dist_model))
    return () if session is None else session.notices


def plan_of(dist_model, mode: str = "train"):
    """The :class:`~pipesplit.passes.split.core.PipelinePlan` ``dist_model`` runs in ``mode``
    ("train", "eval" or "predict") on this process: its ``job_order``, sub-programs
    (``split.programs``) and schedule; None before the engine prepared that mode, or for
    Paddle's own schedules."""
    if mode not in ("train", "eval", "predict"):
        raise ValueError(f"mode must be 'train', 'eval' or 'predict', got {mode!r}")
    session = session_of_engine(_engine_of(dist_model))
    return None if session is None else session.pipeline_of(mode)


# The readers of a pipeline section, for a user's script: each asks the one object at the
# section's handle (:func:`~.engine.section.held_request`): an engine's session, what its
# opening resolved, or a section's own request, resolved once.  Nothing inside the engine
# calls these.

def check_strategy(pipeline_strategy, blocks=None):
    """Refuse a pipeline strategy pipesplit cannot serve, before the engine builds anything
    (``ValueError`` / ``TypeError`` naming the field: the field types
    (:func:`~.engine.strategy_checks.check_fields`), then the request it makes); returns its
    config (no rank): an engine's, the one its opening checked."""
    strategy_checks.check_fields(pipeline_strategy)
    return held_request(pipeline_strategy, blocks).config


def config_from_strategy(pipeline_strategy, pp_stage="auto", blocks=None):
    """The :class:`~pipesplit.job_list.request.PipelineConfig` of ``strategy.pipeline`` on
    ``pp_stage`` (``"auto"``: this process's pipeline rank): an engine's, its session's request
    (``blocks`` unused), else the section's (with ``blocks``, the stage meshes' block counts:
    :func:`~pipesplit.job_list.request.sized_costs`)."""
    held = held_request(pipeline_strategy, blocks)
    return held.config_on(held.pp_stage() if pp_stage == "auto" else pp_stage)


def pipe_from_strategy(pipeline_strategy):
    """This process's pipeline (:class:`~pipesplit.job_list.pipe.Pipe`): an engine's, from
    its stage meshes; else one process per stage."""
    held = held_request(pipeline_strategy)
    return strategy_config.processes(held.request.pp, held.pipe)


def record_pipe(dist_program, pipeline_strategy):
    """This process's pipeline from the stage meshes of ``dist_program`` (an engine's whole
    distributed program), for the section's ``pp_degree`` (an engine's copy holds what its
    opening filled in) (:func:`~.engine.strategy_config.stage_pipe`); the section is only
    read."""
    return strategy_config.stage_pipe(dist_program, int(pipeline_strategy.pp_degree))


def requested_schedule(pipeline_strategy) -> str:
    """The schedule name the user asked for (an engine's, as its session keeps it)."""
    return held_request(pipeline_strategy).requested

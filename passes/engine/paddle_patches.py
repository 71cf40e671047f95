"""The one door to Paddle's internals: every Paddle name pipesplit replaces is listed here.

A :class:`Patch` names a Paddle owner (module or class, by import path), an attribute, a
wrapper factory (Paddle's function -> the function installed in its place) and the feature
group it belongs to:

* ``"engine"`` - :func:`pipesplit.passes.strategy.enable_strategy`: the entry of a new engine
  (``Engine.__init__`` opens its session, ``DistModel.__init__`` checks) and the pass for
  programs outside an engine (the trampolines in :mod:`pipesplit.passes.engine.hooks`, which
  find the engine's :class:`~pipesplit.passes.engine.session.EngineSession` once and call the
  method of that moment);
* ``"engine_routes"`` - enabled with ``"engine"``: the engine's functions, each routed by the
  engine's ownership (an engine with a pipesplit session is served by pipesplit, Paddle's own
  engine by Paddle).  An engine built with pipesplit *holds* the group (:meth:`PatchDoor.hold`):
  :func:`~pipesplit.passes.strategy.disable_strategy` leaves it installed while such an engine
  lives, so the engine keeps working as it was built;
* ``"cpu"`` - :func:`pipesplit.passes.cpu_support.enable` (hook bodies in
  :mod:`pipesplit.passes.engine.cpu_hooks`);
* ``"schedule_names"`` - enabled when :mod:`pipesplit.passes.strategy` is imported, and left on
  by ``disable_strategy()``: Paddle's own engine asked for a schedule only pipesplit has (an
  engine built before ``enable_strategy()``, whose ``train()`` may come before it too) stops
  with a ``ValueError`` saying to call ``enable_strategy()`` before ``dist.to_static`` instead
  of Paddle's ``AssertionError``
  (:func:`~pipesplit.passes.engine.hooks.name_a_schedule_paddle_lacks`).

How the door installs them (checked, composed, reversible) is :mod:`.door`; :func:`enable`,
:func:`disable`, :func:`release` and :func:`list_patches` are its door's.
"""
from __future__ import annotations

from pipesplit.passes.engine import cpu_hooks, hooks as engine_hooks
from pipesplit.passes.engine.door import (DOOR, GROUPS, PaddleMismatchError, Patch, PatchDoor,
                                          PatchState)

__all__ = ["DOOR", "GROUPS", "PATCHES", "PaddleMismatchError", "Patch", "PatchDoor",
           "PatchState", "check_names", "disable", "enable", "hold", "is_enabled",
           "list_patches", "release"]

_ENGINE = "paddle.distributed.auto_parallel.static.engine"
_PIR_PASS = "paddle.distributed.auto_parallel.static.pir_pass"


def _replace_with(function):
    """A factory for a stand-in that does not call Paddle's function."""
    return lambda original: function


_DIST_MODEL = "paddle.distributed.auto_parallel.api.DistModel"
_PROCESS_GROUP = "paddle.distributed.auto_parallel.static.process_group.ProcessGroup"

_ROUTES = "engine_routes"
_NAMES = "schedule_names"

PATCHES = (
    # a pipesplit schedule asked of Paddle's own engine: named (innermost, under the routes)
    Patch(_PIR_PASS, "pipeline_pass", engine_hooks.name_a_schedule_paddle_lacks, _NAMES),
    Patch(_ENGINE, "pipeline_pass", engine_hooks.name_a_schedule_paddle_lacks, _NAMES),
    # the engine's pipeline step (pir_pass's, and the name the engine module imported)
    Patch(_PIR_PASS, "pipeline_pass", engine_hooks.route_the_pipeline_pass, _ROUTES),
    Patch(_ENGINE, "pipeline_pass", engine_hooks.route_the_pipeline_pass, _ROUTES),
    Patch(_ENGINE, "complete_chunk_id", engine_hooks.complete_chunk_id, _ROUTES),
    Patch(_ENGINE, "check_chunk_id", engine_hooks.check_chunk_id, _ROUTES),
    Patch(f"{_ENGINE}.Engine", "__init__", engine_hooks.engine_init, "engine"),
    Patch(f"{_ENGINE}.Engine", "_prepare_program", engine_hooks.keep_plan_per_mode, _ROUTES),
    Patch(f"{_ENGINE}.Engine", "to_mode", engine_hooks.switch_to_the_mode_plan, _ROUTES),
    # Paddle's own code shown schedule_mode "VPP" while it tests for it (chunk completion and
    # check); every other reader sees the user's name
    Patch(f"{_ENGINE}.Engine", "_parallel_pir", engine_hooks.shown_vpp, _ROUTES),
    # ONE wrapper: the session's ordered step list (failure naming, measure-and-replan,
    # Paddle's run shown "VPP" for its loss fetch, the loss handed to the last stage)
    Patch(f"{_ENGINE}.Engine", "run", engine_hooks.run_one_step, _ROUTES),
    Patch(f"{_ENGINE}.Engine", "prepare", engine_hooks.whole_batch_spec, _ROUTES),
    # one ring id per group of ranks on every process, before the communicators are made
    Patch(f"{_ENGINE}.Engine", "_init_comm", engine_hooks.one_ring_per_group, _ROUTES),
    Patch(f"{_ENGINE}.Engine", "_build", engine_hooks.name_the_prediction, _ROUTES),
    Patch(f"{_ENGINE}.Engine", "_prepare_data_spec_from_dataloader",
          engine_hooks.note_a_sharded_loader, _ROUTES),
    # inside the cpu group's wrapper of the same name (the earlier patch in this table is
    # the inner one), so it sees whether cpu_support skips DistModel's fleet.init
    Patch(_DIST_MODEL, "__init__", engine_hooks.checks_before_the_engine, "engine"),
    Patch(_DIST_MODEL, "__call__", engine_hooks.check_each_batch, _ROUTES),
    # the names of the models built after a DistModel (see keep_the_name_generator)
    *(Patch(_DIST_MODEL, name, engine_hooks.keep_the_name_generator, _ROUTES)
      for name in ("__init__", "train", "eval", "predict")),
    # a CPU build's gaps in the engine
    Patch(_PROCESS_GROUP, "instantiate", _replace_with(cpu_hooks.instantiate_gloo), "cpu"),
    Patch("paddle.base.core", "reshard", cpu_hooks.reshard, "cpu"),
    Patch("paddle._legacy_C_ops", "barrier", cpu_hooks.barrier, "cpu"),
    Patch("paddle.base.executor.Executor", "_set_plan", cpu_hooks.set_plan, "cpu"),
    Patch(_DIST_MODEL, "__init__", cpu_hooks.dist_model_init, "cpu"),
    Patch("paddle.distributed.collective", "_new_process_group_impl",
          cpu_hooks.gloo_group_store, "cpu"),
)

DOOR.add_patches(PATCHES)
enable = DOOR.enable
disable = DOOR.disable
is_enabled = DOOR.is_enabled
hold = DOOR.hold
release = DOOR.release
list_patches = DOOR.list_patches
check_names = DOOR.check_names

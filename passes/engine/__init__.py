"""pipesplit inside Paddle's auto-parallel engine (``dist.to_static`` with ``strategy.pipeline``).

* :mod:`.session` - the one :class:`~.session.EngineSession` of an engine: its
  :class:`~.state.EngineState` (:mod:`.state`, at one handle) with the moments Paddle gives it
  as methods, and ``run``, the one step list of ``Engine.run``; :mod:`.open_state` - opening it
  (the strategy read, checked and its request resolved once);
* :mod:`.strategy_config` - the strategy in pipesplit's terms (the request, the config, the
  pipeline); :mod:`.user_options` - ``use_costs`` / ``measure_costs`` / ``use_memory_budget``;
* :mod:`.strategy_checks`, :mod:`.loader_checks` - the user's strategy and loader, checked once
  when the engine is made; :mod:`.sequence_parallel` - sequence parallel refused where it
  cannot be served;
* :mod:`.hooks` - the trampolines installed in place of the engine's functions: each finds the
  session once and calls its method;
* :mod:`.paddle_patches` - the one door through which they replace Paddle's names (checked,
  reversible); :mod:`.cpu_hooks` - a CPU build's gaps in the engine;
* :mod:`.block_placement`, :mod:`.surgery` - what the session changes in the engine's model and
  programs (blocks onto the meshes of the schedule's placement);
* :mod:`.engine_rank` - the engine's pipeline pass: one rank's plan from the program the engine
  partitioned; :mod:`.shared_parameters` - parameters read on another stage's rank, served by
  step jobs; :mod:`.replanning` - the measured re-plan; :mod:`.loss_location` - the loss
  handed to the last stage.

The user's entry points are :mod:`pipesplit.passes.strategy` and
:mod:`pipesplit.passes.cpu_support`; :func:`block_meshes` places blocks for a schedule by hand.
"""
from pipesplit.passes.engine.block_placement import block_meshes

__all__ = ["block_meshes"]

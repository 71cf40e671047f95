"""This rank's plan from the engine's program (:func:`engine_rank_plan`, the pass's and every
re-plan's), and a re-plan of an engine's training plan: from costs given (:func:`replan`), or from a training
step every process measures (:class:`Measurement`, two steps of ``Engine.run``'s list: the
costs of :mod:`pipesplit.passes.measure.replan`, under a memory budget the bytes of
:mod:`pipesplit.passes.measure.memory_budget`)."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from typing import Dict, Optional

from pipesplit.passes.split.core import PipelinePlan
from pipesplit.passes.engine.state import EngineState
from pipesplit.passes.transport.launch_store import round_key
from pipesplit.passes.transport.step_exchange import create_scope_variables
from pipesplit.passes.engine.engine_rank import build_engine_rank_plan
from pipesplit.passes.engine.strategy_config import processes


def engine_rank_plan(main, config, state: EngineState, requested=None):
    """This rank's plan from the engine's program ``main``, on the pipeline of processes the
    engine's stage meshes gave; the scope variables its step jobs read and write
    (:mod:`pipesplit.passes.engine.shared_parameters`) are made in the engine's scope
    (Paddle's global scope), zeroed."""
    import paddle

    plan = build_engine_rank_plan(main, config, state.transport,
                                  processes(state.request.pp, state.pipe),
                                  requested=requested,
                                  shared=state.shared_parameters,
                                  regather=state.options.reshard_after_forward)
    plan.source_program = main
    create_scope_variables(paddle.static.global_scope(), plan.scope_variables.items(),
                           state.transport.device_place())
    return plan


@dataclass(frozen=True)
class Replanned:
    """One re-plan of an engine's training plan."""

    step: Optional[int]       # the training step measured (None: costs given to replan())
    costs: object             # pipesplit.job_list.Costs the plan was built with
    before: PipelinePlan
    after: PipelinePlan
    #: seconds of each phase of a measured re-plan on this process (profiler set-up, waits at
    #: the rendezvous, the step, the exchange, the search and build)
    timings: Dict[str, float] = field(default_factory=dict)
    #: under a memory budget: the budget, the search's memory limit in units, the measured
    #: model (pipesplit.passes.measure.memory_budget.MemoryModel.to_dict) and the bytes it
    #: predicts per pipeline rank for the new plan
    memory: Optional[dict] = None


def check_costs(costs) -> None:
    """``replan``'s costs: a :class:`~pipesplit.job_list.Costs` (checked before anything else)."""
    from pipesplit.job_list.costs import Costs

    if not isinstance(costs, Costs):
        raise TypeError(f"costs must be a pipesplit.job_list.Costs, got {type(costs).__name__}")


def replan(state: Optional[EngineState], engine, costs, step: Optional[int] = None,
           memory_limit=None) -> PipelinePlan:
    """Build ``engine``'s training plan again from the engine's program with ``costs``
    (:class:`~pipesplit.job_list.Costs`, :func:`check_costs`; ``auto`` / ``autoV`` search
    again, under ``memory_limit`` units per rank when given, one number or one per rank; every
    lowering uses them) and run it from the next training step on.  ``state``: the engine's
    (its session; None for an engine pipesplit does not serve).  Every process must call it
    between the same two steps, with the same costs.  Returns the new plan."""
    before = None if state is None else state.pipeline_of("train")
    if before is None or before.source_program is None:
        raise ValueError("replan: this engine has no pipesplit training plan built from the "
                         "engine's program yet (run a training step first)")
    if state.fused_passes:
        raise ValueError("replan: strategy.fused_passes.fused_passes_list is set; the engine "
                         "ran those passes on the first plan's programs, which a re-plan "
                         "would not repeat")
    import paddle

    # checked as every config is (costs of pp x vpp stages, a limit only for a search)
    config = before.config.replaced(costs=costs, **(
        {} if memory_limit is None else {"memory_limit": memory_limit}))
    with paddle.base.framework._dygraph_guard(None):  # programs are built in static mode
        after = engine_rank_plan(before.source_program, config, state)
    state.modes["train"].pipeline = after
    # this engine's own objects (its plan, its executor's plan and cache), not Paddle names:
    # the new plan IS the change, kept for the engine's life, so not the patch table's to undo
    if engine._mode == "train":
        engine._job_plan = after.plan
        engine._executor._set_plan(after.plan)
    _forget_executors(engine._executor)
    state.replanned = Replanned(step, costs, before, after)
    return after


def _forget_executors(executor) -> None:
    """Drop the executor's cached standalone executors: its cache keys on the program, feed
    and fetches, not on the plan (a rank that fetches nothing would run the old plan), and
    ``clear()`` empties only the cache of the old IR."""
    cache = executor._executor_cache
    cache.clear()
    cache._get_cached_program_and_executor_pir_mode.cache_clear()


class Measurement:
    """The measured training step of an engine and the re-plan from it, in two steps of
    ``Engine.run``'s list (:mod:`.run_steps`): :meth:`start` before Paddle's run (every process
    meets, Paddle's profiler on: it records the jobs, and under a memory budget the
    allocations), :meth:`replan` after it (the profiler off, every process's measurement
    shared, the costs (:mod:`pipesplit.passes.measure.replan`) and bytes
    (:mod:`pipesplit.passes.measure.memory_budget`) priced, the plan built again, every process
    meeting before the next step)."""

    def __init__(self, engine, state: EngineState, before: PipelinePlan, step: int):
        import paddle.distributed as dist

        from pipesplit.passes.measure.profile import JobRecorder

        self.engine, self.state, self.before, self.step = engine, state, before, step
        self.budget = state.options.memory_budget
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.key = round_key("measured", self.rank)
        self.clock = _Clock()
        self.recorder = JobRecorder(memory=self.budget is not None)
        self.start_bytes = None

    def start(self) -> None:
        from pipesplit.ir_utils.measure import MemoryStats

        if self.budget is not None:
            self.start_bytes = MemoryStats().settled_current()
        self.recorder.start()
        self.clock.lap("profiler_start_s")
        self.clock.lap("wait_before_step_s", self.state.transport.rendezvous(
            f"{self.key}/step", f"the measured training step {self.step}", self.rank,
            self.world))

    def stop(self) -> None:
        """The profiler off (a failed step's too)."""
        self.recorder.stop()

    def replan(self) -> None:
        self.stop()
        self.clock.lap("step_s")
        everyone = self.state.transport.share(self._measured(), self.key)
        self.clock.lap("exchange_s")
        costs, limit, model = self._priced(everyone)
        after = replan(self.state, self.engine, costs, self.step, memory_limit=limit)
        self.clock.lap("replan_s")
        self.clock.lap("wait_after_replan_s", self.state.transport.rendezvous(
            f"{self.key}/replanned", f"training step {self.step + 1}, the first on the new "
            "plan", self.rank, self.world))
        memory = None if model is None else {
            "budget_bytes": self.budget, "memory_limit": limit, "model": model.to_dict(),
            "predicted_peak_bytes": [int(b) for b in model.peaks(after.schedule, costs)]}
        self.state.replanned = replace(self.state.replanned, timings=self.clock.laps,
                                       memory=memory)
        print(f"pipesplit: rank {self.rank} measured training step {self.step} and re-planned: "
              + ", ".join(f"{k} {v:.2f}" for k, v in self.clock.laps.items()),
              file=sys.stderr, flush=True)

    def _measured(self) -> dict:
        """This process's measurement: its jobs' times, under a budget its bytes."""
        from pipesplit.passes.measure.memory_budget import rank_memory
        from pipesplit.passes.measure.replan import rank_measurement

        config = self.before.config
        measurement = rank_measurement(self.recorder.jobs(), config)
        if self.budget is None:
            return measurement
        return dict(measurement, memory=dict(
            rank_memory(self.recorder.memory_levels(), self.start_bytes, config.pp_stage,
                        config.placement), budget=self.budget))

    def _priced(self, everyone):
        """(costs, memory limit, memory model) from every process's measurement."""
        from pipesplit.passes.measure.memory_budget import MemoryModel
        from pipesplit.passes.measure.replan import costs_from

        config = self.before.config
        costs = self.state.options.costs or costs_from(everyone, config.num_stages,
                                                       self.state.transport.comm_mode)
        if self.budget is None:
            return costs, None, None
        budgets = sorted({m["memory"]["budget"] for m in everyone})
        if len(budgets) > 1:  # (each would search under its own limit: the plans would differ)
            raise ValueError(f"use_memory_budget: every process must give the same budget; "
                             f"they gave {budgets} bytes")
        model = MemoryModel.from_measurements([m["memory"] for m in everyone], config.pp_degree)
        costs = model.costs(costs)
        limit = model.memory_limit(self.budget, config.schedule, config.pp_degree,
                                   config.vpp_degree, config.num_micro_batches, costs)
        return costs, limit, model


class _Clock:
    """Named laps of one measured re-plan (seconds); a wait measured elsewhere is counted as
    its own lap and taken out of the next."""

    def __init__(self):
        self.laps: Dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str, seconds: Optional[float] = None) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._last if seconds is None else seconds, 3)
        self._last = now if seconds is None else self._last + seconds

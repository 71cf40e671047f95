"""What pipesplit's stand-ins for Paddle's engine functions do.  Each ``hook(original)``
returns the function installed in place of Paddle's ``original``; which Paddle name each one
replaces, and the replacing itself, is :mod:`pipesplit.passes.engine.paddle_patches` (group
``"engine"``, enabled by :func:`pipesplit.passes.strategy.enable_strategy`).  Why each name is
wrapped: ``docs/engine.md``."""
from __future__ import annotations

import contextlib
import copy
import functools
import os
import time
from contextvars import ContextVar
from typing import Optional

from pipesplit.passes.transport.progress import failure_reason

from pipesplit.passes.engine.block_placement import (assign_placement, check_blocks_on_one_mesh,
                                                     parameters_read_elsewhere)
from pipesplit.passes.engine.loss_location import LOSS_MODES, hand_the_loss_on
from pipesplit.passes.engine.relay import relay_far_values
from pipesplit.passes.engine.sequence_parallel import check_sequence_parallel
from pipesplit.passes.engine.chunk_fill import fill_chunk_ids
from pipesplit.passes.engine.cpu_hooks import needed as cpu_support_needed
from pipesplit.passes.split.core import PipelinePlan
from pipesplit.passes.engine.engine_rank import is_engine_program
from pipesplit.passes.engine.door import DOOR
from pipesplit.passes.engine.state import HANDLE, EngineState, ModePlan, engine_state, state_of
from pipesplit.passes.engine.surgery import name_an_output, restore_user_placements
from pipesplit.passes.engine.replanning import engine_rank_plan, measured_replan
from pipesplit.passes.measure.memory_budget import MemoryBudgetError
from pipesplit.passes.engine.loader_checks import (check_batch, check_labels_are_class_ids,
                                                   check_loader, leading_dims)
from pipesplit.passes.split.pipeline import split_and_schedule
from pipesplit.passes.engine.open_state import open_engine_state
from pipesplit.passes.engine.strategy_config import config_from_strategy, record_pipe

#: the PipelinePlan the pass built last in this context (:func:`last_pipeline`)
_LAST_PIPELINE: ContextVar[Optional[PipelinePlan]] = ContextVar("pipesplit_last_pipeline",
                                                                default=None)
#: the stage meshes while Paddle's chunk completion runs (see :func:`stage_by_mesh`)
_COMPLETING_MESHES: ContextVar[Optional[list]] = ContextVar("pipesplit_completing_meshes",
                                                            default=None)
#: what the engine keeps ONE copy of for all modes (a prediction's specs have no labels, its
#: fetched value another name)
_SHARED_BY_MODES = ("_outside_dataloader", "_inputs_spec", "_labels_spec", "_inputs", "_labels",
                    "_orig_main_prog", "_orig_startup_prog", "_loss_names", "_losses")


def _single(x, what):
    if isinstance(x, (list, tuple)):
        if len(x) != 1:
            raise ValueError(f"{what}: expected one program, got {len(x)}")
        return x[0]
    return x


def pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy):
    """Drop-in for Paddle's ``pir_pass.pipeline_pass``: returns the ``core.Plan``.

    The engine's per-rank program (it carries Paddle's send_v2 / recv_v2) goes to
    :func:`pipesplit.passes.engine.engine_rank.build_engine_rank_plan`; a whole-model program
    (chunk id = global stage) to :func:`pipesplit.passes.split.pipeline.split_and_schedule`."""
    main = _single(dense_main_program, "dense_main_program")
    _single(dense_startup_program, "dense_startup_program")
    state = state_of(pipeline_strategy)
    if is_engine_program(main):
        if state is None:
            raise built_before_enable()
        config = config_from_strategy(pipeline_strategy)
        if config.pp_stage is None:
            raise ValueError("the engine's per-rank program needs pp_degree > 1 processes")
        built = engine_rank_plan(main, config, pipeline_strategy, state, built=state.checked)
    else:
        built = split_and_schedule(main, _single(dense_startup_program, ""),
                                   config_from_strategy(pipeline_strategy),
                                   built=None if state is None else state.checked)
    if state is not None:
        state.built = built
    _LAST_PIPELINE.set(built)
    return built.plan


def route_the_pipeline_pass(original):
    """``pipeline_pass`` (pir_pass's and the engine module's name): pipesplit's
    :func:`pipeline_pass` for an engine with a pipesplit state, and for any program while
    pipesplit is switched on; Paddle's own otherwise (an engine built while it was off)."""
    def routed(dense_main_program, dense_startup_program, pipeline_strategy):
        if state_of(pipeline_strategy) is None and not pipesplit_is_on():
            return original(dense_main_program, dense_startup_program, pipeline_strategy)
        return pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy)
    return routed


#: the schedule names Paddle 3.3.1's own engine serves (its ``pipeline_pass`` asserts them)
PADDLE_ENGINE_SCHEDULES = ("FThenB", "1F1B", "VPP")


def _is_pipesplit_schedule(name) -> bool:
    from pipesplit.job_list.registry import get_spec

    try:
        return isinstance(name, str) and get_spec(name) is not None
    except ValueError:
        return False


def name_a_schedule_paddle_lacks(original):
    """``pipeline_pass`` (pir_pass's and the engine module's name), from the import of
    :mod:`pipesplit.passes.strategy` on (group ``"schedule_names"``, innermost): Paddle's own
    engine asked for a schedule only pipesplit has (ZBV, ZBH1, auto ...) was built before
    :func:`~pipesplit.passes.strategy.enable_strategy` (or after ``disable_strategy()``).  Its
    ``train()`` (or first step) then stops with a ``ValueError`` saying to call
    ``enable_strategy()`` before ``dist.to_static``, where Paddle asserts ``pipeline scheduler
    only support FThenB, 1F1B and VPP now``; an ``enable_strategy()`` after that ``train()``
    would come too late for any hook of its own.  Every other call is Paddle's, unchanged."""
    def pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy):
        name = getattr(pipeline_strategy, "schedule_mode", None)
        if name not in PADDLE_ENGINE_SCHEDULES and state_of(pipeline_strategy) is None \
                and _is_pipesplit_schedule(name):
            raise built_before_enable(name)
        return original(dense_main_program, dense_startup_program, pipeline_strategy)
    return pipeline_pass


def pipesplit_is_on() -> bool:
    """Whether new engines are pipesplit's (:func:`~pipesplit.passes.strategy.enable_strategy`
    and not disabled since)."""
    return DOOR.is_enabled("engine")


def built_before_enable(paddle_lacks: Optional[str] = None) -> ValueError:
    """``paddle_lacks``: the schedule name Paddle's own engine was asked for and has not."""
    which = "" if paddle_lacks is None else \
        f" (or after disable_strategy()), so it is Paddle's own, and Paddle's engine has no " \
        f"schedule strategy.pipeline.schedule_mode={paddle_lacks!r} (only " \
        f"{', '.join(PADDLE_ENGINE_SCHEDULES)})"
    return ValueError(
        "this engine was built before pipesplit.passes.strategy.enable_strategy() was "
        f"called{which}: call enable_strategy() (and cpu_support.enable() on a CPU build) "
        "before dist.to_static, so the engine's strategy is checked and its stage meshes seen")


def served_state(engine) -> Optional[EngineState]:
    """The state of an engine pipesplit serves; None for Paddle's own engine (built while
    pipesplit was off), which Paddle serves.  A pipeline engine without a state while
    pipesplit is on was built before :func:`~pipesplit.passes.strategy.enable_strategy`
    (Paddle's engine would then meet pipesplit's pass halfway): refused."""
    state = engine_state(engine)
    if state is None and engine._strategy.pipeline.enable and pipesplit_is_on():
        raise built_before_enable()
    return state


def last_pipeline() -> Optional[PipelinePlan]:
    """The :class:`PipelinePlan` of the last call through the hook (for ``init_scope``)."""
    return _LAST_PIPELINE.get()


def engine_init(original):
    """``Engine.__init__``: check the pipeline strategy, fill in the fields Paddle derives
    (``pp_degree`` from the stage meshes, the gradient merge's ``k_steps``:
    :func:`~.open_state.fill_in_what_paddle_derives`) and keep the request, resolved once, in
    the engine's state (:func:`~.open_state.open_engine_state`).  ``schedule_mode`` keeps the
    user's name (Paddle is shown ``"VPP"`` only while it tests for it: :func:`shown_vpp`).
    The user's own strategy object is not touched (``DistModel`` hands the engine a deep
    copy)."""
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        pipeline = self._strategy.pipeline
        if pipeline.enable and not isinstance(getattr(pipeline, HANDLE, None), EngineState):
            state = open_engine_state(self)
            check_names_apart(state)
            self._acc_steps = pipeline.accumulate_steps  # (Paddle's __init__ read k_steps)
            setattr(pipeline, HANDLE, state)
            DOOR.hold("engine_routes", state)  # served while it lives
    return __init__


#: what Paddle 3.3.1's engine tests ``schedule_mode`` against (``== "VPP"``) to complete the
#: chunk ids, check them and fetch the loss from ``forward{vpp-1}``, all of which a pipesplit
#: schedule needs (docs/engine.md, "Why the engine is shown VPP")
PADDLE_VPP = "VPP"


@contextlib.contextmanager
def paddle_sees_vpp(pipeline_strategy):
    """``schedule_mode`` reads ``"VPP"`` inside, the user's name again after (also after an
    exception).  The one place pipesplit writes that field, and only around the engine
    functions that test it; pipesplit itself reads the schedule from the engine's state."""
    name = pipeline_strategy.schedule_mode
    pipeline_strategy.schedule_mode = PADDLE_VPP
    try:
        yield
    finally:
        pipeline_strategy.schedule_mode = name


def shown_vpp(original):
    """``Engine._parallel_pir`` (its chunk completion and chunk check) and ``Engine.run`` (its
    loss fetch from ``forward{vpp-1}``), innermost: Paddle's own code runs with
    ``schedule_mode == "VPP"`` (:func:`paddle_sees_vpp`) for an engine pipesplit serves, so
    those three steps serve every pipesplit schedule; every other reader of the engine's
    strategy (a trainer, a later hook, the user) sees the schedule the user named."""
    def shown(self, *args, **kwargs):
        if engine_state(self) is None:
            return original(self, *args, **kwargs)
        with paddle_sees_vpp(self._strategy.pipeline):
            return original(self, *args, **kwargs)
    return shown


def keep_the_name_generator(original):
    """``DistModel.__init__`` / ``train`` / ``eval`` / ``predict``: each ends in
    ``paddle.disable_static()``, which enters a fresh name generator, so the layers of a model
    built after it are named as the first model's (``linear_0.w_0`` again).  Paddle's engines
    keep parameters in one scope BY NAME: two such DistModels would share their parameters and
    both train wrong, silently.  The generator of the caller is kept on instead, as if the call
    had not switched modes (a script's own ``unique_name.guard`` is left as it is).  A call
    that raises (a refused setup) leaves dygraph mode on as it found it: Paddle would leave
    the static mode on, and the next model the script builds would crash the process."""
    @functools.wraps(original)
    def kept(*args, **kwargs):
        import paddle
        from paddle.base import unique_name

        before = unique_name.generator, unique_name.dygraph_parameter_name_checker
        dygraph = paddle.in_dynamic_mode()
        try:
            return original(*args, **kwargs)
        except Exception:
            if dygraph and not paddle.in_dynamic_mode():
                paddle.disable_static()
            raise
        finally:
            unique_name.switch(*before)
    return kept


def check_names_apart(state: EngineState) -> None:
    """Refuse a model whose parameters have the names of a live pipesplit engine's built in
    the same scope (Paddle's engines keep parameters in the scope by name): the two would share
    them and both train wrong.  (A model built after ``to_static`` under the same name
    generator cannot meet this: :func:`keep_the_name_generator`.)"""
    for other in DOOR.holders("engine_routes"):
        shared = sorted(state.parameter_names & other.parameter_names)
        if shared and other is not state and other.scope is state.scope:
            raise RuntimeError(
                f"dist.to_static: this model's parameters {shared[:3]}"
                f"{' ...' if len(shared) > 3 else ''} have the names of the parameters of a "
                f"DistModel built earlier in this process (schedule {other.requested!r}, "
                "still alive); Paddle's engines keep parameters in one scope by name, so both "
                "models would train wrong.  Delete the earlier DistModel first (del it), or "
                "build this model under its own names: with "
                "paddle.utils.unique_name.guard('model2_'): ... (layers, optimizer and "
                "dist.to_static)")


def cpu_support_first(original):
    """``DistModel.__init__``: under the launcher (``POD_NAME``) it runs ``fleet.init``, whose
    gloo groups fail on a CPU build (``Connection refused``) unless ``cpu_support`` skips it.
    The cpu group's wrapper of this name is outside this one and takes ``POD_NAME`` away, so
    ``POD_NAME`` seen here on a CPU build means ``cpu_support.enable()`` came too late."""
    def __init__(self, *args, **kwargs):
        if os.getenv("POD_NAME") and cpu_support_needed():
            raise RuntimeError(
                "on a CPU build of Paddle call pipesplit.passes.cpu_support.enable() before "
                "dist.to_static (DistModel's fleet.init fails on CPU without it)")
        original(self, *args, **kwargs)
    return __init__


def check_the_loader(original):
    """``DistModel.__init__``: the loader is checked (:mod:`pipesplit.passes.engine.loader_checks`)
    before the engine draws from it, on every rank alike; a strategy field of the wrong type
    is left to the strategy check, which names it."""
    def __init__(self, layer, loader, *args, **kwargs):
        strategy = kwargs.get("strategy", args[2] if len(args) > 2 else None)
        pipeline = getattr(strategy, "pipeline", None)
        steps = getattr(pipeline, "accumulate_steps", None)
        if getattr(pipeline, "enable", False) and type(steps) is int and steps > 0:
            check_loader(loader, steps)
        original(self, layer, loader, *args, **kwargs)
    return __init__


def check_each_batch(original):
    """``DistModel.__call__``: the batch a step is given holds as many samples as the mode's
    first step's (:func:`~pipesplit.passes.engine.loader_checks.check_batch`), checked on
    every rank alike before the step runs: a loader's short last batch is refused at the
    step that draws it, not at ``to_static`` (a trainer stopping at ``max_steps`` never draws
    it)."""
    def __call__(self, *args):
        state = served_state(self._engine)
        planned = None if state is None else state.modes.get(self._mode)
        if planned is not None:
            dims = leading_dims([t for a in args
                                 for t in (a if isinstance(a, (list, tuple)) else [a])])
            if planned.batch_dims is None:
                planned.batch_dims = dims
            engine = self._engine
            names = [spec.name for spec in _as_list(engine._inputs_spec)
                     + _as_list(engine._labels_spec)]
            check_batch(dims, planned.batch_dims, names, planned.steps, self._mode)
        return original(self, *args)
    return __call__


def note_a_sharded_loader(original):
    """``Engine._prepare_data_spec_from_dataloader``: called for a ``dist.shard_dataloader``
    only, whose feeds reach only the meshes it names (a plain loader feeds every rank)."""
    def _prepare_data_spec_from_dataloader(self, *args, **kwargs):
        state = engine_state(self)
        if state is not None:
            state.sharded_loader = True
        return original(self, *args, **kwargs)
    return _prepare_data_spec_from_dataloader


def keep_plan_per_mode(original):
    """``Engine._prepare_program(mode)``: the engine keeps ONE pipeline plan (the last mode
    prepared) and hands its executor a plan only when it initialises the parameters, so
    ``eval()`` after ``train()`` ran the training plan with the evaluation program's fetch.
    Each mode's plan is kept here (see :func:`switch_to_the_mode_plan`)."""
    def _prepare_program(self, mode, *args, **kwargs):
        state = served_state(self)
        if state is None:
            return original(self, mode, *args, **kwargs)
        if state.modes:  # another mode ran first: trace this one as written
            restore_user_placements(self, state.user_placements)
        specs = _as_list(self._inputs_spec) + _as_list(self._labels_spec)
        state.fed_meshes = ({spec.name: spec.mesh for spec in specs  # a shard_dataloader's
                             if getattr(spec, "mesh", None)}     # feeds and their meshes
                            if state.sharded_loader else {})
        state.built = None
        result = original(self, mode, *args, **kwargs)
        if self._job_plan is not None and state.built is not None:
            state.modes[mode] = ModePlan(state.built, {key: getattr(self, key)
                                                       for key in _SHARED_BY_MODES})
        return result
    return _prepare_program


def loss_on_the_last_stage(original):
    """``Engine.run``: a train or eval step returns its loss on the last pipeline stage's
    ranks, whatever the schedule's placement (:mod:`.loss_location`)."""
    def run(self, *args, **kwargs):
        logs = original(self, *args, **kwargs)
        mode = kwargs.get("mode") or self._mode
        state = served_state(self)
        if mode not in LOSS_MODES or state is None or state.pipe is None \
                or state.modes.get(mode) is None or state.checked is None:
            return logs
        import paddle.distributed as dist

        if dist.get_world_size() == 1:  # (every rank emulated in one process)
            return logs
        if state.loss_carrier is None:
            state.loss_carrier = state.transport.loss_carrier(dist.get_world_size(),
                                                              state.config.num_micro_batches)
        return hand_the_loss_on(logs, state.pipe, state.checked.placement, dist.get_rank(),
                                bool(self._strategy.return_numpy), carrier=state.loss_carrier)
    return run


def name_a_failed_step(original):
    """``Engine.run``: a step that fails (a peer's process ended, a gloo timeout) says which
    process, which step of which mode, and which comm job, micro-batch and peer it was in,
    as pipesplit's own multi-rank runner does; Paddle says only ``std::exception``."""
    def run(self, *args, **kwargs):
        mode = kwargs.get("mode") or self._mode
        state = served_state(self)
        planned = None if state is None else state.modes.get(mode)
        if planned is None:
            return original(self, *args, **kwargs)
        step = planned.steps
        planned.steps += 1
        if planned.progress is None:
            return original(self, *args, **kwargs)
        import paddle

        scope = paddle.static.global_scope()
        progress = planned.progress
        progress.start_step(scope, self._place)
        started = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        except MemoryBudgetError:
            raise  # the user's budget, refused at the re-plan: not a failed step
        except Exception as exc:
            raise RuntimeError(
                f"pipesplit: rank {paddle.distributed.get_rank()} failed in {mode} step {step} "
                f"after {time.monotonic() - started:.1f} s, {progress.where(scope)}: "
                f"{failure_reason(exc)}") from exc
    return run


def measure_and_replan(original):
    """``Engine.run``: the training step :func:`~.user_options.measured_step` names runs
    under Paddle's profiler; every process's job times become the costs all of them re-plan
    with (:mod:`pipesplit.passes.measure.replan`), once.  Under a memory budget the profiler
    also records the allocations, and the search keeps every rank within the budget
    (:mod:`pipesplit.passes.measure.memory_budget`)."""
    def run(self, *args, **kwargs):
        mode = kwargs.get("mode") or self._mode
        state = engine_state(self)
        if mode != "train" or state is None:
            return original(self, *args, **kwargs)
        step = state.train_steps
        state.train_steps += 1
        before = state.pipeline_of("train")
        from pipesplit.passes.measure.profile import ops_on_this_thread

        if state.measure_step is not None and step < state.measure_step:
            with ops_on_this_thread():  # (the interpreters the measured step runs)
                return original(self, *args, **kwargs)
        # (a whole-model program, every rank emulated in one process, is not re-planned)
        if step != state.measure_step or getattr(before, "source_program", None) is None:
            return original(self, *args, **kwargs)
        return measured_replan(self, state, before, step,
                               lambda: original(self, *args, **kwargs))
    return run


def whole_batch_spec(original):
    """``Engine.prepare`` for ``DistModel.predict()``: it hands the engine the inputs spec the
    engine already cut to micro-batches for training, which would be cut again (``Requires
    batch_size[2] to be divisible by k_steps[4]``): given back whole."""
    def prepare(self, inputs_spec=None, *args, mode=None, **kwargs):
        state = engine_state(self)
        if state is None:
            return original(self, inputs_spec, *args, mode=mode, **kwargs)
        steps = getattr(self, "_acc_steps", 1)
        if mode == "predict" and steps > 1 and inputs_spec is not None \
                and _same_specs(inputs_spec, self._inputs_spec):
            inputs_spec = copy.deepcopy(inputs_spec)
            for spec in inputs_spec if isinstance(inputs_spec, (list, tuple)) else [inputs_spec]:
                spec.shape = [spec.shape[0] * steps] + list(spec.shape[1:])
        outside = self._outside_dataloader
        result = original(self, inputs_spec, *args, mode=mode, **kwargs)
        if mode == "predict" and self._in_pir_mode and "predict" in state.modes:
            # a spec (not a loader) marks the data "outside", which sends every later run to
            # the legacy reader set-up, absent in PIR mode (KeyError 'predict')
            self._outside_dataloader = outside
            state.modes["predict"].engine_fields["_outside_dataloader"] = outside
        return result
    return prepare


def _as_list(specs) -> list:
    if specs is None:
        return []
    return list(specs) if isinstance(specs, (list, tuple)) else [specs]


def _same_specs(a, b) -> bool:
    a, b = _as_list(a), _as_list(b)
    return len(a) == len(b) and all(x.name == y.name and list(x.shape) == list(y.shape)
                                    for x, y in zip(a, b))


def name_the_prediction(original):
    """``Engine._build("predict")``: in PIR mode the engine fetches its "loss" by a name the
    traced program gives it, which a prediction program (no loss) lacks (``IndexError`` in
    ``Engine.run``): the model's first output gets a name and is fetched instead, as
    ``DistModel.predict()`` documents (the outputs of the model)."""
    def _build(self, mode):
        result = original(self, mode)
        if mode == "predict" and self._in_pir_mode and engine_state(self) is not None \
                and not self._loss_names and self.program_helper.output_vars:
            self._loss_names = [name_an_output(self.program_helper.main_program,
                                               self.program_helper.output_vars[0])]
        return result
    return _build


def switch_to_the_mode_plan(original):
    """``Engine.to_mode`` (``DistModel.train()`` / ``eval()`` / ``predict()``): the executor, the
    loss fetch and the feed names use the plan and the data specs of the mode that runs,
    whichever mode was prepared last."""
    def to_mode(self, mode):
        state = served_state(self)
        original(self, mode)
        planned = None if state is None else state.modes.get(mode)
        if planned is not None:
            for key, value in planned.engine_fields.items():
                setattr(self, key, value)
            plan = planned.plan
            self._job_plan = plan
            if self._executor is not None and self._executor.plan is not plan:
                self._executor._set_plan(plan)
    return to_mode


def one_ring_per_group(original):
    """``Engine._init_comm``: before the engine makes its communicators, every process agrees
    on the ring id of every group it shares and renumbers its own groups and programs
    (:mod:`pipesplit.passes.transport.rings`: the stages of a pipeline make their groups in
    different orders, and communicators meet by ring id); then the communicators are made in
    ring-id order on every process, and Paddle's own loop finds them made."""
    def _init_comm(self):
        state = served_state(self)
        if state is None or self._nranks < 2:
            return original(self)
        from pipesplit.passes.transport.rings import agree_on_rings, instantiate_in_order

        agree_on_rings(_engine_programs(self, state), state.transport.share)
        instantiate_in_order()
        return original(self)
    return _init_comm


def _engine_programs(engine, state: EngineState) -> list:
    """Every program the engine holds (its modes' dense, dist and startup programs, and the
    jobs' programs of every plan): where a ring id can be."""
    programs = [program for table in (engine._pir_dense_main_progs, engine._pir_dist_main_progs,
                                      engine._pir_dist_startup_progs)
                for program in table.values()]
    plans = [engine._job_plan] + [planned.plan for planned in state.modes.values()]
    for plan in plans:
        if plan is not None:
            programs += [plan.ir_program(t) for t in plan.job_types()]
    unique = {id(p): p for p in programs}
    return list(unique.values())


def complete_chunk_id(original):
    """Paddle's chunk completion (the engine calls it while :func:`shown_vpp` shows it
    ``"VPP"``); nothing to do for one chunk per rank.  Blocks on stage meshes in model order
    are first given the meshes of the schedule's placement (:func:`assign_placement`, looped
    or V); meshes that already follow it (:func:`pipesplit.passes.engine.block_meshes`) are
    kept.  Paddle's completion then sets chunk = stage // pp, told each mesh's pipeline stage
    by its place among the stage meshes (:func:`stage_by_mesh`)."""
    def complete_chunk_id(dist_program, startup_program, pipeline_strategy):
        state = state_of(pipeline_strategy)
        if state is None:  # Paddle's own VPP
            return original(dist_program, startup_program, pipeline_strategy)
        state.pipe = record_pipe(dist_program, pipeline_strategy)
        check_labels_are_class_ids(dist_program)
        check_sequence_parallel(dist_program, state.request.vpp, cpu_build=cpu_support_needed())
        from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program

        meshes = get_sub_process_mesh_by_program(dist_program)
        completed = None
        if state.request.vpp >= 2:
            assign_placement(dist_program, pipeline_strategy, state)
            check_blocks_on_one_mesh(dist_program, pipeline_strategy.vpp_seg_method, state)
            token = _COMPLETING_MESHES.set(meshes)
            try:
                completed = original(dist_program, startup_program, pipeline_strategy)
            finally:
                _COMPLETING_MESHES.reset(token)
        relay_far_values(dist_program, meshes, state.request.placement, state.requested)
        state.shared_parameters = parameters_read_elsewhere(dist_program, meshes, state)
        return completed
    return complete_chunk_id


def stage_by_mesh(original):
    """``pir_pass.get_pp_stage_by_process_mesh(mesh, pp)``: while :func:`complete_chunk_id`
    runs, a mesh's stage is its index among the stage meshes; Paddle's own rule,
    rank // (world / pp), holds only when pp is the outermost mesh axis."""
    def get_pp_stage_by_process_mesh(mesh, pp):
        meshes = _COMPLETING_MESHES.get()
        if meshes is None:
            return original(mesh, pp)
        return meshes.index(mesh) if mesh in meshes else None
    return get_pp_stage_by_process_mesh


def check_chunk_id(original):
    """Paddle's chunk check needs chunk ids, which the engine sets only for vpp > 1; with one
    chunk per rank (no op has a chunk id) pipesplit gives every op chunk 0 itself
    (:func:`pipesplit.passes.engine.engine_rank.localize_chunks`).  Where Paddle's rule finds
    no chunk (a sharded gradient's reshard before the gradient merge), the op's data names it
    (:func:`~pipesplit.passes.engine.chunk_fill.fill_chunk_ids`)."""
    def check_chunk_id(dist_program):
        if not any(op.dist_attr is not None and op.dist_attr.chunk_id >= 0
                   for op in dist_program.global_block().ops):
            return None
        fill_chunk_ids(dist_program)
        return original(dist_program)
    return check_chunk_id

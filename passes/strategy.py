"""Route Paddle's auto-parallel pipeline step to pipesplit, so ``strategy.pipeline.schedule_mode``
can be any pipesplit schedule (ZBH1, ZBV, ZBVPP, DualPipeV, auto ...).

Paddle 3.3.1's engine (``auto_parallel/static/engine.py``) calls
``pipeline_pass([dense_program], [dense_program], self._strategy.pipeline)``, a function that
accepts only FThenB, 1F1B and VPP, and tests ``schedule_mode == "VPP"`` for its chunk
completion, its chunk check and the loss fetch.  :func:`enable_strategy`:

* replaces ``pipeline_pass`` in ``pir_pass`` and in the engine (which imported the name);
* wraps ``Engine.__init__``: the strategy is checked (a schedule that cannot serve it is a
  ``ValueError`` naming the field), the requested name is kept beside the engine's copy of the
  strategy and the engine sees ``"VPP"`` (the user's strategy object is a different copy);
* wraps the engine's ``complete_chunk_id`` (nothing to do with one chunk per rank) and
  ``check_chunk_id`` (skipped when no op has a chunk id: pipesplit gives them chunk 0);
* routes Paddle's ``pipeline_scheduler_<NAME>`` passes to pipesplit (registration.enable).

:func:`disable_strategy` restores all of it.  The engine's per-rank program goes to
:mod:`pipesplit.passes.engine`; a whole-model program (chunk id = global stage) to
:mod:`pipesplit.passes.pipeline` (``pp_stage`` from this process's rank, or every rank emulated
in one process); zero its gradient accumulators with ``last_pipeline().init_scope(scope)``.
"""
from __future__ import annotations

from typing import Optional

from pipesplit.job_list.pipe import Pipe, pipe_of
from pipesplit.job_list.registry import get_spec

from ._paddle import require_supported_paddle
from .block_placement import FED_MESHES, assign_placement
from .config import PipelineConfig
from .core import PipelinePlan
from .engine import build_engine_rank_plan, is_engine_program
from .per_rank import resolve_device
from .pipeline import split_and_schedule
from .strategy_checks import check_engine_strategy
from . import registration

require_supported_paddle()

_PIR_PASS = "paddle.distributed.auto_parallel.static.pir_pass"
_ENGINE = "paddle.distributed.auto_parallel.static.engine"
#: the name the engine's own tests of ``schedule_mode == "VPP"`` (chunk completion, its chunk
#: check, the loss fetch from ``forward{vpp-1}``) must see while pipesplit serves the pipeline
_ENGINE_MODE = "VPP"
_REQUESTED = "_pipesplit_schedule"
_originals: dict = {}
_last: Optional[PipelinePlan] = None
_registration_was_enabled = False


def _modules():
    import importlib

    return [importlib.import_module(_PIR_PASS), importlib.import_module(_ENGINE)]


def _single(x, what):
    if isinstance(x, (list, tuple)):
        if len(x) != 1:
            raise ValueError(f"{what}: expected one program, got {len(x)}")
        return x[0]
    return x


_PIPE = "_pipesplit_pipe"


def record_pipe(dist_program, pipeline_strategy) -> Pipe:
    """This process's pipeline (:class:`~pipesplit.job_list.pipe.Pipe`) from the stage meshes of
    the engine's whole distributed program, kept beside the engine's strategy for its pipeline
    pass: stage meshes may have any shape (dp, mp, ... axes), and a peer is the process of the
    neighbouring stage at the same coordinate, never process +- 1."""
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program

    meshes = get_sub_process_mesh_by_program(dist_program)
    pp = int(pipeline_strategy.pp_degree)
    if len(meshes) != pp:
        raise ValueError(
            f"strategy.pipeline.pp_degree is {pp}, but the model's layers are placed on "
            f"{len(meshes)} stage mesh(es): " + ", ".join(
                f"{list(m.process_ids)} {list(m.dim_names)}" for m in meshes)
            + "; set pp_degree to the number of pipeline stage meshes")
    pipe = pipe_of([m.process_ids for m in meshes], dist.get_rank(), [m.shape for m in meshes])
    setattr(pipeline_strategy, _PIPE, pipe)
    return pipe


def pipe_from_strategy(pipeline_strategy) -> Pipe:
    """The pipeline :func:`record_pipe` found when the engine completed the program."""
    import paddle.distributed as dist

    pipe = getattr(pipeline_strategy, _PIPE, None)
    if pipe is not None:
        return pipe
    pp = int(pipeline_strategy.pp_degree)
    if dist.get_world_size() == pp:  # one process per stage
        return Pipe.single_process_per_stage(pp)
    raise ValueError("pipesplit did not see the engine's stage meshes (call "
                     "pipesplit.passes.strategy.enable_strategy() before dist.to_static)")


def _pp_stage(pipeline_strategy) -> Optional[int]:
    import paddle.distributed as dist

    pp = int(pipeline_strategy.pp_degree)
    if pp <= 1 or dist.get_world_size() <= 1:
        return None  # one process: emulate every rank
    if getattr(pipeline_strategy, _PIPE, None) is None:
        # a whole-model program outside the engine: Paddle's rule (pp the outermost mesh axis)
        from paddle.distributed.auto_parallel.static.utils import get_pp_stage_by_pp_degree
        return get_pp_stage_by_pp_degree(pp)
    return pipe_from_strategy(pipeline_strategy).rank_of(dist.get_rank())


def requested_schedule(pipeline_strategy) -> str:
    """The schedule the user asked for (the engine sees ``"VPP"`` while pipesplit serves)."""
    return str(getattr(pipeline_strategy, _REQUESTED, None) or pipeline_strategy.schedule_mode)


def config_from_strategy(pipeline_strategy, pp_stage="auto") -> PipelineConfig:
    """The :class:`PipelineConfig` for Paddle's ``Strategy().pipeline`` section."""
    pp = int(pipeline_strategy.pp_degree)
    attrs = dict(num_micro_batches=int(pipeline_strategy.accumulate_steps),
                 pp_degree=pp, vpp_degree=int(pipeline_strategy.vpp_degree),
                 split_backward=bool(pipeline_strategy.split_backward),
                 pp_stage=_pp_stage(pipeline_strategy) if pp_stage == "auto" else pp_stage)
    try:
        return PipelineConfig.from_attrs(requested_schedule(pipeline_strategy), attrs)
    except ValueError as e:
        raise ValueError(f"strategy.pipeline: {e}".replace("pass attr ", "")
                         .replace("num_micro_batches", "accumulate_steps (num_micro_batches)")
                         ) from None


def check_strategy(pipeline_strategy) -> PipelineConfig:
    """Refuse a pipeline strategy pipesplit cannot serve, before the engine builds anything:
    an unknown schedule name, or pp / vpp / micro-batches the schedule cannot serve
    (``ValueError`` naming the strategy field and the constraint)."""
    from .core import make_schedule

    config = config_from_strategy(pipeline_strategy, pp_stage=None)
    try:
        make_schedule(config)
    except ValueError as e:
        msg = str(e)
        for field in ("vpp", "pp", "m"):
            msg = msg.replace(f"{field} must", f"strategy.pipeline.{_FIELD[field]} must", 1)
        raise ValueError(f"strategy.pipeline.schedule_mode={config.schedule!r} cannot serve "
                         f"this strategy: {msg}") from None
    return config


_FIELD = {"vpp": "vpp_degree", "pp": "pp_degree", "m": "accumulate_steps"}


def pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy):
    """Drop-in for Paddle's ``pir_pass.pipeline_pass``: returns the ``core.Plan``.

    The engine's per-rank program (it carries Paddle's send_v2 / recv_v2) goes to
    :func:`pipesplit.passes.engine.build_engine_rank_plan`; a whole-model program (chunk id =
    global stage) to :func:`pipesplit.passes.pipeline.split_and_schedule`."""
    global _last
    main = _single(dense_main_program, "dense_main_program")
    _single(dense_startup_program, "dense_startup_program")
    engine_program = is_engine_program(main)
    if engine_program and getattr(pipeline_strategy, _REQUESTED, None) is None:
        raise ValueError(
            "this engine was built before pipesplit.passes.strategy.enable_strategy() was "
            "called: call enable_strategy() (and cpu_support.enable() on a CPU build) before "
            "dist.to_static, so the engine's strategy is checked and its stage meshes seen")
    config = config_from_strategy(pipeline_strategy)
    if engine_program:
        if config.pp_stage is None:
            raise ValueError("the engine's per-rank program needs pp_degree > 1 processes")
        backend = "gloo" if resolve_device("auto") == "cpu" else "nccl"
        _last = build_engine_rank_plan(main, config, backend, pipe_from_strategy(pipeline_strategy))
    else:
        _last = split_and_schedule(main, _single(dense_startup_program, ""), config)
    return _last.plan


def last_pipeline() -> Optional[PipelinePlan]:
    """The :class:`PipelinePlan` of the last call through the hook (for ``init_scope``)."""
    return _last


def _check_no_gradient_merge(strategy) -> None:
    """The pipeline already accumulates ``accumulate_steps`` micro-batches per update (the
    engine turns its gradient merge on for that itself); a user's merge on top would need two
    nested accumulations, which Paddle 3.3.1's engine fails on."""
    merge = getattr(strategy, "gradient_merge", None)
    if merge is not None and merge.enable:
        total = int(strategy.pipeline.accumulate_steps) * int(merge.k_steps)
        raise ValueError(
            f"strategy.gradient_merge.enable with strategy.pipeline.enable: a pipeline step "
            f"already accumulates strategy.pipeline.accumulate_steps="
            f"{strategy.pipeline.accumulate_steps} micro-batches before its one update; set "
            f"strategy.pipeline.accumulate_steps={total} (accumulate_steps x "
            f"gradient_merge.k_steps) with a batch that many micro-batches long, and "
            f"strategy.gradient_merge.enable = False")


def _engine_init(original):
    """``Engine.__init__``: check the pipeline strategy, keep the user's schedule name beside
    the engine's copy and show the engine ``"VPP"``, so its chunk completion, chunk check and
    loss fetch (``forward{vpp-1}``) serve every pipesplit schedule.  The user's own strategy
    object is not touched (``DistModel`` hands the engine a deep copy)."""
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.__dict__[_USER_PLACEMENTS] = _placements_of(self._model)
        pipeline = self._strategy.pipeline
        if pipeline.enable and getattr(pipeline, _REQUESTED, None) is None:
            import paddle.distributed as dist

            check_engine_strategy(pipeline, self._model, dist.get_world_size())
            _check_no_gradient_merge(self._strategy)
            check_strategy(pipeline)
            setattr(pipeline, _REQUESTED, str(pipeline.schedule_mode))
            pipeline.schedule_mode = _ENGINE_MODE
    return __init__


_PLANS = "_pipesplit_plans"
_SHARDED_LOADER = "_pipesplit_sharded_loader"


def _note_a_sharded_loader(original):
    """``Engine._prepare_data_spec_from_dataloader``: called for a ``dist.shard_dataloader``
    only, whose feeds reach only the meshes it names (a plain loader feeds every rank)."""
    def _prepare_data_spec_from_dataloader(self, *args, **kwargs):
        self.__dict__[_SHARDED_LOADER] = True
        return original(self, *args, **kwargs)
    return _prepare_data_spec_from_dataloader
_USER_PLACEMENTS = "_pipesplit_user_placements"


def _placements_of(model) -> dict:
    """The user's (mesh, placements) of each distributed parameter of ``model``."""
    if model is None or not hasattr(model, "parameters"):
        return {}
    return {p.name: _placement_key(p) for p in model.parameters() if p.is_dist()}


def _placement_key(param):
    """A copy (the tensor's own mesh object changes when its data moves)."""
    mesh = param.process_mesh
    return ((tuple(mesh.shape), tuple(mesh.process_ids), tuple(mesh.dim_names)),
            tuple(str(p) for p in param.placements), list(param.placements))


def _restore_user_placements(engine) -> None:
    """Give the dygraph parameters back the user's meshes and placements (without data).

    Preparing the first mode moves a parameter whose block the schedule's placement puts on
    another mesh (its values live there now, in the scope); tracing the next mode
    (``eval()``, ``predict()``) with the moved parameters would contradict the model's own
    ``dist.reshard`` calls.  The next mode is traced as the user wrote it and placed again."""
    import numpy as np
    import paddle
    from paddle.distributed.auto_parallel.api import dtensor_from_local

    for param in engine._model.parameters():
        user = engine.__dict__.get(_USER_PLACEMENTS, {}).get(param.name)
        if user is None or not param.is_dist() or _placement_key(param)[:2] == user[:2]:
            continue
        (shape, ids, names), _, placements = user
        mesh = paddle.distributed.ProcessMesh(np.array(ids).reshape(shape).tolist(), list(names))
        with paddle.base.dygraph.guard():
            local = list(param.shape)  # the holder's global shape must be the parameter's
            for axis, placement in enumerate(placements):
                if placement.is_shard():
                    local[placement.get_dim()] //= mesh.shape[axis]
            holder = dtensor_from_local(paddle.zeros(local, param.dtype), mesh, placements)
        param.get_tensor()._share_data_with(holder.get_tensor())
        param.get_tensor()._clear()


def _keep_plan_per_mode(original):
    """``Engine._prepare_program(mode)``: the engine keeps ONE pipeline plan (the last mode
    prepared) and hands its executor a plan only when it initialises the parameters, so
    ``eval()`` after ``train()`` ran the training plan with the evaluation program's fetch.
    Each mode's plan is kept here (see :func:`_switch_to_the_mode_plan`)."""
    def _prepare_program(self, mode, *args, **kwargs):
        if self.__dict__.get(_PLANS):  # another mode ran first: trace this one as written
            _restore_user_placements(self)
        specs = _as_list(self._inputs_spec) + _as_list(self._labels_spec)
        setattr(self._strategy.pipeline, FED_MESHES,  # a shard_dataloader's feeds and meshes
                {spec.name: spec.mesh for spec in specs if getattr(spec, "mesh", None)}
                if self.__dict__.get(_SHARDED_LOADER) else {})
        result = original(self, mode, *args, **kwargs)
        if self._job_plan is not None and self._strategy.pipeline.enable:
            self.__dict__.setdefault(_PLANS, {})[mode] = self._job_plan
            self.__dict__.setdefault(_MODE_STATE, {})[mode] = {
                key: getattr(self, key) for key in _SHARED_BY_MODES}
        return result
    return _prepare_program


def _whole_batch_spec(original):
    """``Engine.prepare`` for ``DistModel.predict()``: it hands the engine the inputs spec the
    engine already cut to micro-batches for training, which would be cut again (``Requires
    batch_size[2] to be divisible by k_steps[4]``): given back whole."""
    import copy

    def prepare(self, inputs_spec=None, *args, mode=None, **kwargs):
        steps = getattr(self, "_acc_steps", 1)
        if mode == "predict" and steps > 1 and inputs_spec is not None \
                and self._strategy.pipeline.enable and _same_specs(inputs_spec, self._inputs_spec):
            inputs_spec = copy.deepcopy(inputs_spec)
            for spec in inputs_spec if isinstance(inputs_spec, (list, tuple)) else [inputs_spec]:
                spec.shape = [spec.shape[0] * steps] + list(spec.shape[1:])
        outside = self._outside_dataloader
        result = original(self, inputs_spec, *args, mode=mode, **kwargs)
        if mode == "predict" and self._in_pir_mode and self._strategy.pipeline.enable:
            # a spec (not a loader) marks the data "outside", which sends every later run to
            # the legacy reader set-up, absent in PIR mode (KeyError 'predict')
            self._outside_dataloader = outside
            self.__dict__.setdefault(_MODE_STATE, {})["predict"]["_outside_dataloader"] = outside
        return result
    return prepare


#: what the engine keeps ONE copy of for all modes (a prediction's specs have no labels, its
#: fetched value another name)
_SHARED_BY_MODES = ("_outside_dataloader", "_inputs_spec", "_labels_spec", "_inputs", "_labels",
                    "_orig_main_prog", "_orig_startup_prog", "_loss_names", "_losses")
_MODE_STATE = "_pipesplit_mode_state"


def _as_list(specs) -> list:
    if specs is None:
        return []
    return list(specs) if isinstance(specs, (list, tuple)) else [specs]


def _same_specs(a, b) -> bool:
    a, b = _as_list(a), _as_list(b)
    return len(a) == len(b) and all(x.name == y.name and list(x.shape) == list(y.shape)
                                    for x, y in zip(a, b))


def _name_the_prediction(original):
    """``Engine._build("predict")``: in PIR mode the engine fetches its "loss" by a name the
    traced program gives it, which a prediction program (no loss) lacks (``IndexError`` in
    ``Engine.run``): the model's first output gets a name and is fetched instead, as
    ``DistModel.predict()`` documents (the outputs of the model)."""
    def _build(self, mode):
        result = original(self, mode)
        if mode == "predict" and self._in_pir_mode and self._strategy.pipeline.enable \
                and not self._loss_names and self.program_helper.output_vars:
            import paddle

            program = self.program_helper.main_program
            name = paddle.utils.unique_name.generate("prediction")
            with paddle.static.program_guard(program):
                paddle.pir.set_insertion_point_to_block_end(program.global_block())
                paddle._C_ops.set_persistable_value(self.program_helper.output_vars[0], name)
            self._loss_names = [name]
        return result
    return _build


def _switch_to_the_mode_plan(original):
    """``Engine.to_mode`` (``DistModel.train()`` / ``eval()`` / ``predict()``): the executor, the
    loss fetch and the feed names use the plan and the data specs of the mode that runs,
    whichever mode was prepared last."""
    def to_mode(self, mode):
        original(self, mode)
        for key, value in self.__dict__.get(_MODE_STATE, {}).get(mode, {}).items():
            setattr(self, key, value)
        plan = self.__dict__.get(_PLANS, {}).get(mode)
        if plan is not None:
            self._job_plan = plan
            if self._executor is not None and self._executor.plan is not plan:
                self._executor._set_plan(plan)
    return to_mode


def _complete_chunk_id(original):
    """Paddle's chunk completion, asked with ``schedule_mode="VPP"``; nothing to do for one
    chunk per rank.  Blocks on stage meshes in model order are first given the meshes of the
    schedule's placement (:func:`assign_placement`, looped or V); meshes that already follow
    it (:func:`pipesplit.passes.engine.block_meshes`) are kept.  Paddle's completion then sets
    chunk = stage // pp, told each mesh's pipeline stage by its place among the stage meshes
    (its own rule, rank // (world / pp), holds only when pp is the outermost mesh axis)."""
    def complete_chunk_id(dist_program, startup_program, pipeline_strategy):
        if not pipeline_strategy.enable:
            return None
        record_pipe(dist_program, pipeline_strategy)
        if int(pipeline_strategy.vpp_degree) < 2:
            return None
        from paddle.distributed.auto_parallel.static import pir_pass
        from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program

        meshes = get_sub_process_mesh_by_program(dist_program)
        assign_placement(dist_program, pipeline_strategy,
                         get_spec(requested_schedule(pipeline_strategy)).placement)
        by_rank = pir_pass.get_pp_stage_by_process_mesh
        pir_pass.get_pp_stage_by_process_mesh = \
            lambda mesh, pp: meshes.index(mesh) if mesh in meshes else None
        try:
            return original(dist_program, startup_program, pipeline_strategy)
        finally:
            pir_pass.get_pp_stage_by_process_mesh = by_rank
    return complete_chunk_id


def _check_chunk_id(original):
    """Paddle's chunk check needs chunk ids, which the engine sets only for vpp > 1; with one
    chunk per rank (no op has a chunk id) pipesplit gives every op chunk 0 itself
    (:func:`pipesplit.passes.engine.localize_chunks`)."""
    def check_chunk_id(dist_program):
        if not any(op.dist_attr is not None and op.dist_attr.chunk_id >= 0
                   for op in dist_program.global_block().ops):
            return None
        return original(dist_program)
    return check_chunk_id


def enable_strategy() -> None:
    """Route ``pir_pass.pipeline_pass`` (and the engine's imported name) to pipesplit, and let
    the engine serve any pipesplit schedule name in ``strategy.pipeline.schedule_mode``."""
    global _registration_was_enabled
    if _originals:
        return
    _registration_was_enabled = registration.is_enabled()
    registration.enable()
    pir_pass, engine = _modules()
    for mod in (pir_pass, engine):
        _originals[(mod.__name__, "pipeline_pass")] = mod.pipeline_pass
        mod.pipeline_pass = pipeline_pass
    for name, wrap in (("complete_chunk_id", _complete_chunk_id),
                       ("check_chunk_id", _check_chunk_id)):
        _originals[(engine.__name__, name)] = getattr(engine, name)
        setattr(engine, name, wrap(getattr(engine, name)))
    for name, wrap in (("__init__", _engine_init), ("_prepare_program", _keep_plan_per_mode),
                       ("to_mode", _switch_to_the_mode_plan), ("prepare", _whole_batch_spec),
                       ("_build", _name_the_prediction),
                       ("_prepare_data_spec_from_dataloader", _note_a_sharded_loader)):
        _originals[("Engine", name)] = getattr(engine.Engine, name)
        setattr(engine.Engine, name, wrap(getattr(engine.Engine, name)))


def disable_strategy() -> None:
    """Give Paddle its own ``pipeline_pass``, chunk completion and engine back (and its pass
    names, unless they were routed to pipesplit before :func:`enable_strategy`)."""
    import importlib

    for (owner, name), fn in _originals.items():
        if owner == "Engine":
            setattr(importlib.import_module(_ENGINE).Engine, name, fn)
        else:
            setattr(importlib.import_module(owner), name, fn)
    _originals.clear()
    if not _registration_was_enabled:
        registration.disable()


def is_strategy_enabled() -> bool:
    return bool(_originals)

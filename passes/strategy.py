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
from pipesplit.job_list.placement import V_SHAPE
from pipesplit.job_list.registry import get_spec

from ._paddle import require_supported_paddle
from .config import PipelineConfig
from .core import PipelinePlan
from .engine import build_engine_rank_plan, is_engine_program
from .per_rank import resolve_device
from .pipeline import split_and_schedule
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
    config = config_from_strategy(pipeline_strategy)
    if is_engine_program(main):
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


def _engine_init(original):
    """``Engine.__init__``: check the pipeline strategy, keep the user's schedule name beside
    the engine's copy and show the engine ``"VPP"``, so its chunk completion, chunk check and
    loss fetch (``forward{vpp-1}``) serve every pipesplit schedule.  The user's own strategy
    object is not touched (``DistModel`` hands the engine a deep copy)."""
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        pipeline = self._strategy.pipeline
        if pipeline.enable and getattr(pipeline, _REQUESTED, None) is None:
            check_strategy(pipeline)
            setattr(pipeline, _REQUESTED, str(pipeline.schedule_mode))
            pipeline.schedule_mode = _ENGINE_MODE
    return __init__


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


def _stage_move(op) -> bool:
    """A ``dist_op.reshard`` that only moves a value to another mesh of the same shape with the
    same placements: a boundary between pipeline stages (any number of mesh axes)."""
    src, dst = op.operand_source(0).dist_attr(), op.result(0).dist_attr()
    if src is None or dst is None:
        return False
    return list(src.process_mesh.shape) == list(dst.process_mesh.shape) \
        and list(src.dims_mapping) == list(dst.dims_mapping) \
        and set(src.partial_dims) == set(dst.partial_dims) \
        and list(src.process_mesh.process_ids) != list(dst.process_mesh.process_ids)


def _drop_stage_reshards(dist_program) -> None:
    """Bypass (in place) every reshard between pipeline stages (:func:`_stage_move`): the
    user's ``dist.reshard`` between stages in model order."""
    for op in list(dist_program.global_block().ops):
        if op.name() == "dist_op.reshard" and _stage_move(op):
            op.result(0).replace_all_uses_with(op.operand_source(0))
            op.erase()


def _describe_stage_reshard(out, src_attr, src_mesh, dst_mesh, chunk: int, dst_attr) -> None:
    """Give a reshard made while blocks move the dist attributes Paddle's own ``dist.reshard``
    has (setting its consumer's mesh rewrote them): the value with its placements
    (``src_attr``: before its producer moved to ``src_mesh``) in, with ``dst_attr``'s placements
    on ``dst_mesh`` out; the op on ``src_mesh`` if both meshes are one, else on a flat mesh of
    both meshes' processes; in the consumer's chunk (on the V placement both sides of a
    boundary between ranks have the same chunk)."""
    import paddle
    from paddle.base.libpaddle.pir import create_op_dist_attribute, create_tensor_dist_attribute

    op_mesh = src_mesh if src_mesh == dst_mesh else paddle.distributed.ProcessMesh(
        list(src_mesh.process_ids) + list(dst_mesh.process_ids))
    out.get_defining_op().dist_attr = create_op_dist_attribute(
        op_mesh, [create_tensor_dist_attribute(src_mesh, list(src_attr.dims_mapping),
                                               dict(src_attr.partial_status))],
        [create_tensor_dist_attribute(dst_mesh, list(dst_attr.dims_mapping),
                                      dict(dst_attr.partial_status))], chunk)


def _blocks_in_model_order(ops, seg_method, meshes) -> bool:
    """True when the blocks' stage meshes never go back to an earlier stage (Paddle's rule for
    "place the blocks for me"), judged by the stage meshes' order, whatever their axes."""
    from paddle.distributed.auto_parallel.static.pir_pass import _extract_seg_method

    last = -1
    for op in ops:
        if op.dist_attr is None or _extract_seg_method(op, seg_method) is None:
            continue
        mesh = op.dist_attr.process_mesh
        if mesh in meshes:
            stage = meshes.index(mesh)
            if stage < last:
                return False
            last = stage
    return True


#: ops that keep their mesh: reshards (re-made where needed), parameters (they move with their
#: readers) and data (fed on the meshes the user's loader names)
_STAY = ("dist_op.reshard", "builtin.parameter", "pd_op.data")


def assign_placement(dist_program, pipeline_strategy, kind: str) -> bool:
    """Give the blocks (``vpp_seg_method``) of a model whose stage meshes are in model order
    (non-decreasing) the meshes of the ``kind`` placement (looped or V), in place: block i of
    L goes to virtual stage s = i * pp*vpp // L and its rank (looped: s = c*pp + r; V: the
    same for even chunks c, s = c*pp + pp-1-r for odd ones); ops before the first block go
    with it, ops after the last (final norm, head, loss) with the last; ops on a mesh of every
    stage (a mask or position ids each layer reads) stay there, each layer's reshard from them
    following the layer.  Paddle's ``complete_chunk_id`` then finds non-monotonic (custom)
    meshes, keeps them and sets chunk = s // pp.  Returns False (and changes nothing) when
    the meshes are not in model order (the user placed them)."""
    from paddle.distributed.auto_parallel.static.pir_pass import (
        _extract_seg_method, _get_seg_struct_names, _set_process_mesh_and_chunk_id)
    from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program
    import paddle
    from pipesplit.job_list.placement import Placement

    pp, vpp = int(pipeline_strategy.pp_degree), int(pipeline_strategy.vpp_degree)
    seg_method = pipeline_strategy.vpp_seg_method
    if not seg_method:
        raise ValueError("strategy.pipeline.vpp_seg_method must name the model's block class "
                         f"(vpp_degree={vpp})")
    ops = dist_program.global_block().ops
    meshes = get_sub_process_mesh_by_program(dist_program)
    if not _blocks_in_model_order(ops, seg_method, meshes):
        return False  # already placed by the user (e.g. pipesplit.passes.engine.block_meshes)
    segments = _get_seg_struct_names(ops, seg_method)
    stages = pp * vpp
    if len(segments) % stages:
        raise ValueError(f"strategy.pipeline: {len(segments)} {seg_method} blocks cannot be "
                         f"split evenly over pp_degree x vpp_degree = {stages} stages")
    placement = Placement(kind, pp, vpp)
    index = {name: i for i, name in enumerate(segments)}
    _drop_stage_reshards(dist_program)  # the model-order boundaries; new ones follow
    ops = dist_program.global_block().ops
    target = {}
    seg = 0
    for op in ops:
        name = _extract_seg_method(op, seg_method)
        if name is not None:
            seg = index[name]
        if op.dist_attr is None or op.name() in _STAY \
                or op.dist_attr.process_mesh not in meshes:
            continue  # (ops on the global mesh, e.g. a mask every stage reads, stay there)
        stage = seg * stages // len(segments)
        target[op.id()] = (meshes[placement.rank_of(stage)], stage // pp)
    # an activation crossing to another mesh gets a reshard (the engine's partition turns it
    # into p2p); a parameter moves with the op that reads it
    moved = {}
    for op in ops:
        if op.id() not in target:
            continue
        mesh, chunk = target[op.id()]
        for i, value in enumerate(op.operands_source()):
            producer = value.get_defining_op() if value.initialized() else None
            if producer is not None and producer.name() == "dist_op.reshard":
                _follow_reshard(op, i, producer, mesh, target, moved)
                continue
            if producer is None or producer.id() not in target \
                    or target[producer.id()][0] == mesh:
                continue
            key = (value.id, mesh.process_ids[0])
            if key not in moved:  # right after the producer: between the two blocks
                paddle.pir.set_insertion_point_after(producer)
                src_attr = value.dist_attr()
                out = paddle.distributed.reshard(value, mesh, src_attr.placements)
                out.get_defining_op().op_role = producer.op_role
                moved[key] = (out, src_attr, target[producer.id()][0], mesh, chunk, src_attr)
            op.operand(i).set_source(moved[key][0])
    for op in dist_program.global_block().ops:
        if op.id() in target:
            mesh, chunk = target[op.id()]
            _set_process_mesh_and_chunk_id(op, mesh, chunk, set_input_mesh=True,
                                           set_output_mesh=True)
    for out, src_attr, src, dst, chunk, dst_attr in moved.values():
        if src_attr is not None:  # (a reshard from a mesh that stays was made right)
            _describe_stage_reshard(out, src_attr, src, dst, chunk, dst_attr)
    for op in list(dist_program.global_block().ops):  # the user's reshards nobody reads now
        if op.name() == "dist_op.reshard" and op.result(0).use_empty():
            op.erase()
    paddle.pir.set_insertion_point_to_block_end(dist_program.global_block())
    return True


def _follow_reshard(op, index, reshard, mesh, target, moved) -> None:
    """``op`` (moving to ``mesh``) reads the result of a reshard the user wrote (a mask cut from
    a mesh of every stage, logits or labels made replicated ...): when the reshard's input or
    output mesh is no longer right, ``op`` reads its own reshard from the same input onto
    ``mesh`` with the same placements (the user's may be shared with ops that stay); one whose
    input moves too is described later (``moved``), as :func:`_describe_stage_reshard`."""
    import paddle

    source, result = reshard.operand_source(0), reshard.result(0)
    producer = source.get_defining_op() if source.initialized() else None
    moving = producer is not None and producer.id() in target
    src_mesh = target[producer.id()][0] if moving else source.dist_attr().process_mesh
    if result.dist_attr().process_mesh == mesh and src_mesh == source.dist_attr().process_mesh:
        return
    key = (source.id, mesh.process_ids[0], str(result.dist_attr().placements))
    if key not in moved:
        paddle.pir.set_insertion_point_after(reshard)
        src_attr = source.dist_attr()
        own = paddle.distributed.reshard(source, mesh, result.dist_attr().placements)
        own.get_defining_op().op_role = reshard.op_role
        moved[key] = (own, src_attr if moving else None, src_mesh, mesh, target[op.id()][1],
                      result.dist_attr())
    op.operand(index).set_source(moved[key][0])


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
    _originals[("Engine", "__init__")] = engine.Engine.__init__
    engine.Engine.__init__ = _engine_init(engine.Engine.__init__)


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

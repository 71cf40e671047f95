"""Blocks onto the meshes of a schedule's placement: PIR surgery on the engine's whole
distributed program, before its chunk completion.

:func:`block_meshes` gives a user the meshes to place the blocks on for a schedule themselves.
A user writes the model with its blocks on the stage meshes in model order (Paddle's VPP
documentation does); a schedule with vpp > 1 deals each stage mesh's blocks one by one to that
rank's chunks, as Paddle's chunk completion does (``Placement.deal_blocks``: the counts per rank
are kept, even or not), on the stages of the schedule's placement (looped or V).  :func:`assign_placement`
moves the ops, re-makes the reshards at the new boundaries and lets the values every layer reads
from a mesh of all stages (a mask, position ids) follow each layer.
"""
from __future__ import annotations

from typing import Sequence

from pipesplit.ir_utils.regions import inner_ops


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


def block_meshes(meshes: Sequence, num_blocks: int, schedule_mode: str, vpp_degree: int = 1
                 ) -> list:
    """The process mesh of each of ``num_blocks`` blocks (model order) for the schedule's
    placement: ``meshes[r]`` is pipeline rank r's mesh.  Block i goes to virtual stage
    ``Placement.stage_of_block(i, num_blocks)`` and that stage's rank (looped or V).  Use it to
    place the blocks, the head (the last block's mesh) and the labels, so one model code serves
    every schedule; with vpp = 1 and looped schedules it is the plain model-order split."""
    from pipesplit.job_list.placement import Placement, check_positive_int
    from pipesplit.job_list.registry import get_spec

    pp = len(meshes)
    check_positive_int("vpp_degree", vpp_degree)
    stages = pp * vpp_degree
    if num_blocks % stages:
        raise ValueError(f"num_blocks must be a multiple of pp x vpp_degree = {stages}, "
                         f"got {num_blocks}")
    placement = Placement(get_spec(schedule_mode).placement, pp, vpp_degree)
    return [meshes[placement.rank_of(placement.stage_of_block(i, num_blocks))]
            for i in range(num_blocks)]


#: ops that keep their mesh: reshards (re-made where needed), parameters (they move with their
#: readers) and data (placed apart: :func:`_place_feeds`)
_STAY = ("dist_op.reshard", "builtin.parameter", "pd_op.data")


def assign_placement(dist_program, state) -> bool:
    """Give the blocks (``vpp_seg_method``) of a model whose stage meshes are in model order
    (non-decreasing) the meshes of the placement of the engine's schedule (``state``: its
    :class:`~.state.EngineState`; looped or V), in place: each stage
    mesh keeps as many blocks as the user placed on it, dealt one by one to its chunks, and the
    blocks fill the virtual stages in model order (``Placement.stages_of_blocks``), each on its
    rank (looped: s = c*pp + r; V: the same for even chunks c, s = c*pp + pp-1-r for odd ones;
    an even split is block i of L on stage i * pp*vpp // L); ops before the first block go
    with it, ops after the last (final norm, head, loss) with the last; ops on a mesh of every
    stage (a mask or position ids each layer reads) stay there, each layer's reshard from them
    following the layer.  The session's chunk completion then sets every op's chunk
    (:mod:`.chunk_completion`: s // pp by the block's stretch).  Returns False (and changes nothing) when
    the meshes are not in model order (the user placed them)."""
    from paddle.distributed.auto_parallel.static.mix_to_dist_pass import dist_skip_op_list
    from paddle.distributed.auto_parallel.static.pir_pass import _set_process_mesh_and_chunk_id
    from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program
    import paddle

    seg_method = state.request.seg_method
    if not seg_method:
        raise ValueError("strategy.pipeline.vpp_seg_method must name the model's block class "
                         f"(vpp_degree={state.request.vpp})")
    hoist_layer_input_reshards(dist_program, seg_method)
    meshes = get_sub_process_mesh_by_program(dist_program)
    if not _blocks_in_model_order(dist_program.global_block().ops, seg_method, meshes):
        return False  # already placed by the user (e.g. pipesplit.passes.engine.block_meshes)
    target = _targets(dist_program, state, meshes)
    moved = _reshard_boundaries(dist_program, target, _block_starts(dist_program, seg_method))
    for op in dist_program.global_block().ops:
        if op.id() in target:
            mesh, chunk, _ = target[op.id()]
            # a control-flow op moves with its regions (Paddle's setter sees one op)
            for placed in (op, *inner_ops(op)):
                if placed.dist_attr is not None or placed.name() in dist_skip_op_list:
                    _set_process_mesh_and_chunk_id(placed, mesh, chunk, set_input_mesh=True,
                                                   set_output_mesh=True)
    for out, src_attr, src, dst, chunk, dst_attr, reader in moved.values():
        if src_attr is not None:  # (a reshard from a mesh that stays was made right)
            _describe_stage_reshard(out, src_attr, src, dst, chunk, dst_attr)

    # the user's reshards nobody reads now (last first: a chain goes whole)
    for op in reversed(list(dist_program.global_block().ops)):
        if op.name() == "dist_op.reshard" and op.result(0).use_empty():
            op.erase()
    paddle.pir.set_insertion_point_to_block_end(dist_program.global_block())
    return True


def hoist_layer_input_reshards(dist_program, seg_method) -> int:
    """Move each reshard a block makes *inside* itself of a value from outside it onto another
    mesh (the model library's attention takes the mask and the position ids from the global
    mesh there) to just before the block's first op, out of the block; returns how many.

    Paddle's chunk completion needs every op of a block on the block's mesh, and a moved block
    must be moved whole: after this the program is written as if the model had resharded the
    value before calling the block (Paddle's own Llama test does), which the placement serves
    (:func:`_follow_reshard`). Reshards within one mesh (placements only) stay in the block."""
    from paddle.distributed.auto_parallel.static.pir_pass import _extract_seg_method

    starts = _block_starts(dist_program, seg_method)
    hoisted = 0
    for op in list(dist_program.global_block().ops):
        if op.id() not in starts or op.name() != "dist_op.reshard" or not _changes_mesh(op):
            continue
        name = _extract_seg_method(op, seg_method)
        source = op.operand_source(0)
        producer = source.get_defining_op() if source.initialized() else None
        if producer is not None and _extract_seg_method(producer, seg_method) == name:
            continue  # (a value of the block itself: it stays inside)
        op.move_before(starts[op.id()])
        op.erase_attr("struct_name")
        hoisted += 1
    return hoisted


def check_blocks_on_one_mesh(dist_program, seg_method, state) -> None:
    """Every op of a block on the block's one mesh, as Paddle's chunk completion needs (it
    asserts "The segment's ops should have same process_mesh"): a ``ValueError`` naming the op,
    the block, the meshes and the values the op reads, before anything runs."""
    from paddle.distributed.auto_parallel.static.pir_pass import _extract_seg_method

    mesh_of = {}
    for op in dist_program.global_block().ops:
        name = _extract_seg_method(op, seg_method)
        if name is None or op.dist_attr is None:
            continue
        mesh = op.dist_attr.process_mesh
        first = mesh_of.setdefault(name, (mesh, op.name()))
        if first[0] != mesh:
            raise ValueError(
                f"strategy.pipeline.schedule_mode={state.requested!r} ({state.placement_kind} "
                f"placement): block {name!r} ({seg_method}) has its {first[1]} on mesh "
                f"{list(first[0].process_ids)} but a {op.name()} on mesh "
                f"{list(mesh.process_ids)}; the schedule moves a block whole, so all its ops "
                "must run on its mesh: do the work on another mesh outside the block (the "
                f"{op.name()} reads {_what_it_reads(op)})")


def _what_it_reads(op) -> str:
    """The values ``op`` reads, each as its producer and its mesh (a message's words)."""
    said = []
    for value in op.operands_source():
        producer = value.get_defining_op() if value.initialized() else None
        attr = value.dist_attr() if value.initialized() else None
        where = f" on mesh {list(attr.process_mesh.process_ids)}" if attr is not None else ""
        said.append(f"the result of {producer.name() if producer else 'a block argument'}{where}")
    return ", ".join(said) or "nothing"


def parameters_read_elsewhere(dist_program, meshes, state) -> tuple:
    """The parameters read on another stage through a reshard onto that stage's mesh (a tied
    embedding read by the head, as ``dist.parallelize`` or a model writes it), one
    :class:`~pipesplit.passes.engine.shared_parameters.SharedParameter` per (parameter, reading
    stage), sorted; readers on the owner's rank (a V placement brings the last stage back to
    the first's) need no transfer and are left out.  Each plan sends the weight once per step
    and returns its gradient once (:mod:`pipesplit.passes.engine.shared_parameters`)."""
    from pipesplit.passes.engine.shared_parameters import SharedParameter

    placement = state.request.placement
    ops = dist_program.global_block().ops
    chunk_of = None
    found = set()
    for op in ops:
        if op.name() != "dist_op.reshard" or not _changes_mesh(op):
            continue
        source = op.operand_source(0)
        producer = source.get_defining_op() if source.initialized() else None
        readers = op.result(0).all_used_ops()
        src, dst = source.dist_attr().process_mesh, op.result(0).dist_attr().process_mesh
        if producer is None or producer.name() != "builtin.parameter" or not readers \
                or src not in meshes or dst not in meshes:
            continue
        chunk_of = chunk_of or _chunks_in_program_order(ops)
        owners = [chunk_of[u.id()] for u in producer.result(0).all_used_ops() if u.id() != op.id()]
        owner = placement.stage(meshes.index(src), min(owners, default=0))
        reader = placement.stage(meshes.index(dst), min(chunk_of[u.id()] for u in readers))
        if placement.rank_of(reader) == placement.rank_of(owner):
            continue
        found.add(SharedParameter(producer.attrs()["parameter_name"],
                                  tuple(int(d) for d in source._local_shape),
                                  str(source.dtype), owner, reader,
                                  tuple(int(d) for d in op.result(0)._local_shape)))
    return tuple(sorted(found))


def _chunks_in_program_order(ops) -> dict:
    """op id -> its chunk; an op the completion left without one (-1: the head and the loss
    after the last block) is in the chunk of the op before it on its mesh (0 at the top)."""
    last, out = {}, {}
    for op in ops:
        mesh = op.dist_attr.process_mesh if op.dist_attr is not None else None
        given = op.dist_attr.chunk_id if op.dist_attr is not None else -1
        chunk = given if given >= 0 else last.get(mesh, 0)
        out[op.id()] = chunk
        last[mesh] = chunk
    return out


def _changes_mesh(reshard) -> bool:
    src, dst = reshard.operand_source(0).dist_attr(), reshard.result(0).dist_attr()
    return src is not None and dst is not None and src.process_mesh != dst.process_mesh


def _targets(dist_program, state, meshes) -> dict:
    """op id -> (mesh, chunk) of every op that moves with its block (the model-order stage
    reshards are dropped first: new boundaries follow)."""
    from paddle.distributed.auto_parallel.static.pir_pass import (_extract_seg_method,
                                                                  _get_seg_struct_names)
    placement = state.request.placement
    pp = placement.pp
    seg_method = state.request.seg_method
    segments = _get_seg_struct_names(dist_program.global_block().ops, seg_method)
    stage_of_block = block_stages(dist_program.global_block().ops, seg_method, placement, meshes)
    index = {name: i for i, name in enumerate(segments)}
    _drop_stage_reshards(dist_program)
    target = {}
    seg = 0
    for op in dist_program.global_block().ops:
        name = _extract_seg_method(op, seg_method)
        if name is not None:
            seg = index[name]
        if op.dist_attr is None or op.name() in _STAY \
                or op.dist_attr.process_mesh not in meshes:
            continue  # (ops on the global mesh, e.g. a mask every stage reads, stay there)
        stage = stage_of_block[seg]
        target[op.id()] = (meshes[placement.rank_of(stage)], stage // pp, stage)
    _place_feeds(dist_program, target, state.fed_meshes)
    return target


def block_stages(ops, seg_method, placement, meshes) -> list:
    """The virtual stage of each block (model order) under ``placement``: the blocks each
    stage mesh holds (:func:`blocks_per_stage_mesh`), dealt one by one to its chunks
    (``Placement.stages_of_blocks``)."""
    from paddle.distributed.auto_parallel.static.pir_pass import _get_seg_struct_names

    segments = _get_seg_struct_names(ops, seg_method)
    per_rank = blocks_per_stage_mesh(ops, seg_method, meshes)
    if sum(per_rank) != len(segments):
        raise ValueError(f"strategy.pipeline.vpp_seg_method={seg_method!r}: "
                         f"{len(segments) - sum(per_rank)} of the model's {len(segments)} blocks "
                         "are on no pipeline stage mesh; place each block's parameters on the "
                         "mesh of its stage")
    try:
        return placement.stages_of_blocks(per_rank)
    except ValueError as e:
        raise ValueError(f"strategy.pipeline.vpp_degree={placement.vpp}: the model's "
                         f"{seg_method} blocks on the stage meshes: {e}") from None


def blocks_per_stage_mesh(ops, seg_method, meshes) -> list:
    """How many blocks the user placed on each stage mesh (a block's mesh: its first op on
    a stage mesh), as Paddle's chunk completion counts them."""
    from paddle.distributed.auto_parallel.static.pir_pass import _extract_seg_method

    mesh_of = {}
    for op in ops:
        name = _extract_seg_method(op, seg_method)
        if name is not None and name not in mesh_of and op.dist_attr is not None \
                and op.dist_attr.process_mesh in meshes:
            mesh_of[name] = meshes.index(op.dist_attr.process_mesh)
    return [list(mesh_of.values()).count(r) for r in range(len(meshes))]


def _place_feeds(dist_program, target, fed_meshes) -> None:
    """A feed every rank is given (a plain ``DataLoader``) goes with its first reader; one a
    ``dist.shard_dataloader`` feeds on given meshes stays there (its readers elsewhere get it
    through the transfers :mod:`.relay` gives it)."""
    for op in dist_program.global_block().ops:
        if op.name() != "pd_op.data" or op.dist_attr is None \
                or op.attrs()["name"] in fed_meshes:
            continue
        readers = _readers_through_reshards(op, target)
        if readers:
            target[op.id()] = target[min(readers, key=_position(dist_program)).id()]


def _readers_through_reshards(op, target) -> list:
    """The moving ops that read ``op``'s result, directly or through the engine's reshards."""
    readers, todo = [], list(op.result(0).all_used_ops())
    while todo:
        user = todo.pop()
        if user.id() in target:
            readers.append(user)
        elif user.name().startswith("dist_op.") and user.num_results():
            todo.extend(user.result(0).all_used_ops())
    return readers


def _position(dist_program):
    index = {op.id(): i for i, op in enumerate(dist_program.global_block().ops)}
    return lambda op: index[op.id()]


def _block_starts(dist_program, seg_method) -> dict:
    """op id -> the first op of its block, for every op inside a block."""
    from paddle.distributed.auto_parallel.static.pir_pass import _extract_seg_method

    first, out = {}, {}
    for op in dist_program.global_block().ops:
        name = _extract_seg_method(op, seg_method)
        if name is not None:
            out[op.id()] = first.setdefault(name, op)
    return out


def _reshard_boundaries(dist_program, target, block_starts) -> dict:
    """A reshard (the engine's partition turns it into p2p) wherever a moved op reads a value
    from another mesh; the user's own reshards follow their readers.  Returns the reshards
    made: key -> (value, source attributes or None, source mesh, mesh, chunk, result attrs)."""
    import paddle

    moved = {}
    for op in dist_program.global_block().ops:
        if op.id() not in target:
            continue
        mesh, chunk, _ = target[op.id()]
        for i, value in enumerate(op.operands_source()):
            producer = value.get_defining_op() if value.initialized() else None
            if producer is not None and producer.name() == "dist_op.reshard":
                _follow_reshard(op, i, producer, mesh, target, moved, block_starts)
                continue
            feed = _feed_on_another_mesh(producer, mesh, target)
            if producer is None or (producer.id() not in target and not feed) \
                    or (not feed and target[producer.id()][0] == mesh):
                continue  # (a parameter moves with the op that reads it)
            key = (value.id, mesh.process_ids[0])
            if key not in moved:  # right after the producer: between the two blocks
                paddle.pir.set_insertion_point_after(producer)
                src_attr = value.dist_attr()
                if feed:  # sent from where its reader's stage begins (see _copy_of_feed)
                    value = _copy_of_feed(value, op)
                out = paddle.distributed.reshard(value, mesh, src_attr.placements)
                out.get_defining_op().op_role = producer.op_role
                src = src_attr.process_mesh if feed else target[producer.id()][0]
                moved[key] = (out, src_attr, src, mesh, chunk, src_attr, op.id() if feed else None)
            op.operand(i).set_source(moved[key][0])
    return moved


def _copy_of_feed(value, reader):
    """A copy of the feed ``value`` on its own mesh, placed right before ``reader``: the engine
    sends a value from its producer's chunk, and chunks follow program order (the data op
    itself sits at the top, in the first chunk); the copy is in the reader's."""
    import paddle

    paddle.pir.set_insertion_point(reader)
    copy = paddle.assign(value)
    copy.get_defining_op().op_role = reader.op_role
    return copy


def _feed_on_another_mesh(producer, mesh, target) -> bool:
    """``producer`` is a data op a ``dist.shard_dataloader`` feeds on its mesh (it stays:
    :func:`_place_feeds`), another stage's mesh than ``mesh``, where its reader now runs (the
    labels of a loss the V placement moved)."""
    if producer is None or producer.name() != "pd_op.data" or producer.dist_attr is None \
            or producer.id() in target:
        return False
    return producer.dist_attr.process_mesh != mesh


def _reshard_chain(reshard) -> list:
    """The reshards a value went through to become ``reshard``'s result, first to last: back
    through each placement change on the result's mesh (the library's attention re-cuts a mask
    on its stage mesh) up to the reshard that brought the value onto that mesh (the model's cut
    of a global-mesh mask onto the layer's stage mesh); just ``[reshard]`` when it changes mesh
    itself or reads a value made on its mesh."""
    chain = [reshard]
    mesh = reshard.result(0).dist_attr().process_mesh
    while not _changes_mesh(chain[0]):
        source = chain[0].operand_source(0)
        producer = source.get_defining_op() if source.initialized() else None
        if producer is None or producer.name() != "dist_op.reshard" \
                or producer.result(0).dist_attr().process_mesh != mesh:
            break
        chain.insert(0, producer)
    return chain


def _follow_reshard(op, index, reshard, mesh, target, moved, block_starts) -> None:
    """``op`` (moving to ``mesh``) reads the result of a reshard the user wrote (a mask cut from
    a mesh of every stage, logits or labels made replicated ...), or of a chain of them
    (:func:`_reshard_chain`): when the chain's input or output mesh is no longer right, ``op``
    reads its own chain re-derived from the same input onto ``mesh`` with the same placements
    hop by hop (the user's may be shared with ops that stay), so at most its first hop crosses
    meshes; one whose input moves too is described later (``moved``), as
    :func:`_describe_stage_reshard`.  Paddle's chunk completion counts a block's ops as one
    run of its name and any op on a stage mesh between two runs as a block of its own: a hop
    the user made inside ``op``'s block stays there (after ``reshard``), one that crosses
    meshes goes just before the block, and one on the block's mesh becomes the block's first
    op."""
    import paddle

    chain = _reshard_chain(reshard)
    source = chain[0].operand_source(0)
    producer = source.get_defining_op() if source.initialized() else None
    moving = producer is not None and producer.id() in target
    src_mesh = target[producer.id()][0] if moving else source.dist_attr().process_mesh
    if reshard.result(0).dist_attr().process_mesh == mesh \
            and src_mesh == source.dist_attr().process_mesh:
        return
    value, chunk = source, target[op.id()][1]
    start = block_starts.get(op.id())
    for hop in chain:
        result = hop.result(0)
        first = hop is chain[0]
        made_in_block, crosses = hop.id() in block_starts, first and src_mesh != mesh
        inside = start is not None and (made_in_block or not crosses)  # (op's block)
        key = (value.id, mesh.process_ids[0], str(result.dist_attr().placements),
               start.id() if inside else None)
        if key not in moved:
            if made_in_block or start is None:
                paddle.pir.set_insertion_point_after(reshard)
            else:
                paddle.pir.set_insertion_point(start)
            feed = crosses and _feed_on_another_mesh(producer, mesh, target)
            own = paddle.distributed.reshard(_copy_of_feed(value, op) if feed else value, mesh,
                                             result.dist_attr().placements)
            own.get_defining_op().op_role = hop.op_role
            named = start if inside and not made_in_block else hop
            if named.has_attr("struct_name"):
                own.get_defining_op().set_str_attr("struct_name", named.attrs()["struct_name"])
            described = first and (moving or feed)
            moved[key] = (own, value.dist_attr() if described else None,
                          src_mesh if first else mesh, mesh, chunk, result.dist_attr(),
                          op.id() if feed else None)
        value = moved[key][0]
    op.operand(index).set_source(value)

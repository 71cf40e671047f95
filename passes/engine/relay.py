"""Values handed from one stage to a later stage that is not the next: relayed stage by stage.

A schedule's transfers go between neighbouring virtual stages only (``send_forward`` of stage
s reaches stage s + 1).  A program can hand a value further: Paddle's own Llama test feeds its
labels on stage 1's mesh (``dist.shard_dataloader(..., meshes=[get_mesh(0), get_mesh(1)])``)
and its loss reads them on the last stage, so at pp 4 the engine's program would send them
from stage 1 straight to stage 3; a V placement brings the loss back to rank 0, past every
stage between the labels' mesh and it.  :func:`relay_far_values` rewrites each such
``dist_op.reshard`` of the whole distributed program (before the engine partitions it) into
a chain of reshards, one onto the mesh of every stage between, so the engine's partition makes
only neighbour ``send_v2`` / ``recv_v2`` pairs and every rank's program (the ranks between
too) carries its part: the value rides the forward transfers of each stage it passes, and a
value that needs a gradient gets its gradient back the same way (the backward of a reshard is
a reshard).

A value fed by a ``dist.shard_dataloader`` on a stage mesh (the data op stays there) is there
for every chunk of that rank, so it enters at the LAST stage on its rank before its reader:
one hop for the labels of a V placement at pp 2, and fewer stages to ride through than from
its first chunk.  A parameter read on another stage is not relayed: it crosses once per step
(:mod:`pipesplit.passes.engine.shared_parameters`).  A value that would have to travel from a
later stage to an earlier one in the forward cannot ride a pipeline and is a ``ValueError``
naming the value, both meshes and the schedule.
"""
from __future__ import annotations

from typing import Optional

#: ops whose value is a feed (a copy of one, made by the block placement, counts as one)
_FEED = "pd_op.data"
_COPY = "pd_op.assign"


def relay_far_values(dist_program, meshes, placement, schedule_mode: str) -> int:
    """Turn every cross-mesh ``dist_op.reshard`` whose value comes from an earlier stage than
    the one just before its reader into a chain through the stages between (in place, on the
    engine's whole distributed forward program, after chunk completion when vpp > 1).
    ``meshes``: the stage meshes, pipeline rank order; ``placement``: the schedule's.  Returns
    the number of hops made."""
    from pipesplit.passes.engine.block_placement import _changes_mesh, _chunks_in_program_order

    block = dist_program.global_block()
    ops = list(block.ops)
    chunk_of = _chunks_in_program_order(ops)
    hops = 0
    for reshard in ops:
        if reshard.name() != "dist_op.reshard" or not _changes_mesh(reshard):
            continue
        source = reshard.operand_source(0)
        src_mesh = source.dist_attr().process_mesh
        dst_mesh = reshard.result(0).dist_attr().process_mesh
        producer = source.get_defining_op() if source.initialized() else None
        readers = reshard.result(0).all_used_ops()
        if producer is None or producer.name() == "builtin.parameter" or not readers \
                or src_mesh not in meshes or dst_mesh not in meshes:
            continue
        reader = min(placement.stage(meshes.index(dst_mesh), chunk_of.get(u.id(), 0))
                     for u in readers)
        fed = _feed_of(producer)
        if fed is not None:
            start = _entry_stage(placement, meshes.index(src_mesh), reader)
            if start is None:
                raise ValueError(
                    f"strategy.pipeline.schedule_mode={schedule_mode!r}: "
                    f"{fed.attrs()['name']!r} is fed on stage mesh {list(src_mesh.process_ids)}"
                    f", but what reads it runs on stage mesh {list(dst_mesh.process_ids)} "
                    f"(stage {reader} of the {placement.kind} placement), before any stage "
                    "of the feeding mesh: a forward value travels to later stages only; give "
                    "dist.shard_dataloader the mesh of an earlier stage (the first stage's for "
                    "inputs, the last stage's for labels) or a plain DataLoader")
        else:
            start = placement.stage(meshes.index(src_mesh), chunk_of.get(producer.id(), 0))
            if start >= reader:
                continue  # (not a pipeline hand-off; the per-rank check names it)
        if reader - start <= 1:
            continue
        hops += _relay(reshard, source, fed is not None, start, reader, meshes, placement)
    return hops


def _feed_of(producer):
    """The data op behind ``producer`` (itself, or the one the block placement copied), or
    None for a computed value."""
    if producer.name() == _FEED:
        return producer
    if producer.name() == _COPY:
        inner = producer.operand_source(0)
        made = inner.get_defining_op() if inner.initialized() else None
        if made is not None and made.name() == _FEED:
            return made
    return None


def _entry_stage(placement, rank: int, reader: int) -> Optional[int]:
    """The last stage of pipeline rank ``rank`` before stage ``reader``, where a value fed on
    that rank's mesh starts its ride (None when the rank holds no earlier stage)."""
    earlier = [s for s in range(reader) if placement.rank_of(s) == rank]
    return max(earlier) if earlier else None


def _relay(reshard, source, fed: bool, start: int, reader: int, meshes, placement) -> int:
    """Reshards of ``source`` onto the mesh of every stage in (start, reader), each in that
    stage's chunk, made just before ``reshard``, which then reads the last of them.  With
    vpp > 1 a feed leaves from a copy in the chunk of the stage it starts from (the data op
    itself is in the first chunk)."""
    import paddle
    from paddle.distributed.auto_parallel.static.pir_pass import _set_process_mesh_and_chunk_id

    from pipesplit.passes.engine.block_placement import _describe_stage_reshard

    chunked = placement.vpp > 1  # (vpp = 1: the engine sets no chunk ids)
    chunk = (lambda s: placement.rank_chunk(s)[1]) if chunked else (lambda s: -1)
    paddle.pir.set_insertion_point(reshard)
    src_attr = source.dist_attr()
    value, mesh = source, src_attr.process_mesh
    if fed and chunked:
        producer = source.get_defining_op()
        if producer.name() != _COPY:
            value = paddle.assign(source)
            producer = value.get_defining_op()
            producer.op_role = reshard.op_role
        _set_process_mesh_and_chunk_id(producer, mesh, chunk(start), set_input_mesh=False,
                                       set_output_mesh=True)
    for stage in range(start + 1, reader):
        next_mesh = meshes[placement.rank_of(stage)]
        hop = paddle.distributed.reshard(value, next_mesh, _placements(src_attr))
        hop.get_defining_op().op_role = reshard.op_role
        _describe_stage_reshard(hop, src_attr, mesh, next_mesh, chunk(stage), src_attr)
        value, mesh = hop, next_mesh
    reshard.operand(0).set_source(value)
    result = reshard.result(0).dist_attr()
    _describe_stage_reshard(reshard.result(0), src_attr, mesh, result.process_mesh,
                            chunk(reader), result)
    paddle.pir.set_insertion_point_to_block_end(reshard.get_parent_block())
    return reader - start - 1


def _placements(dist_attr):
    """The placements of a tensor dist attribute (a stage move keeps them)."""
    from paddle.distributed.auto_parallel.placement_type import to_placements

    return to_placements(list(dist_attr.dims_mapping), dist_attr.process_mesh,
                         list(dist_attr.partial_dims))

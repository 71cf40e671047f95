"""Paddle's own chunk completion beside the session's, in a worker process: each time the
session completes the chunks of an engine's program (vpp >= 2), Paddle's 3.x
``pir_pass.complete_chunk_id`` runs on clones of the same programs, and every op's name,
chunk id and mesh, and the startup program, must come out the same (``compared_with_paddle``).

Paddle's completion is told each mesh's stage by its index among the stage meshes, as its own
rule (rank // (world / pp)) gives only when pp is the outermost mesh axis; that is the one
liberty taken with it.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace


def op_rows(program) -> list:
    """(name, chunk id, mesh's process ids, chunk_id attribute) of every op, regions too."""
    rows = []

    def walk(block):
        for op in block.ops:
            attr = op.dist_attr
            rows.append((op.name(), None if attr is None else attr.chunk_id,
                         None if attr is None else tuple(attr.process_mesh.process_ids),
                         op.attrs()["chunk_id"] if op.has_attr("chunk_id") else None))
            for inner in op.blocks():
                walk(inner)
    walk(program.global_block())
    return rows


@contextlib.contextmanager
def _stages_by_index(meshes):
    from paddle.distributed.auto_parallel.static import pir_pass

    original = pir_pass.get_pp_stage_by_process_mesh
    pir_pass.get_pp_stage_by_process_mesh = \
        lambda mesh, pp: meshes.index(mesh) if mesh in meshes else None
    try:
        yield
    finally:
        pir_pass.get_pp_stage_by_process_mesh = original


def paddles_completion(dist_program, startup_program, seg_method, placement, meshes):
    """Paddle's ``complete_chunk_id`` on clones of both programs; returns the clones."""
    from paddle.distributed.auto_parallel.static import pir_pass

    main, startup = dist_program.clone(), startup_program.clone()
    section = SimpleNamespace(enable=True, pp_degree=placement.pp, vpp_degree=placement.vpp,
                              vpp_seg_method=seg_method, schedule_mode="VPP")
    with _stages_by_index(meshes):
        pir_pass.complete_chunk_id(main, startup, section)
    return main, startup


@contextlib.contextmanager
def compared_with_paddle(out: Path, tag_of, rank: int):
    """While it lasts, every completion of the session is checked against Paddle's (an
    ``AssertionError`` naming the first op that differs) and the number of ops compared is
    written to ``out/<tag>.r<rank>.chunks`` (``tag_of()``: the configuration running)."""
    from pipesplit.passes.engine import session

    ours = session.complete_chunk_ids

    def checked(dist_program, startup_program, seg_method, placement, meshes):
        theirs, their_startup = paddles_completion(dist_program, startup_program, seg_method,
                                                   placement, meshes)
        ours(dist_program, startup_program, seg_method, placement, meshes)
        mine, paddle_s = op_rows(dist_program), op_rows(theirs)
        for index, (a, b) in enumerate(zip(mine, paddle_s)):
            assert a == b, f"{tag_of()}: op {index}: pipesplit {a}, Paddle {b}"
        assert len(mine) == len(paddle_s), (tag_of(), len(mine), len(paddle_s))
        assert str(startup_program) == str(their_startup), f"{tag_of()}: the startup programs"
        (out / f"{tag_of()}.r{rank}.chunks").write_text(str(len(mine)))

    session.complete_chunk_ids = checked
    try:
        yield
    finally:
        session.complete_chunk_ids = ours

"""Sequence parallel refused only where pipesplit cannot serve it
(:func:`pipesplit.passes.engine.sequence_parallel.check_sequence_parallel`): on real PIR dist
programs written as a sequence-parallel row-parallel layer writes them (the matmul's output
partial over ``mp``, then ``dist.reshard`` to a shard of the sequence), on stage meshes
``(dp, mp)`` of several shapes.  A partial over an axis of one process is no reduce-scatter
(Paddle's own 1F1B trains it on CPU: its Llama test at dp1 x mp1 x pp2 with ``use_sp``); over
two it is, and a CPU build has no kernel for it."""
from __future__ import annotations

import numpy as np
import paddle
import paddle.distributed as dist
import pytest

from pipesplit.passes.engine.sequence_parallel import check_sequence_parallel

REDUCE_SCATTER = ("sequence parallel (a dist.reshard of a partial value to a shard over mesh "
                  "dim 'mp': a reduce-scatter, on mesh {ids}) cannot be served here: a CPU "
                  "build of Paddle 3.3.1 has no reduce-scatter kernel")


def _sequence_parallel_layer(dp: int, mp: int, sequence_parallel: bool = True):
    """A row-parallel projection on a ``(dp, mp)`` stage mesh; its output (partial over mp)
    resharded along the sequence (``[Shard(0), Shard(1)]``, sequence parallel) or replicated
    (``[Shard(0), Replicate()]``, an all-reduce)."""
    program = paddle.pir.Program()
    with paddle.pir_utils.IrGuard(), paddle.static.program_guard(program):
        mesh = dist.ProcessMesh(np.arange(dp * mp).reshape(dp, mp).tolist(),
                                dim_names=["dp", "mp"])
        x = dist.shard_tensor(paddle.static.data("x", [4, 8, 16], "float32"), mesh,
                              [dist.Shard(0), dist.Shard(2)])
        w = dist.shard_tensor(paddle.static.create_parameter([16, 16], "float32", name="o"),
                              mesh, [dist.Replicate(), dist.Shard(0)])
        y = paddle.matmul(x, w)
        dist.reshard(y, mesh, [dist.Shard(0), dist.Shard(1) if sequence_parallel
                               else dist.Replicate()])
    reshards = [op for op in program.global_block().ops if op.name() == "dist_op.reshard"]
    assert len(reshards) == 1 and reshards[0].operand_source(0).dist_attr().partial_dims == {1}
    return program


@pytest.mark.parametrize("dp", [1, 2])
def test_a_partial_over_an_axis_of_one_process_passes_on_a_cpu_build(static_mode, dp):
    """mp = 1, also beside dp = 2 (the mesh has two processes, the mp axis one)."""
    check_sequence_parallel(_sequence_parallel_layer(dp, 1), vpp_degree=1, cpu_build=True)


@pytest.mark.parametrize("dp,ids", [(1, [0, 1]), (2, [0, 1, 2, 3])])
def test_a_reduce_scatter_over_two_processes_is_refused_on_a_cpu_build(static_mode, dp, ids):
    program = _sequence_parallel_layer(dp, 2)
    with pytest.raises(ValueError) as refused:
        check_sequence_parallel(program, vpp_degree=1, cpu_build=True)
    message = str(refused.value)
    assert message.startswith(REDUCE_SCATTER.format(ids=ids)), message
    assert message.endswith("train without sequence parallel (or with mesh dim 'mp' of size 1)")


def test_a_reduce_scatter_passes_on_a_gpu_build(static_mode):
    check_sequence_parallel(_sequence_parallel_layer(1, 2), vpp_degree=1, cpu_build=False)


def test_an_all_reduce_is_no_sequence_parallel(static_mode):
    check_sequence_parallel(_sequence_parallel_layer(1, 2, sequence_parallel=False),
                            vpp_degree=1, cpu_build=True)


@pytest.mark.parametrize("mp,cpu_build", [(1, True), (1, False), (2, False)])
def test_vpp_above_one_is_refused_whatever_the_axis(static_mode, mp, cpu_build):
    """Paddle's chunk completion cannot place the reshards of sequence parallel across chunks
    (its own VPP fails on its Llama test at mp 1 too), on any build."""
    with pytest.raises(ValueError) as refused:
        check_sequence_parallel(_sequence_parallel_layer(1, mp), vpp_degree=2,
                                cpu_build=cpu_build)
    message = str(refused.value)
    what = ": a reduce-scatter" if mp > 1 else " of size 1"
    assert message.startswith("sequence parallel (a dist.reshard of a partial value to a shard "
                              f"over mesh dim 'mp'{what}, on mesh "), message
    assert "strategy.pipeline.vpp_degree=2: Paddle's chunk completion cannot place its " \
           "reshards across chunks; train without sequence parallel or with " \
           "strategy.pipeline.vpp_degree = 1" in message, message

"""Hybrid parallelism through the engine: Paddle-style Llama on a global ``(dp, pp, mp)`` mesh.

The slow runs launch ``examples/llama_auto_parallel.py`` (RMSNorm, rotary embedding, attention,
SwiGLU MLP, column / row-parallel placements, the mask and position ids resharded onto every
layer's stage mesh, AdamW + ``ClipGradByGlobalNorm`` that does clip + ``LinearWarmup``) through
``dist.to_static`` on CPU, several configurations per launch, and compare every micro-batch
loss and every rank's parameters with the example's one-process dygraph reference.  Here: two
processes (pp 2); dp and mp beside the pipeline on four processes in
``test_hybrid_dp_mp.py``, the NCCL plans of eight in ``test_hybrid_nccl_plans.py`` (separate
modules: the test runner's workers take a module each).  The pure pieces of the CPU world-ring
transport are checked here without processes.
"""
from __future__ import annotations

import pytest

from pipesplit.job_list import build_schedule
from pipesplit.job_list.lower import lower_with_order

from _llama_grid import (ADAMW_TOL, EVERY_SCHEDULE, PP2, TIED, args, check_group,  # noqa: E402
                         launched, vpp_for_tied)


def _two_process_configs():
    """Every 2-process configuration, by the test that checks it (one launch runs them all)."""
    return {
        "schedules": [(name, args(PP2, name)) for name in EVERY_SCHEDULE]
        + [(f"{name}_sgd", args(PP2, name, "--optimizer", "sgd")) for name in ("1F1B", "ZBV", "VPP")]
        + [("paddle_1F1B", args(PP2, "1F1B", "--paddle", "--clip", "0")),
           ("1F1B_noclip", args(PP2, "1F1B", "--clip", "0"))],
        "library": [(f"library_{name}", args(PP2, name, "--style", "library"))
                    for name in EVERY_SCHEDULE],
        "tied": [(f"tied_{name}", args(PP2, name, *TIED, *vpp_for_tied(name)))
                 for name in ("1F1B", "ZBH1", "ZBV", "DualPipeV")]
        # a looped vpp 2 placement puts the head on stage 3, not the next stage
        + [("tied_VPP_vpp2", args(PP2, "VPP", *TIED))],
        "parallelize": [(f"parallelize_{name}", args(PP2, name, "--parallelize", "prefix"))
                        for name in EVERY_SCHEDULE]
        + [(f"parallelize_tied_{name}", args(PP2, name, "--parallelize", "points", *TIED,
                                              *vpp_for_tied(name)))
           for name in ("1F1B", "ZBH1", "VPP", "auto", "ZBV", "DualPipeV")]
        + [("parallelize_tied_VPP_vpp2", args(PP2, "VPP", "--parallelize", "points", *TIED))],
    }

@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    return launched(tmp_path_factory, "llama_pp2", _two_process_configs(), nproc=2)


@pytest.mark.slow
def test_every_schedule_trains_llama_on_2d_stage_meshes(two_processes):
    """pp = 2, stage meshes ``(dp=1, mp=1)`` as Paddle's own Llama test builds them; Paddle's
    own 1F1B (no clipping: it clips the sum of the micro-batch gradients) as a control."""
    check_group(two_processes, _two_process_configs()["schedules"], params=39)
    ours, paddles = two_processes["1F1B_noclip"]["losses"], two_processes["paddle_1F1B"]["losses"]
    assert max(abs(a - b) for x, y in zip(ours, paddles) for a, b in zip(x, y)) <= ADAMW_TOL


@pytest.mark.slow
def test_the_model_library_s_way_of_writing_llama_trains_with_every_schedule(two_processes):
    """Reshards inside each attention (of the mask and positions from the global mesh), rotary
    tables built there, recompute on the decoder layers: the V and looped placements move the
    layers whole, and the loss comes back on the last stage's ranks."""
    check_group(two_processes, _two_process_configs()["library"], params=39)


@pytest.mark.slow
def test_a_parameter_read_on_another_stage_crosses_once_per_step(two_processes):
    """The embedding the head reads through a reshard (a tied weight): sent once per step to
    the head's rank, its gradient summed there and returned once before the optimizer, for
    the next stage and for a looped vpp 2 placement's stage 3; nothing crosses under V."""
    check_group(two_processes, _two_process_configs()["tied"], params=39)


@pytest.mark.slow
def test_a_model_set_up_by_dist_parallelize_trains_with_every_schedule(two_processes):
    """Paddle's intermediate API: the plain model, ``dist.parallelize`` with ``pp_config``
    (the layer list's prefix, or explicit split points; the mask and positions from a
    ``global_spec`` layer), every schedule; the embedding tied to the head as ``parallelize``
    ties it (a reshard onto the last stage before the head) for the schedules that failed on
    it."""
    check_group(two_processes, _two_process_configs()["parallelize"], params=39)


# --------------------------------------------------------------------------- pure pieces

def test_optimizer_gathers_merge_into_one_order_with_each_send_beside_its_recv():
    from pipesplit.passes.transport.world_ring import merge_sequences

    g = ((1,), "float32")
    sequences = {0: [("group", None, g), ("recv", 1, g), ("recv", 1, g), ("send", 1, g)],
                 1: [("group", None, ((4, 4), "float32")), ("send", 0, g), ("send", 0, g),
                     ("recv", 0, g)]}
    merged = merge_sequences(sequences)
    assert merged == [(0, None, g), (1, None, ((4, 4), "float32")), (1, 0, g), (1, 0, g),
                      (0, 1, g)]


def test_unmatched_optimizer_exchanges_are_refused():
    from pipesplit.passes.transport.world_ring import merge_sequences

    g = ((1,), "float32")
    with pytest.raises(ValueError, match="cannot be put in one order"):
        merge_sequences({0: [("recv", 1, g)], 1: [("recv", 0, g)]})
    with pytest.raises(ValueError, match=r"sends \[1\] to rank 1, which receives \[2\]"):
        merge_sequences({0: [("send", 1, g)], 1: [("recv", 0, ((2,), "float32"))]})


@pytest.mark.parametrize("name,vpp,m", [("1F1B", 1, 4), ("ZBV", 2, 4), ("VPP", 2, 5),
                                        ("DualPipeV", 2, 6)])
def test_lockstep_order_is_the_gpu_order_plus_bystander_jobs(name, vpp, m):
    """Every rank's lockstep order, bystanders removed, is its lowered (GPU) order; every
    gathering job of another rank appears as a bystander job exactly once per micro-batch,
    except the peer's half of a send / recv pair (they share the gathers)."""
    from pipesplit.job_list.ir import BYSTANDER, parse_bystander_type
    from pipesplit.passes.transport.lockstep import lockstep_order

    pp = 3
    lowered, sequence = lower_with_order(build_schedule(name, pp, vpp, m))
    gathers = {r: {j.type: [((2,), "float32")] for j in jobs if j.kind != "optimizer"}
               for r, jobs in enumerate(lowered.ranks)}  # every job gathers (mp > 1)
    orders = [lockstep_order(sequence, lowered, r, gathers) for r in range(pp)]
    for r, order in enumerate(orders):
        own = [o for o in order if not o[0].startswith(BYSTANDER)]
        assert own == [(j.type, j.micro_batch) for j in lowered.ranks[r]
                       if j.kind != "optimizer"]
    # every global job is one slot on every rank (own, bystander, or the other half of a
    # send / recv pair): all ranks issue the same number of jobs that gather, in lockstep
    assert len({len(order) for order in orders}) == 1, [len(o) for o in orders]
    for r, order in enumerate(orders):
        for job_type, _ in order:
            if job_type.startswith(BYSTANDER):
                assert parse_bystander_type(job_type)[0] != r


# --------------------------------------------------------------------------- stage meshes

def _program_on(meshes):
    """A static program whose layers sit on ``meshes`` in turn (as the engine sees a model)."""
    import paddle
    import paddle.distributed as dist

    main = paddle.static.Program()
    with paddle.static.program_guard(main):
        x = paddle.static.data("x", [4, 8], "float32")
        for i, mesh in enumerate(meshes):
            replicated = [dist.Replicate()] * mesh.ndim
            w = dist.shard_tensor(paddle.ones([8, 8]), mesh, replicated)
            x = dist.reshard(x, mesh, replicated) if i else dist.shard_tensor(x, mesh, replicated)
            x = paddle.matmul(x, w)
    return main


def test_the_pipeline_of_a_process_comes_from_the_stage_meshes_coordinates(static_mode):
    from types import SimpleNamespace

    import paddle.distributed as dist
    from pipesplit.passes.strategy import record_pipe

    mesh = dist.ProcessMesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ["dp", "pp", "mp"])
    strategy = SimpleNamespace(pp_degree=2)
    program = _program_on([mesh.get_mesh_with_dim("pp", i) for i in range(2)])
    assert record_pipe(program, strategy).processes == (0, 2)  # this process is 0: dp0, mp0
    assert vars(strategy) == {"pp_degree": 2}  # (the engine's state keeps it, not the strategy)


@pytest.mark.parametrize("meshes,message", [
    ([[0, 1], [2]], r"stage meshes must all hold the same number of processes .*stage 1: \[2\]"),
    ([[0], [1], [2]], r"strategy.pipeline.pp_degree is 2, but the model's layers are placed on "
                      r"3 stage mesh\(es\)"),
])
def test_stage_meshes_pipesplit_cannot_serve_are_refused_before_anything_runs(
        static_mode, meshes, message):
    from types import SimpleNamespace

    import paddle.distributed as dist
    from pipesplit.passes.strategy import record_pipe

    program = _program_on([dist.ProcessMesh(ids, ["x"]) for ids in meshes])
    strategy = SimpleNamespace(pp_degree=2)
    with pytest.raises(ValueError, match=message):
        record_pipe(program, strategy)
    assert vars(strategy) == {"pp_degree": 2}

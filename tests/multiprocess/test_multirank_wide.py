"""More than two ranks on CPU: the world-ring transport (every transfer a broadcast on ring 0
in which all ranks take part; ranks that are neither end run a bystander job at the exchange's
place in the global order, see :func:`pipesplit.passes.transport.p2p.world_ring_comm`).

Fast tests check the per-rank plans in one process: without the bystander jobs a CPU rank's
job order is the GPU (NCCL) one, and every rank issues the same broadcasts (root, shape,
dtype) and all-reduces in the same order.  The ``slow`` ones launch real processes
(``test_multirank.py``'s worker: one launch per process count, every configuration in it)
and compare each run's losses and every parameter with the one-process emulation within 1e-6
(2 steps); they also check ``tools/train.py`` against ``pipesplit demo`` and the failure
reports (dead and hung rank) at pp=4.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from _multirank import (GRID_WORKER, STEPS, TOL, TRAIN, check_grid_results,  # noqa: E402
                        launch_script, rank_plans)


def _cfg(schedule, vpp, m, *extra):
    return ["--schedule", schedule, "--vpp", str(vpp), "-m", str(m), *extra]


GRIDS = {
    4: [_cfg("1F1B", 1, 4), _cfg("1F1B", 1, 6), _cfg("ZBH1", 1, 5), _cfg("VPP", 2, 4),
        _cfg("ZBV", 2, 8), _cfg("DualPipeV", 2, 6), _cfg("auto", 1, 8),
        # tied embedding (stage 0 and stage 7: ranks 0 and 3, not neighbours) and the
        # global-norm all-reduce over four ranks
        _cfg("VPP", 2, 4, "--clip-global-norm", "0.05", "--tied-embeddings")],
    3: [_cfg("1F1B", 1, 5), _cfg("ZBV", 2, 5)],
}


# --------------------------------------------------------------------------- fast (1 process)

def _collectives(plan):
    """(op, ring, root, shape, dtype) of every collective a rank issues in one step, in job
    order (a dimension only known at run time as -1: a shape broadcast precedes it)."""
    out = []
    for job_type, _ in plan.job_order:
        for op in plan.split.programs[job_type].global_block().ops:
            if op.name() in ("pd_op.broadcast_", "pd_op.all_reduce"):
                v = op.operand_source(0)
                root = int(op.attrs()["root"]) if op.name() == "pd_op.broadcast_" else None
                out.append((op.name(), int(op.attrs()["ring_id"]), root,
                            tuple(int(s) for s in v.shape), str(v.dtype)))
    return out


def _assert_same_collectives(sequences):
    """Every rank issues the same collectives in the same order: op, ring, root, dtype, rank
    of the shape, and each dimension that both sides know when the programs are built."""
    first = sequences[0]
    assert first
    for r, seq in enumerate(sequences[1:], 1):
        assert len(seq) == len(first), f"rank {r}: {len(seq)} collectives, rank 0: {len(first)}"
        for k, (a, b) in enumerate(zip(first, seq)):
            where = f"collective {k}: rank 0 {a}, rank {r} {b}"
            assert a[:3] == b[:3] and a[4] == b[4] and len(a[3]) == len(b[3]), where
            assert all(x == y for x, y in zip(a[3], b[3]) if x >= 0 and y >= 0), where


@pytest.mark.parametrize("schedule,pp,vpp,m", [
    ("1F1B", 4, 1, 4), pytest.param("ZBV", 4, 2, 8, marks=pytest.mark.slow),
    pytest.param("DualPipeV", 4, 2, 6, marks=pytest.mark.slow), ("1F1B", 3, 1, 5)])
def test_world_ring_orders_match_gpu_and_each_other(schedule, pp, vpp, m):
    _, cpu = rank_plans(schedule, pp, vpp, m)
    _, gpu = rank_plans(schedule, pp, vpp, m, device="gpu")
    pairs = {(r, peer) for r, g in enumerate(gpu)
             for t, _, peer in g.rank_info.comm_sequence if t.startswith("send")}
    for r, (c, g) in enumerate(zip(cpu, gpu)):
        by = c.rank_info.bystanders
        # a bystander job for each direction between two other ranks
        assert set(by.values()) == {p for p in pairs if r not in p}
        assert [job for job in c.job_order if job[0] not in by] == g.job_order
        assert [e for e in c.rank_info.comm_sequence if e[0] not in by] \
            == g.rank_info.comm_sequence
        for job_type, (src, dst) in by.items():
            assert r not in (src, dst)
            prog = c.split.programs[job_type]
            # a bystander hands nothing over
            assert not any(op.name() in ("builtin.shadow_output", "pd_op.set_persistable_value")
                           for op in prog.global_block().ops)
    _assert_same_collectives([_collectives(c) for c in cpu])
    # every exchange of the step is in every rank's comm sequence, as one comm job
    lengths = {len(c.rank_info.comm_sequence) for c in cpu}
    exchanges = sum(job.kind.startswith("send") for jobs in cpu[0].lowered.ranks for job in jobs)
    assert lengths == {exchanges}


def test_world_ring_clipping_and_tied_weights_reduce_on_every_rank():
    from pipesplit.job_list.request import PipelineConfig
    from pipesplit.passes.split.per_rank import build_rank_plan
    from pipesplit.tools.demo import build_model, make_parser

    args = make_parser().parse_args(_cfg("VPP", 2, 4, "--clip-global-norm", "0.05",
                                         "--tied-embeddings", "--pp", "4"))
    model = build_model(args)
    plans = [build_rank_plan(model.main, model.startup, PipelineConfig.from_attrs(
        "VPP", dict(num_micro_batches=4, pp_degree=4, vpp_degree=2, pp_stage=r)), device="cpu")
        for r in range(4)]
    assert [p.rank_info.num_all_reduces for p in plans] == [2] * 4
    _assert_same_collectives([_collectives(p) for p in plans])


def test_world_ring_comm_from_published_transfers():
    """What another rank publishes (name, shape, dtype, ends, stages) is enough to build the
    bystander program of its exchange: the engine path's ranks only see their own handoffs."""
    from pipesplit.passes.transport.p2p import Transfer, handoff_type, world_ring_comm

    _, plans = rank_plans("1F1B", 4, 1, 4)
    theirs = plans[1].rank_info.comm["send_forward0"].transfers
    rebuilt = [Transfer(t.name, handoff_type(t.shape, t.dtype), t.src, t.dst, t.src_stage,
                        t.dst_stage) for t in theirs]
    programs, roles = world_ring_comm([rebuilt, theirs], rank=3)
    assert roles == ["bystander_1_2", "bystander_1_2"] and list(programs) == ["bystander_1_2"]
    roots = [op.attrs()["root"] for op in programs["bystander_1_2"].global_block().ops
             if op.name() == "pd_op.broadcast_"]
    assert roots == [1] * (len(theirs) + sum(t.is_dynamic for t in theirs))
    with pytest.raises(ValueError, match="one send / recv pair"):
        world_ring_comm([theirs + plans[2].rank_info.comm["send_forward0"].transfers], rank=0)


def test_bystander_program_needs_transfers():
    from pipesplit.passes.transport.p2p import build_bystander_program

    with pytest.raises(ValueError, match="at least one transfer"):
        build_bystander_program([])


# --------------------------------------------------------------------------- slow (3, 4 processes)

def _check_grid(tmp_path, nproc):
    grid = GRIDS[nproc]
    spec = tmp_path / "grid.json"
    spec.write_text(json.dumps([cfg + STEPS for cfg in grid]))
    out = tmp_path / "out"
    out.mkdir()
    proc, logs = launch_script([GRID_WORKER, spec, out], tmp_path, timeout=600, nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + "".join(
        log[-2000:] for log in logs.values())
    check_grid_results(out, grid, pp=nproc)


@pytest.mark.slow
def test_four_ranks_match_emulation(tmp_path):
    _check_grid(tmp_path, 4)


@pytest.mark.slow
def test_three_ranks_match_emulation(tmp_path):
    _check_grid(tmp_path, 3)


@pytest.mark.slow
def test_train_launcher_matches_demo_with_four_ranks(tmp_path):
    from pipesplit.tools import demo

    argv = ["--schedule", "ZBV", "--vpp", "2", "-m", "8", "--steps", "2"]
    out = tmp_path / "out.json"
    proc, logs = launch_script([TRAIN] + argv + ["--json", out], tmp_path, nproc=4)
    assert proc.returncode == 0, proc.stdout[-3000:] + "".join(l[-2000:] for l in logs.values())
    rec = json.loads(out.read_text())
    assert rec["max_param_diff"] <= TOL and rec["world_size"] == 4
    ref = tmp_path / "demo.json"
    assert demo.main(argv + ["--pp", "4", "--json", str(ref)]) == 0
    ref = json.loads(ref.read_text())
    assert np.max(np.abs(np.array(rec["losses"]) - np.array(ref["losses"]))) <= TOL


@pytest.mark.slow
def test_dead_rank_is_reported_with_four_ranks(tmp_path):
    # rank 2 exits at the start of step 1; rank 0 is the root of step 1's first broadcast,
    # which rank 2 must join
    proc, logs = launch_script([TRAIN, "--schedule", "1F1B", "--vpp", "1", "-m", "4", "--steps", "3",
                          "--fail-at", "2:1", "--watchdog", "60"], tmp_path, timeout=120, nproc=4)
    assert proc.returncode != 0
    assert "rank 0 failed in step 1, waiting in send_forward0 micro-batch 0 with rank 1 " \
           "(comm job 1 of 24" in logs[0], logs[0][-2000:]


@pytest.mark.slow
def test_stuck_rank_is_reported_with_four_ranks(tmp_path):
    # rank 0 stops at the start of step 1: the first exchange of step 1 (rank 0 -> rank 1)
    # never starts; rank 1 waits in its recv, ranks 2 and 3 in their bystander jobs
    proc, logs = launch_script([TRAIN, "--schedule", "ZBV", "--vpp", "2", "-m", "8", "--steps", "3",
                          "--fail-at", "0:1:hang", "--watchdog", "5"], tmp_path, timeout=120,
                         nproc=4)
    assert proc.returncode != 0
    # the first watchdog to fire ends its process, whose closed connections then fail the
    # others' broadcasts: each rank reports either way, naming the same comm job
    waits = {1: "recv_forward0 micro-batch 0 with rank 0 (comm job 1 of 96",
             2: "bystander_0_1 micro-batch 0: the world-ring broadcast from rank 0 to rank 1 "
                "(comm job 1 of 96",
             3: "bystander_0_1 micro-batch 0: the world-ring broadcast from rank 0 to rank 1 "
                "(comm job 1 of 96"}
    for r, job in waits.items():
        assert re.search(rf"rank {r} (no progress for 5 s|failed) in step 1, waiting in "
                         + re.escape(job), logs[r]), logs[r][-2000:]
    assert any(f"rank {r} no progress for 5 s in step 1" in logs[r] for r in waits)

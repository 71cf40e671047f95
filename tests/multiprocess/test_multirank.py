"""Per-rank programs (pp_stage) and real multi-process runs on CPU (gloo, 2 ranks).

The fast tests check the per-rank programs in one process.  The ``slow`` ones launch two
processes with ``paddle.distributed.launch`` (the worker script is ``multirank_grid.py``)
and compare each run with the one-process emulation (pp_stage=None) within 1e-6.

Multi-process grid, pp = 2, 2 steps each, gpt unless noted: 1F1B and VPP (vpp=2), with and
without split_backward, ZBH1, ZBV and ZBVPP (vpp=2), each for m in {2, 3, 4}; ZBVPP m=4 (mlp).
All configurations run in one launch (the worker loops over them).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from _multirank import (GRID_WORKER, STEPS, TOL, TRAIN, check_grid_results, launch_script,
                        rank_plans, spawn)

# the grid: 1F1B and VPP (vpp=2) with and without split_backward, the zero-bubble
# schedules (split implied), m in {2, 3, 4}; plus one MLP run
GRID = [["--schedule", name, "--vpp", str(vpp), "-m", str(m)] + split
        for name, vpp in (("1F1B", 1), ("VPP", 2)) for m in (2, 3, 4)
        for split in ([], ["--split-backward"])] + \
       [["--schedule", name, "--vpp", str(vpp), "-m", str(m)]
        for name, vpp in (("ZBH1", 1), ("ZBV", 2), ("ZBVPP", 2)) for m in (2, 3, 4)] + \
       [["--schedule", "ZBVPP", "--vpp", "2", "-m", "4", "--model", "mlp"]]


@pytest.mark.parametrize("schedule,vpp", [("VPP", 2), ("ZBV", 2)])
def test_rank_programs_partition_the_model(schedule, vpp):
    built, plans = rank_plans(schedule, 2, vpp, 4)
    held = [set(p.rank_info.param_names) for p in plans]
    assert not held[0] & held[1]
    assert held[0] | held[1] == set(built.param_names)
    for r, p in enumerate(plans):
        info = p.rank_info
        placement = p.schedule.placement
        assert info.stages == {c: placement.stage(r, c) for c in range(vpp)}
        types = set(p.plan.job_types())
        assert types <= {f"{k}{c}" for c in range(vpp) for k in (
            "forward", "backward", "backward_b", "backward_w", "send_forward", "recv_forward",
            "send_backward", "recv_backward")} | {"optimizer"}
        assert p.job_order[-1] == ("optimizer", 0)
        # the optimizer updates exactly this rank's parameters
        opt = p.plan.ir_program("optimizer")
        updated = {op.operand_source(0).get_defining_op().attrs()["parameter_name"]
                   for op in opt.global_block().ops if op.name() == "pd_op.sgd_"}
        assert updated == held[r]
        # the loss is fetched on the rank holding the last stage only
        last = placement.rank_of(placement.num_stages - 1)
        assert (info.fetch_names == ["loss"]) == (r == last)


def test_v_turn_hands_over_in_memory():
    _, plans = rank_plans("ZBV", 2, 2, 4)
    # rank 1 holds stages 1 and 2: nothing crosses between its chunks
    info = plans[1].rank_info
    assert info.stages == {0: 1, 1: 2}
    assert not info.comm["send_forward0"].transfers
    assert not info.comm["recv_forward1"].transfers
    assert not info.comm["send_backward1"].transfers
    assert not info.comm["recv_backward0"].transfers
    assert info.comm["recv_forward0"].transfers and info.comm["send_forward1"].transfers


def test_comm_sequences_pair_up():
    """Both ranks issue their comm jobs in one global order: the k-th comm job of rank 0 and
    of rank 1 are the two ends of one transfer."""
    for schedule, vpp, m, sb in (("VPP", 2, 3, False), ("ZBV", 2, 4, True), ("1F1B", 1, 3, True)):
        _, plans = rank_plans(schedule, 2, vpp, m, sb)
        seqs = [p.rank_info.comm_sequence for p in plans]
        assert len(seqs[0]) == len(seqs[1]) > 0
        for (t0, mb0, peer0), (t1, mb1, peer1) in zip(*seqs):
            assert (peer0, peer1) == (1, 0)
            assert t0.startswith("send") != t1.startswith("send")
            c0 = plans[0].rank_info.comm[t0].transfers
            c1 = plans[1].rank_info.comm[t1].transfers
            assert [t.name for t in c0] == [t.name for t in c1]


def test_gloo_programs_use_broadcast_rooted_at_sender():
    from pipesplit.passes.transport.p2p import comm_peers

    _, plans = rank_plans("VPP", 2, 2, 4)
    for r, p in enumerate(plans):
        for t, info in p.rank_info.comm.items():
            ops = comm_peers(p.split.programs[t])
            if not info.transfers:
                assert not ops
                continue
            root = r if t.startswith("send") else 1 - r
            assert ops and all(name == "pd_op.broadcast_" and ring == 0 and peer == root
                               for name, ring, peer in ops)


# --------------------------------------------------------------------------- slow (2 processes)

@pytest.mark.slow
def test_two_ranks_match_emulation(tmp_path):
    spec = tmp_path / "grid.json"
    spec.write_text(json.dumps([cfg + STEPS for cfg in GRID]))
    out = tmp_path / "out"
    out.mkdir()
    proc, logs = launch_script([GRID_WORKER, spec, out], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs[0][-3000:] \
        + logs[1][-3000:]
    check_grid_results(out, GRID, pp=2)


@pytest.mark.slow
def test_train_launcher_matches_demo(tmp_path):
    from pipesplit.tools import demo

    out = tmp_path / "out.json"
    proc, logs = launch_script([TRAIN, "--schedule", "VPP", "--vpp", "2", "-m", "4", "--steps", "2",
                          "--json", out], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + logs[0][-3000:] + logs[1][-3000:]
    rec = json.loads(out.read_text())
    assert rec["max_param_diff"] <= TOL
    # the last rank's results reach the launcher's console (it shows rank 0's output)
    assert "rank 1 (results):" in proc.stdout and "max parameter difference" in proc.stdout
    ref = tmp_path / "demo.json"
    assert demo.main(["--schedule", "VPP", "--pp", "2", "--vpp", "2", "-m", "4", "--steps", "2",
                      "--json", str(ref)]) == 0
    ref = json.loads(ref.read_text())
    assert np.max(np.abs(np.array(rec["losses"]) - np.array(ref["losses"]))) <= TOL
    assert np.max(np.abs(np.array(rec["baseline_losses"]) - np.array(ref["baseline_losses"]))) \
        <= TOL


@pytest.mark.slow
def test_dead_rank_is_reported(tmp_path):
    # without the launcher, which would stop rank 0 (SIGTERM) as soon as rank 1 ends, possibly
    # before rank 0 has seen the closed connection and said so
    codes, logs = spawn([TRAIN, "--schedule", "1F1B", "--vpp", "1", "-m", "4", "--steps", "3",
                          "--fail-at", "1:1", "--watchdog", "60"], tmp_path, timeout=120)
    assert codes[0] != 0 and codes[1] != 0, codes
    assert "rank 0 failed in step 1, waiting in send_forward0 micro-batch 0 with rank 1" \
        in logs[0], logs[0][-2000:]
    error = next(line for line in logs[0].splitlines() if "rank 0 failed in step 1" in line)
    assert not error.rstrip().endswith("std::exception"), error


@pytest.mark.slow
def test_stuck_rank_is_reported_by_watchdog(tmp_path):
    proc, logs = launch_script([TRAIN, "--schedule", "ZBV", "--vpp", "2", "-m", "4", "--steps", "3",
                          "--fail-at", "0:1:hang", "--watchdog", "5"], tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "rank 1 no progress for 5 s in step 1, waiting in recv_forward0 micro-batch 0 " \
           "with rank 0" in logs[1], logs[1][-2000:]

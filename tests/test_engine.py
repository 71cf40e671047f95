"""Paddle's auto-parallel engine path: ``dist.to_static`` with a pipesplit schedule.

The two-process runs launch ``examples/auto_parallel_pipeline.py`` (a GPT-like dygraph model of
``paddle.nn`` layers) under ``paddle.distributed.launch`` on CPU, with
``pipesplit.passes.cpu_support`` and the strategy hook, and compare every micro-batch loss and
every parameter with the script's own one-process dygraph reference (same micro-batches).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import paddle
from paddle.distributed.auto_parallel.static import engine as paddle_engine
from paddle.distributed.auto_parallel.static import pir_pass

from pipesplit.ir_utils import build_gpt
from pipesplit.passes import cpu_support
from pipesplit.passes import strategy as ps_strategy
from pipesplit.passes.engine import block_meshes, is_engine_program

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "auto_parallel_pipeline.py"
TOL = 1e-6


def _launch(tmp_path, tag, *args):
    out = tmp_path / f"{tag}.json"
    logs = tmp_path / f"log_{tag}"
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
           "--log_dir", str(logs), str(EXAMPLE), *args, "--json", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    worker_logs = "".join(p.read_text(errors="replace") for p in sorted(logs.glob("workerlog.*")))
    return proc.returncode, (json.loads(out.read_text()) if out.exists() else None), worker_logs


# (tag, example arguments): every looped schedule family, m a multiple of pp and not, with
# and without the B / W split, and an LR schedule stepped by the user between steps
CONFIGS = [
    ("fthenb_m3", ["--schedule", "FThenB", "-m", "3"]),
    ("1f1b_m2", ["--schedule", "1F1B", "-m", "2"]),
    ("1f1b_m4_split", ["--schedule", "1F1B", "-m", "4", "--split-backward"]),
    ("1f1b_m4_stepdecay", ["--schedule", "1F1B", "-m", "4", "--lr-schedule", "step"]),
    ("eager1f1b_m3", ["--schedule", "Eager1F1B", "-m", "3"]),
    ("vpp_m4", ["--schedule", "VPP", "--vpp", "2", "-m", "4"]),
    ("vpp_m3", ["--schedule", "VPP", "--vpp", "2", "-m", "3"]),
    ("zbh1_m3", ["--schedule", "ZBH1", "-m", "3"]),
    ("zbh2_m4", ["--schedule", "ZBH2", "-m", "4"]),
    ("interleavedzb_m4", ["--schedule", "InterleavedZB", "--vpp", "2", "-m", "4"]),
    ("auto_m4", ["--schedule", "auto", "-m", "4"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("tag,args", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_engine_trains_like_the_dygraph_reference(tmp_path, tag, args):
    rc, record, logs = _launch(tmp_path, tag, *args, "--steps", "2")
    assert rc == 0, logs[-3000:]
    assert record["params_compared"] == 70  # every parameter of the model, over both ranks
    assert len(record["losses"]) == 2 and len(record["losses"][0]) == record["m"]
    assert record["max_loss_diff"] <= TOL
    assert record["max_param_diff"] <= TOL


@pytest.mark.slow
def test_meshes_that_contradict_the_schedule_are_refused(tmp_path):
    # blocks placed in V order (ranks 0, 1, 1, 0) while the schedule is looped VPP
    rc, record, logs = _launch(tmp_path, "mismatch", "--schedule", "VPP", "--vpp", "2",
                               "--mesh-order", "ZBV", "-m", "4", "--steps", "1")
    assert rc != 0 and record is None
    assert ("ValueError: strategy.pipeline.schedule_mode='VPP' makes stage 3 (rank 1, chunk 1) "
            "the last stage, but the engine's program has a pd_op.send_v2 (send_forward) with "
            "rank 0: the stage meshes contradict the schedule's placement") in logs
    assert ("ValueError: strategy.pipeline.schedule_mode='VPP': the schedule has "
            "recv_backward1 on rank 0 but the engine program has none: the program's stage "
            "boundaries do not match the schedule's looped placement (pp_degree=2, "
            "vpp_degree=2)") in logs


def _pipeline(mode, vpp=1, m=4, pp=2):
    s = paddle.distributed.Strategy()
    s.pipeline.enable = True
    s.pipeline.schedule_mode = mode
    s.pipeline.pp_degree = pp
    s.pipeline.vpp_degree = vpp
    s.pipeline.accumulate_steps = m
    return s.pipeline


def test_strategy_errors_name_the_field():
    with pytest.raises(ValueError) as e:
        ps_strategy.check_strategy(_pipeline("ZBV", vpp=1))
    assert str(e.value) == ("strategy.pipeline.schedule_mode='ZBV' cannot serve this strategy: "
                            "strategy.pipeline.vpp_degree must be 2 for ZBV, got 1")
    with pytest.raises(ValueError, match=r"^strategy.pipeline: unknown schedule 'NoSuch'"):
        ps_strategy.check_strategy(_pipeline("NoSuch"))
    assert ps_strategy.check_strategy(_pipeline("zb-v", vpp=2)).schedule == "ZBV"


def test_disable_gives_paddle_its_engine_back():
    names = ("pipeline_pass", "complete_chunk_id", "check_chunk_id")
    before = [getattr(paddle_engine, n) for n in names] + [paddle_engine.Engine.__init__,
                                                           pir_pass.pipeline_pass]
    ps_strategy.enable_strategy()
    try:
        assert paddle_engine.pipeline_pass is ps_strategy.pipeline_pass
        assert paddle_engine.Engine.__init__ is not before[3]
        assert paddle_engine.complete_chunk_id is not before[1]
    finally:
        ps_strategy.disable_strategy()
    after = [getattr(paddle_engine, n) for n in names] + [paddle_engine.Engine.__init__,
                                                          pir_pass.pipeline_pass]
    assert after == before


def test_cpu_support_patches_only_a_cpu_build_and_undoes_it():
    from paddle.distributed.auto_parallel.static.process_group import ProcessGroup

    before = (ProcessGroup.instantiate, paddle.base.core.reshard, paddle._legacy_C_ops.barrier)
    assert cpu_support.enable() == cpu_support.needed()
    try:
        if cpu_support.needed():
            assert ProcessGroup.instantiate is not before[0]
            assert paddle.base.core.reshard is not before[1]
    finally:
        cpu_support.disable()
    assert (ProcessGroup.instantiate, paddle.base.core.reshard,
            paddle._legacy_C_ops.barrier) == before


def test_block_meshes_follow_the_placement():
    meshes = ["m0", "m1"]
    assert block_meshes(meshes, 4, "1F1B") == ["m0", "m0", "m1", "m1"]
    assert block_meshes(meshes, 4, "VPP", 2) == ["m0", "m1", "m0", "m1"]
    assert block_meshes(meshes, 8, "ZBV", 2) == ["m0", "m0", "m1", "m1", "m1", "m1", "m0", "m0"]
    with pytest.raises(ValueError, match="num_blocks must be a multiple of pp x vpp_degree = 4"):
        block_meshes(meshes, 6, "ZBV", 2)


def test_whole_model_programs_are_not_engine_programs():
    assert not is_engine_program(build_gpt(num_stages=2, hidden=16, batch_size=4).main)

"""Paddle's auto-parallel engine path: ``dist.to_static`` with a pipesplit schedule.

The two-process runs launch ``examples/auto_parallel_pipeline.py`` (a GPT-like dygraph model of
``paddle.nn`` layers) under ``paddle.distributed.launch`` on CPU, with
``pipesplit.passes.cpu_support`` and the strategy hook, and compare every micro-batch loss and
every parameter with the script's own one-process dygraph reference (same micro-batches).
"""
from __future__ import annotations

import json

import pytest

import paddle
from paddle.distributed.auto_parallel.static import engine as paddle_engine
from paddle.distributed.auto_parallel.static import pir_pass

from pipesplit.ir_utils import build_gpt
from pipesplit.passes import cpu_support
from pipesplit.passes import strategy as ps_strategy
from pipesplit.passes.engine import block_meshes
from pipesplit.passes.engine.engine_rank import is_engine_program

from _launch import launch

from _paths import REPO as ROOT, WORKERS  # noqa: E402
EXAMPLE = ROOT / "examples" / "auto_parallel_pipeline.py"
TOL = 1e-6


GRID = WORKERS / "engine_grid.py"


VPP_OF = {"VPP": 2, "InterleavedZB": 2, "ZBV": 2, "ZBVPP": 2, "DualPipeV": 2}
SCHEDULES = ["FThenB", "1F1B", "Eager1F1B", "VPP", "ZBH1", "ZBH2", "InterleavedZB", "ZBV",
             "ZBVPP", "DualPipeV", "auto"]


def _configs():
    """(tag, example arguments): every schedule at m in {2, 3, 4}; the B / W split on a
    classic schedule; an LR scheduler stepped between steps; Paddle's own FThenB / 1F1B."""
    out = []
    for name in SCHEDULES:
        for m in (2, 3, 4):
            out.append((f"{name}_m{m}", ["--schedule", name, "--vpp", VPP_OF.get(name, 1),
                                          "-m", m]))
    out.append(("VPP_m4_split", ["--schedule", "VPP", "--vpp", 2, "-m", 4, "--split-backward"]))
    # blocks placed explicitly for the schedule (block_meshes) instead of in model order
    for name in ("ZBV", "VPP", "DualPipeV"):
        out.append((f"{name}_m4_placed", ["--schedule", name, "--vpp", VPP_OF.get(name, 1),
                                          "-m", 4, "--mesh-order", "schedule"]))
    out.append(("ZBVPP_m4_8blocks", ["--schedule", "ZBVPP", "--vpp", 2, "-m", 4, "--layers", 8]))
    out.append(("ZBV_m4_stepdecay", ["--schedule", "ZBV", "-m", 4, "--lr-schedule", "step"]))
    out.append(("1F1B_m4_stepdecay", ["--schedule", "1F1B", "-m", 4, "--lr-schedule", "step"]))
    for name in ("FThenB", "1F1B"):
        out.append((f"paddle_{name}_m4", ["--schedule", name, "-m", 4, "--paddle"]))
    # clipping with thresholds that do clip: pipesplit clips the averaged gradient
    for name, vpp in (("1F1B", 1), ("ZBV", 2), ("VPP", 2)):
        out.append((f"{name}_m4_clipglobal", ["--schedule", name, "--vpp", vpp, "-m", 4,
                                              "--clip-global-norm", 0.05]))
    out.append(("ZBH1_m4_clipnorm", ["--schedule", "ZBH1", "-m", 4, "--clip-by-norm", 0.02]))
    # control flow in the program: DeepSeek-V3's criterion (`if count == 0`) as the loss, every
    # schedule (and Paddle's own 1F1B beside them)
    for name in SCHEDULES:
        out.append((f"{name}_m4_masked_loss", ["--schedule", name, "--vpp", VPP_OF.get(name, 1),
                                               "-m", 4, "--loss", "masked"]))
    out.append(("ZBV_m4_masked_loss_clipglobal", ["--schedule", "ZBV", "--vpp", 2, "-m", 4,
                                                  "--loss", "masked", "--clip-global-norm",
                                                  0.05]))
    out.append(("paddle_1F1B_m4_masked_loss", ["--schedule", "1F1B", "-m", 4, "--paddle",
                                               "--loss", "masked"]))
    out.append(("paddle_1F1B_m4_clipglobal", ["--schedule", "1F1B", "-m", 4, "--paddle",
                                              "--clip-global-norm", 0.05]))
    # evaluation and prediction between training steps (each mode its own plan); the loader of
    # Paddle's docs (inputs on the first mesh, labels on the last) for the V schedules
    for name in MODE_SCHEDULES:
        out.append((f"{name}_modes", ["--schedule", name, "--vpp", VPP_OF.get(name, 1), "-m", 4,
                                      "--modes", "train,eval,predict,train"]))
    for name in ("1F1B", "ZBV", "DualPipeV"):
        out.append((f"{name}_sharded_loader", ["--schedule", name, "--vpp", VPP_OF.get(name, 1),
                                               "-m", 4, "--loader", "sharded",
                                               "--modes", "train,eval,train"]))
    # checkpoint / resume: AdamW, 4 steps, every rank's state saved after 2 and loaded into a
    # fresh DistModel (its own --steps; "--modes train" keeps these 4-step records out of the
    # 2-step test); parameters only (the moments lost: must differ); an LR scheduler's state.
    # AdamW's epsilon 1e-3: with 1e-8 it turns the rounding noise of attention's key-bias
    # gradient (zero in exact arithmetic) into steps of ~lr, which B / W splitting rounds
    # differently from the reference (4e-3 after one step of ZBH1, without any resume)
    adamw = ["--optimizer", "adamw", "--adam-epsilon", 1e-3, "--steps", 4, "--resume-at", 2,
             "--modes", "train"]
    for name in RESUME_SCHEDULES:
        out.append((f"{name}_adamw_resume", ["--schedule", name, "--vpp", VPP_OF.get(name, 1),
                                             "-m", 4] + adamw))
    out.append(("ZBV_adamw_resume_params_only", ["--schedule", "ZBV", "-m", 4] + adamw
                + ["--resume-load", "param"]))
    out.append(("1F1B_adamw_resume_stepdecay", ["--schedule", "1F1B", "-m", 4] + adamw
                + ["--lr-schedule", "step"]))
    # "--steps 2" first: a configuration's own --steps comes later and wins
    return [(tag, ["--steps", "2"] + [str(a) for a in args]) for tag, args in out]


MODE_SCHEDULES = ["1F1B", "ZBH1", "VPP", "ZBV", "DualPipeV"]
RESUME_SCHEDULES = ["1F1B", "ZBH1", "VPP", "ZBV", "DualPipeV"]


CONFIGS = _configs()


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """All configurations in ONE two-process launch; tag -> the example's JSON record."""
    work = tmp_path_factory.mktemp("engine_grid")
    (work / "configs.json").write_text(json.dumps(CONFIGS))
    done = launch(work, GRID, work / "configs.json", work)
    assert done.returncode == 0, done.report()
    return {tag: json.loads((work / f"{tag}.json").read_text()) for tag, _ in CONFIGS}


@pytest.mark.slow
@pytest.mark.parametrize("tag", [t for t, _ in CONFIGS if t != "paddle_1F1B_m4_clipglobal"
                                 and "--modes" not in _])
def test_engine_trains_like_the_dygraph_reference(grid, tag):
    record = grid[tag]
    # every parameter of the model (16 per block + 6), over both ranks
    assert record["params_compared"] == (134 if "8blocks" in tag else 70)
    assert len(record["losses"]) == 2 and len(record["losses"][0]) == record["m"]
    assert record["max_loss_diff"] <= TOL
    assert record["max_param_diff"] <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("tag", [t for t, _ in CONFIGS if "masked_loss" in t])
def test_control_flow_in_the_loss_is_in_the_program_and_trains(grid, tag):
    """The masked loss's ``if`` is a ``pd_op.if`` (and its backward) in the last stage's
    program; the run equals the reference (checked with the others above)."""
    assert grid[tag]["control_flow_ops"] == 2
    assert grid[tag]["max_loss_diff"] <= TOL and grid[tag]["max_param_diff"] <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("name", MODE_SCHEDULES)
def test_eval_and_predict_between_training_steps(grid, name):
    """``train()`` -> ``eval()`` -> ``predict()`` -> ``train()`` through the engine: evaluation
    losses equal the reference model's forward, no parameter changes while evaluating or
    predicting, the predicted logits equal the reference's, and training afterwards goes on
    as if nothing happened in between."""
    record = grid[f"{name}_modes"]
    assert record["modes"] == ["train", "eval", "predict", "train"]
    assert len(record["losses"]) == 4 and len(record["eval_losses"]) == 2
    assert len(record["eval_losses"][0]) == record["m"]  # per micro-batch, as in training
    assert record["max_loss_diff"] <= TOL  # training and evaluation losses
    assert record["max_param_diff"] <= TOL
    assert record["eval_param_change"] == 0.0
    assert record["predict_max_diff"] is not None and record["predict_max_diff"] <= 2e-6


@pytest.mark.slow
@pytest.mark.parametrize("name", ["1F1B", "ZBV", "DualPipeV"])
def test_a_loader_on_the_first_and_last_meshes_feeds_every_schedule(grid, name):
    """``dist.shard_dataloader(loader, meshes=[first, last])`` (labels fed on the last mesh
    only): the V schedules' loss is back on the first mesh, and the labels reach it."""
    record = grid[f"{name}_sharded_loader"]
    assert len(record["losses"]) == 4 and len(record["eval_losses"]) == 2
    assert record["max_loss_diff"] <= TOL and record["max_param_diff"] <= TOL
    assert record["eval_param_change"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("tag", [f"{name}_adamw_resume" for name in RESUME_SCHEDULES]
                         + ["1F1B_adamw_resume_stepdecay"])
def test_a_resumed_run_trains_like_an_uninterrupted_one(grid, tag):
    """AdamW: every rank's state (parameters, moments, beta powers, learning rate, the LR
    scheduler's state) saved per rank after 2 of 4 steps and loaded into a fresh model,
    optimizer and ``dist.to_static`` (fresh names and scope, as in a new process): the 4
    steps' losses and the final parameters equal the uninterrupted reference's."""
    record = grid[tag]
    assert record["optimizer"] == "adamw" and record["resume_at"] == 2
    assert record["resume_load"] == "all"
    assert len(record["losses"]) == 4 and len(record["reference_losses"]) == 4
    assert len(record["losses"][3]) == record["m"]
    assert record["params_compared"] == 70
    assert record["max_loss_diff"] <= TOL
    assert record["max_param_diff"] <= TOL


@pytest.mark.slow
def test_a_resume_that_drops_the_optimizer_state_differs(grid):
    """The same resume loading the parameters only (AdamW's moments and beta powers start
    afresh): step 3 still matches (its parameters were loaded), step 4 does not."""
    record = grid["ZBV_adamw_resume_params_only"]
    assert record["resume_load"] == "param" and len(record["losses"]) == 4
    ours, ref = record["losses"], record["reference_losses"]
    assert max(abs(a - b) for a, b in zip(ours[2], ref[2])) <= TOL
    assert max(abs(a - b) for a, b in zip(ours[3], ref[3])) > 1e-3
    assert record["max_param_diff"] > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["FThenB", "1F1B"])
def test_engine_equals_paddles_own_pass(grid, name):
    ours, paddles = grid[f"{name}_m4"]["losses"], grid[f"paddle_{name}_m4"]["losses"]
    assert max(abs(a - b) for x, y in zip(ours, paddles) for a, b in zip(x, y)) <= TOL


FOUR_RANK_CONFIGS = [
    ("1F1B_pp4_m6", ["--schedule", "1F1B", "-m", "6"]),
    ("ZBH1_pp4_m5", ["--schedule", "ZBH1", "-m", "5"]),
    ("VPP_pp4_m4", ["--schedule", "VPP", "--vpp", "2", "-m", "4", "--layers", "8"]),
    ("ZBV_pp4_m8", ["--schedule", "ZBV", "-m", "8", "--layers", "8"]),
    ("DualPipeV_pp4_m6", ["--schedule", "DualPipeV", "-m", "6", "--layers", "8"]),
    # the optimizer's global-norm exchange between four ranks: the lockstep world ring
    ("ZBV_pp4_m8_clip", ["--schedule", "ZBV", "-m", "8", "--layers", "8",
                         "--clip-global-norm", "0.05"]),
    ("1F1B_pp4_m4_clip", ["--schedule", "1F1B", "-m", "4", "--clip-global-norm", "0.05"]),
]


@pytest.mark.slow
def test_engine_on_four_cpu_ranks_trains_like_the_reference(tmp_path):
    """pp = 4 through the engine on CPU: the world-ring transport (every rank takes part in
    every transfer, the senders' shapes shared through the launcher's store)."""
    configs = [(tag, args + ["--steps", "2"]) for tag, args in FOUR_RANK_CONFIGS]
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    done = launch(tmp_path, GRID, tmp_path / "configs.json", tmp_path, "--no-fleet", nproc=4)
    assert done.returncode == 0, done.report()
    for tag, args in configs:
        record = json.loads((tmp_path / f"{tag}.json").read_text())
        assert record["pp"] == 4
        assert record["params_compared"] == (134 if "--layers" in args else 70), tag
        assert record["max_loss_diff"] <= TOL and record["max_param_diff"] <= TOL, tag


@pytest.mark.slow
def test_clipping_acts_on_the_average_unlike_paddles_own_pass(grid):
    # Paddle's own 1F1B clips the SUM of the micro-batch gradients (threshold k times too
    # small); pipesplit's plan clips their average, as unsplit training does
    assert grid["1F1B_m4_clipglobal"]["max_param_diff"] <= TOL
    assert grid["paddle_1F1B_m4_clipglobal"]["max_loss_diff"] > 1e-3


@pytest.mark.slow
def test_meshes_that_contradict_the_schedule_are_refused(tmp_path):
    # blocks placed in V order (ranks 0, 1, 1, 0) while the schedule is looped VPP
    done = launch(tmp_path, EXAMPLE, "--schedule", "VPP", "--vpp", "2",
                  "--mesh-order", "ZBV", "-m", "4", "--steps", "1")
    assert done.returncode != 0
    logs = done.worker_text()
    assert ("ValueError: strategy.pipeline.schedule_mode='VPP' makes stage 3 (rank 1, chunk 1) "
            "the last stage, but the engine's program has a pd_op.send_v2 (send_forward) with "
            "rank 0: the stage meshes contradict the schedule's placement") in logs
    assert ("ValueError: strategy.pipeline.schedule_mode='VPP': the schedule has "
            "recv_backward1 on rank 0 but the engine program has none: the program's stage "
            "boundaries do not match the schedule's looped placement (pp_degree=2, "
            "vpp_degree=2)") in logs


def test_disable_gives_paddle_its_engine_back():
    """(No engine built with pipesplit lives here: the routed functions go too.)"""
    names = ("pipeline_pass", "complete_chunk_id", "check_chunk_id")
    before = [getattr(paddle_engine, n) for n in names] + [paddle_engine.Engine.__init__,
                                                           pir_pass.pipeline_pass]
    ps_strategy.enable_strategy()
    try:
        assert paddle_engine.pipeline_pass.__qualname__ == "route_the_pipeline_pass.<locals>.routed"
        assert paddle_engine.Engine.__init__ is not before[3]
        assert paddle_engine.complete_chunk_id is not before[1]
    finally:
        ps_strategy.disable_strategy()
    after = [getattr(paddle_engine, n) for n in names] + [paddle_engine.Engine.__init__,
                                                          pir_pass.pipeline_pass]
    assert after == before


def test_cpu_support_patches_only_a_cpu_build_and_undoes_it():
    from paddle.distributed.auto_parallel.api import DistModel
    from paddle.distributed.auto_parallel.static.process_group import ProcessGroup

    def current():
        return (ProcessGroup.instantiate, paddle.base.core.reshard, paddle._legacy_C_ops.barrier,
                paddle.base.executor.Executor._set_plan, DistModel.__init__)

    before = current()
    assert cpu_support.enable() == cpu_support.needed()
    try:
        if cpu_support.needed():
            assert all(now is not then for now, then in zip(current(), before))
    finally:
        cpu_support.disable()
    assert current() == before


def test_block_meshes_follow_the_placement():
    meshes = ["m0", "m1"]
    assert block_meshes(meshes, 4, "1F1B") == ["m0", "m0", "m1", "m1"]
    assert block_meshes(meshes, 4, "VPP", 2) == ["m0", "m1", "m0", "m1"]
    assert block_meshes(meshes, 8, "ZBV", 2) == ["m0", "m0", "m1", "m1", "m1", "m1", "m0", "m0"]
    with pytest.raises(ValueError, match="num_blocks must be a multiple of pp x vpp_degree = 4"):
        block_meshes(meshes, 6, "ZBV", 2)


def test_whole_model_programs_are_not_engine_programs():
    assert not is_engine_program(build_gpt(num_stages=2, hidden=16, batch_size=4).main)


STRUCTURE = WORKERS / "engine_gpu_structure.py"


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["VPP", "ZBV"])
def test_cuda_plans_of_four_ranks_have_the_right_rings_peers_and_events(tmp_path, schedule):
    """The NCCL variant, built on a CPU build from the engine's programs of 4 processes
    (pp=4, vpp=2, 8 blocks): each p2p op talks to the rank the placement gives, on a ring of
    Paddle's reshard, on its own stream, with an event edge to the producer / consumers."""
    from pipesplit.job_list.placement import Placement
    from pipesplit.job_list.registry import get_spec

    done = launch(tmp_path, STRUCTURE, tmp_path, "--schedule", schedule, "--vpp", "2",
                  "--layers", "8", "-m", "4", nproc=4, timeout=600)
    assert done.returncode == 0, done.report()
    placement = Placement(get_spec(schedule).placement, 4, 2)
    rings = {}
    for rank in range(4):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        programs = record["programs"]
        recorded = {op["event_to_record"] for ops in programs.values() for op in ops
                    if "event_to_record" in op}
        waited = {e for ops in programs.values() for op in ops for e in op.get("events_to_wait", [])}
        comm_jobs = {t for t, _ in record["job_order"] if t.startswith(("send", "recv"))}
        assert comm_jobs, f"rank {rank} has no comm jobs"
        for job_type in comm_jobs:
            ops = [op for op in programs[job_type] if op["op"] in ("pd_op.send_v2", "pd_op.recv_v2")]
            assert ops, f"rank {rank}: {job_type} carries no p2p op"
            kind, chunk = job_type.rstrip("0123456789"), int(job_type[len(job_type.rstrip("0123456789")):])
            stage = placement.stage(rank, chunk)
            neighbour = stage + 1 if kind in ("send_forward", "recv_backward") else stage - 1
            for op in ops:
                assert op["pipesplit_peer"] == placement.rank_of(neighbour), (rank, job_type, op)
                sending = op["op"] == "pd_op.send_v2"
                assert op["stream"] == (f"send_stream_{op['ring_id']}" if sending else "recv_stream")
                pair = tuple(sorted((rank, op["pipesplit_peer"])))
                rings.setdefault(op["ring_id"], set()).add(pair)
                if sending:  # waits for the compute op that produced the value
                    assert set(op["events_to_wait"]) <= recorded
                else:  # a compute op waits for what it received
                    assert op["event_to_record"] in waited
    assert all(len(pairs) == 1 for pairs in rings.values()), rings  # a ring joins one pair


TWO_GPUS = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() >= 2


@pytest.mark.cuda
@pytest.mark.skipif(not TWO_GPUS, reason="needs a CUDA build of Paddle and two GPUs")
def test_engine_on_two_gpus_trains_like_the_reference(tmp_path):
    """On GPUs the engine path uses NCCL send_v2 / recv_v2 on the engine's rings (cpu_support
    does nothing there): the same grid as on CPU, a few schedules."""
    configs = [(tag, args) for tag, args in CONFIGS
               if tag in ("1F1B_m4", "VPP_m3", "ZBH1_m4", "ZBV_m4", "DualPipeV_m3",
                          "1F1B_m4_clipglobal")]
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    done = launch(tmp_path, GRID, tmp_path / "configs.json", tmp_path)
    assert done.returncode == 0, done.report()
    for tag, _ in configs:
        record = json.loads((tmp_path / f"{tag}.json").read_text())
        assert record["max_loss_diff"] <= 1e-5 and record["max_param_diff"] <= 1e-5, tag

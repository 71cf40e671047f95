"""Scripts written the way Paddle's own auto-parallel tests and docs write them, through the
engine with pipesplit's schedules, each rank against a one-process reference.

The script is ``tests/workers/engine_user_conventions.py`` (each convention named in a comment there):
no ``dist.init_parallel_env()`` and no ``fleet.init`` in it; ``BatchSampler(batch_size=micro)``
with ``_acc_steps = accumulate_steps`` under ``dist.shard_dataloader(meshes=[first, last],
shard_dims="dp")``, or a plain ``DataLoader(batch_size=micro * acc)``; a separate criterion
layer; ``LinearWarmup`` stepped by hand; the loss read as ``np.average(loss)``; stage meshes cut
from one global mesh (and the 1-D ones Paddle's test makes by dropping size-1 dims);
``pp_degree`` left at 1; ``gradient_merge.enable`` beside the pipeline; ``train()`` / ``eval()``
before the first step and between steps; layers the virtual stages do not divide.  One launch per process count (and one of two
launchers joined as two nodes)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from _launch import launch, launch_nodes

from _paths import WORKERS  # noqa: E402
SCRIPT = WORKERS / "engine_user_conventions.py"
TOL = 1e-5

#: 2 processes (pp 2): every schedule the issue names, each convention in at least one
TWO_PROCESSES = [
    {"tag": "1F1B", "schedule": "1F1B"},
    {"tag": "ZBH1_filtered_modes", "schedule": "ZBH1", "filtered_mesh": True,
     "toggle_modes": True},
    {"tag": "ZBV_pp_unset", "schedule": "ZBV", "vpp": 2, "pp_degree_unset": True},
    {"tag": "VPP_gradient_merge", "schedule": "VPP", "vpp": 2, "gradient_merge": "acc"},
    {"tag": "auto_plain", "schedule": "auto", "loader": "plain"},
    {"tag": "1F1B_plain_filtered_merge_pp_unset", "schedule": "1F1B", "loader": "plain",
     "filtered_mesh": True, "gradient_merge": "default", "pp_degree_unset": True},
    {"tag": "ZBV_plain_modes", "schedule": "ZBV", "vpp": 2, "loader": "plain",
     "toggle_modes": True},
    # layers the virtual stages do not divide (Paddle's VPP test: 7 on pp 2, vpp 2): each stage
    # keeps the layers placed on its mesh, dealt one by one to its chunks
    {"tag": "VPP_7_layers", "schedule": "VPP", "vpp": 2, "layers": 7, "layers_per_stage": [4, 3]},
    {"tag": "ZBV_7_layers", "schedule": "ZBV", "vpp": 2, "layers": 7, "layers_per_stage": [3, 4]},
    {"tag": "DualPipeV_7_layers", "schedule": "DualPipeV", "vpp": 2, "layers": 7,
     "layers_per_stage": [2, 5]},
    {"tag": "autoV_7_layers", "schedule": "autoV", "vpp": 2, "layers": 7,
     "layers_per_stage": [4, 3]},
    {"tag": "ZBH1_5_layers", "schedule": "ZBH1", "layers": 5, "layers_per_stage": [2, 3]},
    # a tied embedding: the weight crosses once per step in train and in eval
    {"tag": "1F1B_tied_modes", "schedule": "1F1B", "tie": True, "toggle_modes": True},
    {"tag": "VPP_tied_modes", "schedule": "VPP", "vpp": 2, "tie": True, "toggle_modes": True},
    # PaddleNLP's pretraining script: the model made under paddle.LazyGuard() and each
    # parameter initialized (another stage's has a shape and no bytes), a loader without
    # drop_last whose short last batch the trainer's max_steps never draws
    {"tag": "ZBV_lazy_short_last_batch", "schedule": "ZBV", "vpp": 2, "lazy": True,
     "extra_samples": 3},
] + [
    # the strategy's knobs (docs/engine.md, "Every knob"), as a user sets them: each trains equal
    # to the reference and the run says the field it does not serve as asked; a tied embedding
    # with Paddle's shared-parameter sync asked for trains through every schedule
    {"tag": f"{name}_tied_sync_shared_params", "schedule": name,
     "vpp": 2 if name in ("VPP", "InterleavedZB", "ZBV", "ZBVPP", "DualPipeV", "autoV") else 1,
     "tie": True, "strategy": {"pipeline.auto_parallel_sync_shared_params": True, **more},
     "expect_notices": ["strategy.pipeline.auto_parallel_sync_shared_params=True: a weight "
                        "read on another stage"] + notices}
    for name, more, notices in [
        ("FThenB", {"gradient_merge.enable": True, "gradient_merge.avg": False},
         ["strategy.gradient_merge.avg=False: the micro-batch gradients are averaged"]),
        ("1F1B", {"pipeline.micro_batch_size": 3},
         ["strategy.pipeline.micro_batch_size=3 has no effect: the batch of 8 is cut into "
          "accumulate_steps=4 micro-batches of 2"]),
        ("Eager1F1B", {"pipeline.generation_batch_size": 4,
                       "pipeline.job_schedule_profiler_start": 1,
                       "pipeline.job_schedule_profiler_stop": 2},
         ["strategy.pipeline.generation_batch_size=4 has no effect",
          "strategy.pipeline.job_schedule_profiler_start=1 has no effect",
          "strategy.pipeline.job_schedule_profiler_stop=2 has no effect"]),
        ("VPP", {}, []),
        ("ZBH1", {}, []),
        ("ZBH2", {}, []),
        ("InterleavedZB", {}, []),
        ("ZBV", {"pipeline.enable_send_recv_overlap": True},
         ["strategy.pipeline.enable_send_recv_overlap=True has no effect on this CPU build"]),
        ("ZBVPP", {}, []),
        ("DualPipeV", {"pipeline.memory_limit_times": 2},
         ["strategy.pipeline.memory_limit_times=2 has no effect on "
          "schedule_mode='DualPipeV'"]),
        ("auto", {"pipeline.program_runtimes": [1, 3, 1, 1, 2]}, []),
        ("autoV", {"pipeline.memory_limit_times": 1}, []),
    ]
] + [
    # fields that cannot work beside a pipeline on a CPU build: refused on every rank before
    # anything runs, naming the field
    {"tag": "1F1B_sharding_overlap", "schedule": "1F1B",
     "strategy": {"sharding.enable_overlap": True},
     "expect_error": "ValueError: strategy.sharding.enable_overlap=True beside a pipeline "
                     "cannot run on a CPU build"},
    {"tag": "auto_fused_passes", "schedule": "auto",
     "strategy": {"fused_passes.enable": True, "fused_passes.gemm_epilogue": True},
     "expect_error": "ValueError: strategy.fused_passes with schedule_mode='auto' on a CPU "
                     "build: its measured training step re-plans"},
    # inputs fed on a later stage's mesh than the one that reads them: no forward transfer
    # can carry them there; refused on every rank before anything runs
    {"tag": "1F1B_inputs_on_the_last_stage", "schedule": "1F1B", "inputs_stage": 1,
     "expect_error": "ValueError: strategy.pipeline.schedule_mode='1F1B': 'input0' is fed on "
                     "stage mesh [1], but what reads it runs on stage mesh [0]"},
]

#: 4 processes: dp2 x pp2 and mp2 x pp2
FOUR_PROCESSES = [
    {"tag": "dp2pp2_ZBV", "schedule": "ZBV", "vpp": 2, "dp": 2},
    {"tag": "mp2pp2_ZBV", "schedule": "ZBV", "vpp": 2, "mp": 2},
    {"tag": "dp2pp2_1F1B_filtered_pp_unset", "schedule": "1F1B", "dp": 2,
     "filtered_mesh": True, "pp_degree_unset": True},
    # a memory budget priced by every process's measured step (the worst of each stage's dp
    # pair); ample, so the re-plan searches under it and trains as the reference
    {"tag": "dp2pp2_auto_memory_budget", "schedule": "auto", "dp": 2, "memory_budget": "1GB"},
    # pp 4: labels fed on an inner stage's mesh (Paddle's Llama test feeds them on stage 1's)
    # or on the last while a V placement computes the loss on rank 0: relayed through every
    # stage between; lazily made parameters on four stages
    {"tag": "pp4_1F1B_labels_on_stage1", "schedule": "1F1B", "pp": 4, "labels_stage": 1},
    {"tag": "pp4_VPP_labels_on_stage1", "schedule": "VPP", "vpp": 2, "pp": 4, "layers": 8,
     "labels_stage": 1},
    {"tag": "pp4_ZBV_labels_on_the_last", "schedule": "ZBV", "vpp": 2, "pp": 4, "layers": 8},
    {"tag": "pp4_ZBH1_lazy_labels_on_stage2", "schedule": "ZBH1", "pp": 4, "labels_stage": 2,
     "lazy": True, "extra_samples": 5},
    # sequence parallel cannot run on a CPU build: refused on every rank before anything runs
    {"tag": "mp2pp2_ZBV_sequence_parallel", "schedule": "ZBV", "vpp": 2, "mp": 2,
     "sequence_parallel": True,
     "expect_error": "ValueError: sequence parallel (a dist.reshard of a partial value to a "
                     "shard over mesh dim 'mp': a reduce-scatter"},
]

#: two launchers on this machine as two nodes of 2 processes each
TWO_NODES = [{"tag": "nodes_dp2pp2_ZBV", "schedule": "ZBV", "vpp": 2, "dp": 2}]


def _run(tmp_path: Path, configs, nproc: int = 2, nodes: int = 1) -> dict:
    """Launch the script on ``configs``; {tag: [each rank's record]}."""
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    out = tmp_path / "out"
    args = (tmp_path / "configs.json", out)
    done = launch_nodes(tmp_path, SCRIPT, *args, nodes=nodes, nproc=nproc) if nodes > 1 \
        else launch(tmp_path, SCRIPT, *args, nproc=nproc)
    assert done.returncode == 0, done.report()
    return {c["tag"]: [json.loads(p.read_text()) for p in sorted((out / c["tag"]).glob("*.json"))]
            for c in configs}


def _check(results: dict, world: int) -> None:
    for tag, ranks in results.items():
        assert len(ranks) == world, f"{tag}: {len(ranks)} of {world} ranks wrote a result"
        expected = ranks[0]["config"]["expect_error"]
        if expected:
            for r in ranks:
                assert (r["error"] or "").startswith(expected), (tag, r["rank"], r["error"])
            continue
        holders = [r for r in ranks if r["max_loss_diff"] is not None]
        assert holders, f"{tag}: no rank returned a loss"
        last_stage = sorted(r["rank"] for r in ranks
                            if r["stage"] == r["config"]["pp"] - 1)
        # where a trainer reads it, whatever the schedule's placement
        assert sorted(r["rank"] for r in holders) == last_stage, tag
        for r in ranks:
            where = f"{tag} rank {r['rank']}"
            assert r["params_compared"] > 0, where
            layers = r["config"]["layers_per_stage"]
            if layers:  # each stage mesh kept the layers the user placed on it
                assert r["layers_held"] == layers[r["stage"]], where
            assert r["max_param_diff"] <= TOL, f"{where}: parameters {r['max_param_diff']}"
            if r["max_loss_diff"] is not None:
                assert len([s for s in r["losses"] if s is not None]) == r["config"]["steps"]
                assert r["max_loss_diff"] <= TOL, f"{where}: losses {r['losses']} vs " \
                                                  f"{r['reference_losses']}"
            if r["config"]["toggle_modes"] and r["eval_losses"] and r["eval_losses"][0] is not None:
                assert r["max_eval_diff"] <= TOL, f"{where}: eval {r['eval_losses']}"
        if ranks[0]["config"]["memory_budget"]:  # re-planned under it, the same on every rank
            memory = [r["replanned_memory"] for r in ranks]
            assert memory[0] is not None and all(m == memory[0] for m in memory), tag
            assert max(memory[0]["predicted_peak_bytes"]) <= memory[0]["budget_bytes"], tag
        _check_knobs(tag, ranks)
        if ranks[0]["config"]["toggle_modes"]:
            assert sorted(r["rank"] for r in ranks if r["eval_losses"]
                          and r["eval_losses"][0] is not None) == last_stage, tag


def _check_knobs(tag: str, ranks) -> None:
    """Every rank said each line the knobs of its config call for; ``program_runtimes`` became
    the plan's costs (nothing measured), ``memory_limit_times`` auto's limit per rank."""
    cfg = ranks[0]["config"]
    for r in ranks:
        for start in cfg.get("expect_notices", []):
            assert any(line.startswith(start) for line in r["notices"]), \
                (tag, r["rank"], start, r["notices"])
    runtimes = cfg["strategy"].get("pipeline.program_runtimes")
    if runtimes:
        forward, b, w, loss, comm = runtimes
        stages = cfg["pp"] * cfg["vpp"]
        for r in ranks:
            assert r["plan_costs"]["costs"] == {"forward": [forward] * (stages - 1)
                                                + [forward + loss], "backward_b": b,
                                                "backward_w": w, "comm": comm}, tag
            assert r["replanned_memory"] is None, tag
    times = cfg["strategy"].get("pipeline.memory_limit_times")
    if times and cfg["schedule"] in ("auto", "autoV"):
        # 1F1B's peak per rank at pp 2, m 4: 2 and 1 micro-batches' activations of a rank
        assert all(r["plan_costs"]["memory_limit"] == [times * 2 * cfg["vpp"],
                                                       times * 1 * cfg["vpp"]]
                   for r in ranks), tag


def _one_d(config) -> bool:
    """A 2-process configuration whose global mesh is 1-D (size-1 dims dropped at pp 2)."""
    return bool(config.get("filtered_mesh"))


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """{tag: records} of one 2-process launch, and why Paddle cannot cut stage meshes from a
    1-D global mesh here (None: it can, and those configurations ran too)."""
    import paddle

    from pipesplit.passes._paddle import ONE_D_STAGE_MESHES, paddle_cannot

    why = paddle_cannot(paddle.__version__, ONE_D_STAGE_MESHES)
    configs = [c for c in TWO_PROCESSES if not (why and _one_d(c))]
    return _run(tmp_path_factory.mktemp("two_processes"), configs), why


@pytest.mark.slow
def test_paddle_conventions_train_equal_to_the_reference_on_2_processes(two_processes):
    results, _ = two_processes
    _check({c["tag"]: results[c["tag"]] for c in TWO_PROCESSES if not _one_d(c)}, world=2)


@pytest.mark.slow
def test_stage_meshes_cut_from_a_1d_global_mesh_train_on_2_processes(two_processes):
    """Paddle's own Llama test drops the size-1 dims of its global mesh: at pp 2 it is 1-D
    (``["pp"]``) and each stage mesh is cut from it with ``get_mesh_with_dim``."""
    import paddle

    results, why = two_processes
    if why:  # Paddle's own code fails there, in the script, before pipesplit runs
        pytest.skip(f"Paddle {paddle.__version__} cannot: {why}")
    _check({c["tag"]: results[c["tag"]] for c in TWO_PROCESSES if _one_d(c)}, world=2)


@pytest.mark.slow
def test_paddle_conventions_on_dp_and_mp_meshes_of_4_processes(tmp_path):
    _check(_run(tmp_path, FOUR_PROCESSES, nproc=4), world=4)


@pytest.mark.slow
def test_two_launchers_joined_as_two_nodes(tmp_path):
    _check(_run(tmp_path, TWO_NODES, nproc=2, nodes=2), world=4)

"""Misconfigured pipelines through ``dist.to_static``: each stopped, on every rank, with its
cause named in the engine user's words (a strategy field, the processes, the meshes, the
layer classes, the order of the set-up calls) before anything runs; never Paddle's
``IndexError`` / ``ZeroDivisionError`` / bare ``std::exception`` from deep inside.  All cases
in one two-process launch (``tests/workers/engine_bad_strategy.py``)."""
from __future__ import annotations

import pytest

from _paths import WORKERS

SCRIPT = WORKERS / "engine_bad_strategy.py"

EXPECTED = {
    "vpp_float": "TypeError: strategy.pipeline.vpp_degree must be an int, got float 2.5",
    "vpp_str": "TypeError: strategy.pipeline.vpp_degree must be an int, got str '2'",
    "steps_float": "TypeError: strategy.pipeline.accumulate_steps must be an int, got float 4.5",
    "pp_3_of_2": "ValueError: strategy.pipeline.pp_degree=3 does not divide the 2 processes",
    "pp_4_of_2": "ValueError: strategy.pipeline.pp_degree=4 does not divide the 2 processes",
    "seg_method": "ValueError: strategy.pipeline.vpp_seg_method='NoSuchBlock' names no layer "
                  "class of the model",
    "enable_after_to_static": "ValueError: this engine was built before "
                              "pipesplit.passes.strategy.enable_strategy() was called",
    "enable_after_to_static_1f1b": "ValueError: this engine was built before "
                                   "pipesplit.passes.strategy.enable_strategy() was called",
    "enable_after_train": "ValueError: this engine was built before "
                          "pipesplit.passes.strategy.enable_strategy() was called (or after "
                          "disable_strategy()), so it is Paddle's own, and Paddle's engine has "
                          "no schedule strategy.pipeline.schedule_mode='ZBV' (only FThenB, 1F1B, "
                          "VPP): call enable_strategy() (and cpu_support.enable() on a CPU "
                          "build) before dist.to_static",
    "enable_after_train_1f1b": "ValueError: this engine was built before "
                               "pipesplit.passes.strategy.enable_strategy() was called: call "
                               "enable_strategy() (and cpu_support.enable() on a CPU build) "
                               "before dist.to_static",
    "one_mesh": "ValueError: strategy.pipeline.pp_degree is 2, but the model's layers are "
                "placed on 1 stage mesh(es): [0] ['pp']",
    "gradient_merge": "ValueError: strategy.gradient_merge.k_steps=2 with "
                      "strategy.pipeline.enable: Paddle's engine ignores it and accumulates "
                      "strategy.pipeline.accumulate_steps=4 micro-batches per update",
    "cpu_support_after_to_static": "RuntimeError: on a CPU build of Paddle call "
                                   "pipesplit.passes.cpu_support.enable() before dist.to_static",
    "empty_loader": "ValueError: the DataLoader given to dist.to_static yields no batch",
    "short_last_batch": "ValueError: train step 1 is given a batch of 4 samples in 'input0', "
                        "but the pipeline's program was built for batches of 8",
    "short_last_batch_not_drawn": "trained",
    "float_labels": "ValueError: the loss's cross_entropy (soft_label=False) reads the labels as "
                    "class indices, but they are float32",
    "block_leaves_its_mesh": "ValueError: strategy.pipeline.schedule_mode='ZBV' (v placement): "
                             "block 'DecoderBlock' (DecoderBlock) has its pd_op.full on mesh [0] "
                             "but a dist_op.reshard on mesh [0, 1]; the schedule moves a block "
                             "whole",
    "one_mesh_zbv": "ValueError: strategy.pipeline.pp_degree is 2, but the model's layers are "
                    "placed on 1 stage mesh(es): [0] ['pp']",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from _launch import launch_for_json

    return launch_for_json(tmp_path_factory.mktemp("bad_strategy"), SCRIPT)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_misconfigured_pipeline_is_stopped_with_its_cause(results, case):
    by_rank = results[case]
    assert set(by_rank) == {"0", "1"}
    for rank, line in by_rank.items():
        assert line.startswith(EXPECTED[case]), (case, rank, line)


@pytest.mark.slow
@pytest.mark.parametrize("schedule,fault,job,total", [("1F1B", "exit", "send_forward0", 8),
                                                      ("ZBV", "hang", "send_forward0", 16)])
def test_a_dead_or_hung_rank_is_named(tmp_path, schedule, fault, job, total):
    """Rank 1 ends (or stops responding) at the start of step 1; rank 0's step fails within
    gloo's timeout, naming itself, the step, the comm job, micro-batch and peer it was in."""
    from _multirank import spawn

    codes, logs = spawn([WORKERS / "engine_dead_rank.py", schedule, fault, tmp_path],
                         tmp_path, timeout=300)
    assert codes[0] == 1, logs[0][-3000:]
    line = (tmp_path / "rank0.txt").read_text().strip()
    assert line.startswith("RuntimeError: pipesplit: rank 0 failed in train step 1 after "), line
    assert f"s, waiting in {job} micro-batch 0 with rank 1 (comm job 1 of {total} in the step): " \
        "the connection to its peer broke or timed out" in line, line

"""Misconfigured pipelines through ``dist.to_static``: each stopped, on every rank, with its
cause named in the engine user's words (a strategy field, the processes, the meshes, the
layer classes, the order of the set-up calls) before anything runs; never Paddle's
``IndexError`` / ``ZeroDivisionError`` / bare ``std::exception`` from deep inside.  All cases
in one two-process launch (``tests/engine_bad_strategy.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "engine_bad_strategy.py"

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
    "one_mesh": "ValueError: strategy.pipeline.pp_degree is 2, but the model's layers are "
                "placed on 1 stage mesh(es): [0] ['pp']",
    "gradient_merge": "ValueError: strategy.gradient_merge.enable with strategy.pipeline.enable: "
                      "a pipeline step already accumulates "
                      "strategy.pipeline.accumulate_steps=4 micro-batches before its one update; "
                      "set strategy.pipeline.accumulate_steps=8",
    "cpu_support_after_to_static": "RuntimeError: on a CPU build of Paddle call "
                                   "pipesplit.passes.cpu_support.enable() before dist.to_static",
    "empty_loader": "ValueError: the DataLoader given to dist.to_static yields no batch",
    "short_last_batch": "ValueError: the DataLoader's last batch has 4 samples and the others "
                        "batch_size=8",
    "one_mesh_zbv": "ValueError: strategy.pipeline.pp_degree is 2, but the model's layers are "
                    "placed on 1 stage mesh(es): [0] ['pp']",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from test_engine import _launch

    work = tmp_path_factory.mktemp("bad_strategy")
    rc, logs = _launch(work, SCRIPT, work / "out.json")
    assert rc == 0, logs[-4000:]
    return json.loads((work / "out.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_misconfigured_pipeline_is_stopped_with_its_cause(results, case):
    by_rank = results[case]
    assert set(by_rank) == {"0", "1"}
    for rank, line in by_rank.items():
        assert line.startswith(EXPECTED[case]), (case, rank, line)

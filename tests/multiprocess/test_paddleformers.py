"""The model library's own Llama under its own trainer: PaddleFormers 0.4.0's
``LlamaForCausalLM3DAuto`` + ``LlamaPretrainingCriterion3DAuto`` trained by its ``AutoTrainer``
(``to_static=True``, ``pipeline_schedule_mode`` a pipesplit schedule), as a user of that library
writes the script (``tests/workers/paddleformers_llama.py``), compared with the same trainer run
in one process in dygraph with no pipeline over the same batches: every logged loss, every eval
loss and every parameter, on every rank that holds it.

Each launch trains several configurations (starting Paddle and the trainer costs seconds); a
run that saves a checkpoint comes first in its launch and a resumed run has a launch of its own,
as in a user's new process (the optimizer's state names count up within a process).
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from _paths import WORKERS  # noqa: E402

WORKER = WORKERS / "paddleformers_llama.py"
TOL = 1e-5
STEPS = 4
#: the model's parameters: embedding, 4 layers x 9, final norm, head
PARAMETERS = 39

PP2 = {"pp": 2}
VPP2 = {"pp": 2, "vpp": 2}
DP2 = {"dp": 2, "pp": 2}

#: launches of two processes: {launch: [configuration, ...]}; "save" saves at step 2, "eval"
#: evaluates every 2 steps, "recompute" turns on the trainer's recompute
TWO_PROCESSES = {
    "looped": [{"tag": "1F1B", "schedule": "1F1B", **PP2, "save": 2},
               {"tag": "FThenB", "schedule": "FThenB", **PP2},
               {"tag": "ZBH1", "schedule": "ZBH1", **PP2},
               {"tag": "auto", "schedule": "auto", **PP2},
               {"tag": "VPP", "schedule": "VPP", **VPP2},
               {"tag": "eval_1F1B", "schedule": "1F1B", **PP2, "eval": 2}],
    "v": [{"tag": "ZBV", "schedule": "ZBV", **VPP2, "save": 2},
          {"tag": "DualPipeV", "schedule": "DualPipeV", **VPP2},
          {"tag": "eval_ZBV", "schedule": "ZBV", **VPP2, "eval": 2},
          {"tag": "recompute_ZBV", "schedule": "ZBV", **VPP2, "recompute": True},
          {"tag": "recompute_VPP", "schedule": "VPP", **VPP2, "recompute": True}],
    "resume_1F1B": [{"tag": "resumed_1F1B", "schedule": "1F1B", **PP2,
                     "resume": "ckpt_1F1B/checkpoint-2", "resume_step": 2}],
    "resume_ZBV": [{"tag": "resumed_ZBV", "schedule": "ZBV", **VPP2,
                    "resume": "ckpt_ZBV/checkpoint-2", "resume_step": 2}],
}
FOUR_PROCESSES = [{"tag": "dp2_1F1B", "schedule": "1F1B", **DP2},
                  {"tag": "dp2_VPP", "schedule": "VPP", "vpp": 2, **DP2},
                  {"tag": "dp2_ZBV", "schedule": "ZBV", "vpp": 2, **DP2},
                  {"tag": "dp2_DualPipeV", "schedule": "DualPipeV", "vpp": 2, **DP2},
                  # the trainer's own sharding of the optimizer states over dp (its gradient
                  # reshard is a reduce-scatter: on CPU, pipesplit's)
                  {"tag": "dp2_stage1_1F1B", "schedule": "1F1B", **DP2, "sharding": "stage1"},
                  {"tag": "dp2_stage2_ZBV", "schedule": "ZBV", "vpp": 2, **DP2,
                   "sharding": "stage2"},
                  # the parameters sharded too (dist.ShardingStage3 in the trainer)
                  {"tag": "dp2_stage3_1F1B", "schedule": "1F1B", **DP2, "sharding": "stage3"}]
#: the one-process dygraph references: the batches of dp1 and of dp2 (evaluating every 2 steps)
REFERENCES = [{"tag": "reference", "reference": True, "eval": 2},
              {"tag": "reference_dp2", "reference": True, "dp": 2}]


def _require_paddleformers():
    import paddle

    from pipesplit.passes._paddle import paddleformers_cannot_run

    why = paddleformers_cannot_run(paddle.__version__)
    if why:  # its own code fails there, before pipesplit runs: its tests run on Paddle 3.3
        pytest.skip(f"PaddleFormers 0.4.0 cannot run on Paddle {paddle.__version__}: {why}")
    try:
        import paddleformers  # noqa: F401
    except ImportError:
        pytest.fail("these tests run PaddleFormers 0.4.0's own trainer: install it as README "
                    "says (pip install -r requirements.txt && pip install --no-deps -r "
                    "requirements-nodeps.txt)")


def _write(path, configs):
    path.write_text(json.dumps(configs))
    return path


def _records(out, tag) -> list:
    ranks = sorted(out.glob(f"{tag}.rank*.json"))
    assert ranks, f"{tag}: no rank wrote its record"
    return [json.loads(p.read_text()) for p in ranks]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The output folder after the references and every launch."""
    from _launch import launch

    _require_paddleformers()
    out = tmp_path_factory.mktemp("paddleformers")
    ref = subprocess.run([sys.executable, str(WORKER), str(_write(out / "references.json",
                                                                  REFERENCES)), str(out)],
                         cwd=out, capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    for name, configs in TWO_PROCESSES.items():
        (out / name).mkdir()
        done = launch(out / name, WORKER, _write(out / f"{name}.json", configs), out, nproc=2,
                      timeout=900)
        assert done.returncode == 0, done.report()
    (out / "dp2").mkdir()
    done = launch(out / "dp2", WORKER, _write(out / "dp2.json", FOUR_PROCESSES), out, nproc=4,
                  timeout=900)
    assert done.returncode == 0, done.report()
    return out


def _max_diff(a, b) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def _joined_blocks(records) -> dict:
    """The parameters sharded over ranks, each whole again from the ranks' blocks (every
    element held by some rank), flattened."""
    whole = {}
    for record in records:
        for name, block in record.get("shards", {}).items():
            values = whole.setdefault(name, np.full(block["shape"], np.nan))
            where = tuple(slice(s, s + n) for s, n in zip(block["start"], block["block"]))
            values[where] = np.asarray(block["values"]).reshape(block["block"])
    assert not any(np.isnan(v).any() for v in whole.values()), "a block no rank holds"
    return {name: v.ravel().tolist() for name, v in whole.items()}


def _check_against(out, tag, reference_tag, steps=range(STEPS)):
    """Every rank logged a non-zero loss each step, equal to the reference's; the ranks'
    parameters together are every parameter of the reference, each equal to it."""
    reference = _records(out, reference_tag)[0]
    records = _records(out, tag)
    expected = [reference["losses"][s] for s in steps]
    parameters = {}
    for rank, record in enumerate(records):
        assert len(record["losses"]) == len(expected), (tag, rank, record["losses"])
        assert all(loss != 0.0 for loss in record["losses"]), (tag, rank, record["losses"])
        assert _max_diff(record["losses"], expected) <= TOL, (tag, rank, record["losses"],
                                                              expected)
        parameters.update(record["parameters"])
    parameters.update(_joined_blocks(records))
    assert sorted(parameters) == sorted(reference["parameters"]), tag
    for name, values in parameters.items():
        assert _max_diff(values, reference["parameters"][name]) <= TOL, (tag, name)
    return records


@pytest.mark.slow
@pytest.mark.parametrize("tag", ["1F1B", "FThenB", "ZBH1", "auto", "VPP", "ZBV", "DualPipeV",
                                 "recompute_ZBV", "recompute_VPP"])
def test_the_library_s_llama_trains_with_every_schedule_at_pp2(trained, tag):
    assert len(_records(trained, "reference")[0]["parameters"]) == PARAMETERS
    _check_against(trained, tag, "reference")


@pytest.mark.slow
@pytest.mark.parametrize("tag", ["dp2_1F1B", "dp2_VPP", "dp2_ZBV", "dp2_DualPipeV"])
def test_the_library_s_llama_trains_with_dp2_beside_pp2(trained, tag):
    _check_against(trained, tag, "reference_dp2")


@pytest.mark.slow
@pytest.mark.parametrize("tag", ["dp2_stage1_1F1B", "dp2_stage2_ZBV", "dp2_stage3_1F1B"])
def test_the_trainer_s_sharding_trains_beside_the_pipeline(trained, tag):
    """``sharding="stage1"`` / ``"stage2"`` / ``"stage3"`` in the trainer's arguments at
    dp2 x pp2: its gradient reshard (a reduce-scatter, which a CPU build has no kernel for)
    runs on pipesplit's CPU transport, and every rank's loss equals the reference's, as does
    every parameter (stage 3: joined from the ranks' blocks)."""
    _check_against(trained, tag, "reference_dp2")


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "ZBV"])
def test_evaluation_during_training_equals_the_reference_s(trained, schedule):
    records = _check_against(trained, f"eval_{schedule}", "reference")
    expected = _records(trained, "reference")[0]["eval_losses"]
    assert len(expected) == STEPS // 2
    for record in records:
        assert len(record["eval_losses"]) == len(expected), record["eval_losses"]
        assert _max_diff(record["eval_losses"], expected) <= TOL, (record["eval_losses"],
                                                                   expected)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "ZBV"])
def test_a_run_resumed_at_step_2_equals_the_uninterrupted_run(trained, schedule):
    """Saved at step 2 by the trainer, resumed in a new launch to step 4: its losses are the
    uninterrupted run's steps 3 and 4 and its parameters the uninterrupted run's."""
    _check_against(trained, f"resumed_{schedule}", "reference", steps=range(2, STEPS))
    uninterrupted = {}
    for record in _records(trained, schedule):
        uninterrupted.update(record["parameters"])
    for record in _records(trained, f"resumed_{schedule}"):
        for name, values in record["parameters"].items():
            assert _max_diff(values, uninterrupted[name]) <= TOL, name

"""The registered passes: Paddle's registry, attributes, bad input, and the demo."""
import json
import subprocess
import sys

import numpy as np
import paddle
import pytest
from paddle.distributed.passes import new_pass
from paddle.distributed.passes.pass_base import PassBase, PassContext

import pipesplit.passes as passes
from pipesplit.ir_utils import PlanRunner, build_mlp, init_scope
from pipesplit.job_list import schedule_names

from _parity import model


def program_text(program):
    return str(program)


def test_every_schedule_is_registered_under_both_prefixes_unless_paddle_has_it():
    paddle_own = {"FThenB", "1F1B", "Eager1F1B", "VPP", "ZBH1", "ZBVPP"}
    for name in schedule_names():
        assert issubclass(PassBase._REGISTERED_PASSES["pipesplit_scheduler_" + name],
                          passes.PipesplitSchedulerPass)
        registered = PassBase._REGISTERED_PASSES["pipeline_scheduler_" + name]
        assert issubclass(registered, passes.PipesplitSchedulerPass) == (name not in paddle_own)


def test_new_pass_pipeline_scheduler_zbv_returns_a_plan_with_every_job():
    built = model("mlp", "sgd", 4, 8)
    zbv = new_pass("pipeline_scheduler_ZBV", {"num_micro_batches": 4, "pp_degree": 2,
                                             "vpp_degree": 2})
    plan = zbv.apply([built.main], [built.startup], PassContext()).get_attr("plan")
    types = [job.type() for job in plan.job_list()]
    assert plan.micro_batch_num() == 4
    for stage in range(4):
        for kind in ("forward", "backward_b", "backward_w"):
            assert types.count(f"{kind}{stage}") == 4
    assert types[-1] == "optimizer" and types.count("optimizer") == 1
    assert "backward0" not in types


def test_enable_routes_paddles_names_and_disable_restores_them():
    original = PassBase._REGISTERED_PASSES["pipeline_scheduler_VPP"]
    assert not issubclass(original, passes.PipesplitSchedulerPass)
    passes.enable()
    try:
        assert passes.is_enabled()
        assert PassBase._REGISTERED_PASSES["pipeline_scheduler_VPP"].schedule_name == "VPP"
        assert passes.paddle_pass_class("VPP") is original
    finally:
        passes.disable()
    assert PassBase._REGISTERED_PASSES["pipeline_scheduler_VPP"] is original
    assert not passes.is_enabled()


def test_apply_pass_accepts_aliases_and_case():
    built = model("mlp", "sgd", 2, 8)
    plan = passes.apply_pass(built.main, built.startup, "gpipe",
                             {"num_micro_batches": 2, "pp_degree": 2})
    types = [job.type() for job in plan.job_list()]
    # GPipe / FThenB: every forward before any backward
    assert max(i for i, t in enumerate(types) if t.startswith("forward")) < \
        min(i for i, t in enumerate(types) if t.startswith("backward"))


BAD_ATTRS = [
    ({"num_micro_batches": 0, "pp_degree": 2}, ValueError, "num_micro_batches"),
    ({"pp_degree": 2}, ValueError, "num_micro_batches"),
    ({"num_micro_batches": 2, "pp_degree": 4}, ValueError, "chunk"),
    ({"num_micro_batches": 2, "pp_degree": 2, "vpp_degree": 2}, ValueError, "chunk"),
    ({"num_micro_batches": "2", "pp_degree": 2}, TypeError, "num_micro_batches"),
    ({"num_micro_batches": 2, "pp_degree": 2, "split_backward": "yes"}, TypeError, "split_backward"),
    ({"num_micro_batches": 2, "pp_degree": 2, "micro_batches": 2}, ValueError, "unknown pass attrs"),
    ({"num_micro_batches": 2, "pp_degree": 2, "grad_accumulation": "max"}, ValueError,
     "grad_accumulation"),
]


@pytest.mark.parametrize("attrs, error, words", BAD_ATTRS)
def test_bad_attrs_raise_named_errors_and_leave_the_program_unchanged(attrs, error, words):
    built = model("mlp", "sgd", 2, 8)
    before = program_text(built.main)
    with pytest.raises(error, match=words):
        passes.apply_pass(built.main, built.startup, "1F1B", attrs)
    assert program_text(built.main) == before


def test_unknown_schedule_name():
    built = model("mlp", "sgd", 2, 8)
    with pytest.raises(ValueError, match="unknown schedule 'ZBX'"):
        passes.apply_pass(built.main, built.startup, "ZBX", {"num_micro_batches": 2})


def test_a_schedule_that_cannot_serve_the_config_names_the_constraint():
    built = model("mlp", "sgd", 6, 6)
    with pytest.raises(ValueError, match="vpp"):
        passes.apply_pass(built.main, built.startup, "ZBV",
                          {"num_micro_batches": 2, "pp_degree": 2, "vpp_degree": 3})


def test_program_without_op_roles_or_chunks_is_refused():
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        paddle.mean(paddle.static.nn.fc(x, 4))
    before = program_text(main)
    with pytest.raises(ValueError):
        passes.apply_pass(main, startup, "1F1B", {"num_micro_batches": 2, "pp_degree": 2})
    assert program_text(main) == before


def test_split_backward_without_parameter_gradients_is_refused():
    from paddle.base.framework import pir_chunk_id_guard

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        x.stop_gradient = False
        with pir_chunk_id_guard(0):
            hidden = paddle.tanh(x)
        with pir_chunk_id_guard(1):
            loss = paddle.mean(hidden * hidden)
        paddle.static.gradients([loss], [x])
    before = program_text(main)
    with pytest.raises(ValueError, match="no parameter gradients"):
        passes.apply_pass(main, startup, "1F1B", {"num_micro_batches": 2, "pp_degree": 2,
                                                   "split_backward": True})
    assert program_text(main) == before


def test_batch_not_divisible_by_micro_batches():
    built = build_mlp(2, batch_size=6)
    pipeline = passes.apply_pipeline(built.main, built.startup, "1F1B",
                                     {"num_micro_batches": 4, "pp_degree": 2})
    runner = PlanRunner(pipeline.plan, init_scope(built, pipeline.split))
    with pytest.raises(ValueError, match="not divisible by num_micro_batches=4"):
        runner.step(built.make_batch(0))


def test_pass_does_not_modify_the_input_program():
    built = model("gpt", "adam", 4, 8)
    before = program_text(built.main)
    passes.apply_pass(built.main, built.startup, "ZBV",
                      {"num_micro_batches": 4, "pp_degree": 2, "vpp_degree": 2})
    assert program_text(built.main) == before


def test_sum_accumulation_scales_the_update_by_m():
    """With SGD, summing M micro-batch gradients moves parameters M times as far as averaging."""
    built = build_mlp(2, batch_size=8, optimizer="sgd", lr=0.01, seed=3)
    moved = {}
    for mode in ("avg", "sum"):
        pipeline = passes.apply_pipeline(built.main, built.startup, "1F1B",
                                         {"num_micro_batches": 4, "pp_degree": 2,
                                          "grad_accumulation": mode})
        scope = init_scope(built, pipeline.split)
        name = built.param_names[0]
        start = np.array(scope.find_var(name).get_tensor())
        PlanRunner(pipeline.plan, scope).step(built.make_batch(0))
        moved[mode] = np.array(scope.find_var(name).get_tensor()) - start
    np.testing.assert_allclose(moved["sum"], 4 * moved["avg"], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_demo_json_matches_unsplit_training(tmp_path):
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "pipesplit.tools.cli", "demo", "--schedule", "VPP", "--pp", "4",
         "--vpp", "2", "-m", "5", "--steps", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["max_param_diff"] <= 1e-6
    assert len(record["losses"]) == 3 and len(record["losses"][0]) == 5
    assert np.max(np.abs(np.array(record["losses"]) - np.array(record["baseline_losses"]))) <= 1e-6
    assert "bubble ratio" in result.stdout and "max parameter difference" in result.stdout


def test_demo_bad_argument_is_one_line():
    result = subprocess.run([sys.executable, "-m", "pipesplit.tools.cli", "demo", "--pp", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "--pp must be >= 1" in result.stderr


def test_the_pass_applied_in_dynamic_mode_makes_static_ops():
    """A pass applied from a dygraph script (Paddle's default mode): the split's ops are made
    as static ones, and the script stays in dynamic mode."""
    built = model("mlp", "sgd", 4, 8)  # (leaves static mode)
    paddle.disable_static()
    try:
        zbv = new_pass("pipeline_scheduler_ZBV", {"num_micro_batches": 4, "pp_degree": 2,
                                                 "vpp_degree": 2})
        plan = zbv.apply([built.main], [built.startup], PassContext()).get_attr("plan")
        assert paddle.in_dynamic_mode()
    finally:
        paddle.enable_static()
    assert plan.micro_batch_num() == 4 and plan.job_list()[-1].type() == "optimizer"


def test_unsupported_paddle_version_is_refused_clearly(monkeypatch):
    from pipesplit.passes._paddle import require_supported_paddle

    assert require_supported_paddle() is paddle
    monkeypatch.setattr(paddle, "__version__", "2.6.2")
    with pytest.raises(ImportError, match=r"supports PaddlePaddle 3\.3\.1, .* found 2\.6\.2"):
        require_supported_paddle()

"""The strategy hook: Paddle's auto-parallel ``pipeline_pass`` routed to pipesplit."""
from __future__ import annotations


import numpy as np
import pytest

import paddle
from paddle.distributed.auto_parallel.static import engine, pir_pass

from pipesplit.ir_utils import PlanRunner, build_gpt, init_scope, read_params, run_unsplit_baseline
from pipesplit.passes import strategy as ps_strategy
from pipesplit.passes.split import registration
from pipesplit.passes.engine import paddle_patches
from pipesplit.passes.engine.state import HANDLE

from _strategies import M, PP, VPP, pipeline_section as _pipeline_strategy
from _paths import DATA

STEPS = 2


@pytest.fixture
def enabled():
    ps_strategy.enable_strategy()
    yield
    ps_strategy.disable_strategy()


def test_paddle_rejects_pipesplit_names_without_the_hook():
    """Paddle's own pass, asked for a pipesplit schedule while pipesplit is off (an engine
    built before enable_strategy()): named from the import of pipesplit.passes.strategy on,
    Paddle's AssertionError without that guard."""
    assert not ps_strategy.is_strategy_enabled()
    built = build_gpt(num_stages=PP * VPP, hidden=16, batch_size=2 * M)
    for name in (pir_pass.pipeline_pass, engine.pipeline_pass):
        with pytest.raises(ValueError, match=r"^this engine was built before pipesplit\.passes"
                           r"\.strategy\.enable_strategy\(\) was called \(or after "
                           r"disable_strategy\(\)\), so it is Paddle's own, and Paddle's engine "
                           r"has no schedule strategy\.pipeline\.schedule_mode='ZBV' \(only "
                           r"FThenB, 1F1B, VPP\): call enable_strategy\(\) \(and "
                           r"cpu_support\.enable\(\) on a CPU build\) before dist\.to_static"):
            name([built.main], [built.main], _pipeline_strategy("ZBV"))
    for unknown in ("NoSuchSchedule", "zbv "):  # not pipesplit's either: Paddle's own words
        with pytest.raises(AssertionError, match="FThenB, 1F1B and VPP"):
            pir_pass.pipeline_pass([built.main], [built.main], _pipeline_strategy(unknown))
    paddle_patches.disable("schedule_names")
    try:
        with pytest.raises(AssertionError, match="FThenB, 1F1B and VPP"):
            pir_pass.pipeline_pass([built.main], [built.main], _pipeline_strategy("ZBV"))
    finally:
        paddle_patches.enable("schedule_names")


@pytest.mark.parametrize("mode,vpp,split_backward", [("ZBV", 2, False), ("ZBH1", 1, False),
                                                     ("DualPipeV", 2, False), ("VPP", 2, True)])
def test_engine_entry_point_trains_like_unsplit(enabled, mode, vpp, split_backward):
    # the exact names the engine calls: engine.pipeline_pass (imported) and pir_pass's, both
    # routed to pipesplit's pass
    for name in (engine.pipeline_pass, pir_pass.pipeline_pass):
        assert name.__qualname__ == "route_the_pipeline_pass.<locals>.routed"
    built = build_gpt(num_stages=PP * vpp, hidden=16, batch_size=2 * M, seed=3)
    plan = engine.pipeline_pass([built.main], [built.main],
                                _pipeline_strategy(mode, vpp=vpp, split_backward=split_backward))
    assert isinstance(plan, paddle.base.core.Plan)
    pipeline = ps_strategy.last_pipeline()
    assert pipeline.plan is plan and pipeline.schedule.name == \
        ps_strategy.config_from_strategy(_pipeline_strategy(mode, vpp=vpp)).schedule
    scope = init_scope(built, pipeline.split)
    runner = PlanRunner(plan, scope)
    losses = np.array([runner.step(built.make_batch(s)) for s in range(STEPS)], np.float64)
    ref_losses, ref_params = run_unsplit_baseline(built, STEPS, M)
    assert np.max(np.abs(losses - np.array(ref_losses))) <= 1e-6
    params = read_params(scope, built.param_names)
    assert max(float(np.max(np.abs(params[n] - ref_params[n]))) for n in ref_params) <= 1e-6


def test_disable_restores_paddle():
    guard = "name_a_schedule_paddle_lacks.<locals>.pipeline_pass"  # (on since the import)
    ps_strategy.enable_strategy()
    ps_strategy.disable_strategy()
    assert pir_pass.pipeline_pass.__qualname__ == engine.pipeline_pass.__qualname__ == guard
    paddle_patches.disable("schedule_names")
    try:
        original = pir_pass.pipeline_pass
        assert original.__qualname__ == "pipeline_pass" and engine.pipeline_pass is original
        was = registration.is_enabled()
        ps_strategy.enable_strategy()
        assert registration.is_enabled()
        ps_strategy.disable_strategy()
        assert pir_pass.pipeline_pass is original and engine.pipeline_pass is original
        assert registration.is_enabled() == was
        assert not ps_strategy.is_strategy_enabled()
    finally:
        paddle_patches.enable("schedule_names")


def test_bad_strategy_values_are_named(enabled):
    built = build_gpt(num_stages=PP * VPP, hidden=16, batch_size=2 * M)
    with pytest.raises(ValueError, match="schedule"):
        pir_pass.pipeline_pass([built.main], [built.main], _pipeline_strategy("NoSuchSchedule"))
    with pytest.raises(ValueError, match=r"^strategy.pipeline.accumulate_steps must be >= 1, "
                                         r"got 0$"):
        pir_pass.pipeline_pass([built.main], [built.main], _pipeline_strategy("ZBV", m=0))


def test_engine_strategy_errors_name_the_field():
    # what the engine hook raises when the engine is built (Engine.__init__)
    with pytest.raises(ValueError) as e:
        ps_strategy.check_strategy(_pipeline_strategy("ZBV", vpp=1))
    assert str(e.value) == ("strategy.pipeline.schedule_mode='ZBV' cannot serve this strategy: "
                            "strategy.pipeline.vpp_degree must be 2 for ZBV, got 1")
    with pytest.raises(ValueError, match=r"^strategy.pipeline: unknown schedule 'NoSuch'"):
        ps_strategy.check_strategy(_pipeline_strategy("NoSuch", vpp=1))
    with pytest.raises(TypeError, match=r"^strategy.pipeline.vpp_degree must be an int, got "
                                        r"float 2.5"):  # the fields first, as the hook checks
        ps_strategy.check_strategy(_pipeline_strategy("ZBV", vpp=2.5))
    with pytest.raises(ValueError, match=r"^strategy.pipeline.vpp_seg_method is empty"):
        ps_strategy.check_strategy(_pipeline_strategy("zb-v", vpp=2))
    zbv = _pipeline_strategy("zb-v", vpp=2)
    zbv.vpp_seg_method = "DecoderBlock"
    assert ps_strategy.check_strategy(zbv).schedule == "ZBV"


COST_FILE = DATA / "profiled_mlp_pp2_vpp1.json"


def test_a_cost_file_given_to_the_strategy_steers_auto(enabled):
    """``use_costs(strategy, FILE)``: the engine's schedule is searched with the measured costs
    (the strategy check and the pass), not the defaults."""
    from pipesplit.job_list import Costs

    strategy = paddle.distributed.Strategy()
    for field, value in (("enable", True), ("schedule_mode", "auto"), ("pp_degree", 2),
                         ("vpp_degree", 1), ("accumulate_steps", 4)):
        setattr(strategy.pipeline, field, value)
    ps_strategy.use_costs(strategy, str(COST_FILE))
    measured = Costs.load(str(COST_FILE))
    assert ps_strategy.check_strategy(strategy.pipeline).costs == measured
    built = build_gpt(num_stages=2, hidden=16, batch_size=8, seed=3)
    ps_strategy.pipeline_pass([built.main], [built.main], strategy.pipeline)
    pipeline = ps_strategy.last_pipeline()
    assert pipeline.config.costs == measured and pipeline.schedule.options["costs"] == measured
    default = ps_strategy.config_from_strategy(_pipeline_strategy("auto", vpp=1, m=4))
    assert default.costs is None


@pytest.mark.parametrize("costs,error,message", [
    (3, TypeError, "costs must be a Costs, a dict or the path of a cost file, got int"),
    ("no/such/costs.json", ValueError, "costs: no cost file 'no/such/costs.json'"),
    ({"forward": 1}, ValueError, "costs lack"),
])
def test_bad_costs_for_the_strategy_are_refused(costs, error, message):
    strategy = paddle.distributed.Strategy()
    with pytest.raises(error, match=message):
        ps_strategy.use_costs(strategy, costs)
    assert not hasattr(strategy.pipeline, HANDLE)
    with pytest.raises(TypeError, match="strategy must be a paddle.distributed.Strategy"):
        ps_strategy.use_costs(object(), str(COST_FILE))


def test_a_memory_budget_is_kept_in_bytes_and_asks_for_the_measured_step():
    """``use_memory_budget``: bytes on the user's strategy; ``auto`` then measures step 1 even
    with costs given (the bytes come from that step); None takes it back."""
    from pipesplit.passes.engine.user_options import check_memory_budget, measured_step

    pipeline = _pipeline_strategy("auto", vpp=1)
    ps_strategy.use_costs(pipeline, str(COST_FILE))
    assert measured_step(pipeline) is None
    ps_strategy.use_memory_budget(pipeline, "48MB")
    assert getattr(pipeline, HANDLE).memory_budget == 48 << 20
    assert measured_step(pipeline) == 1
    check_memory_budget(pipeline)  # auto, measured: served
    ps_strategy.use_memory_budget(pipeline, None)
    assert getattr(pipeline, HANDLE).memory_budget is None and measured_step(pipeline) is None


@pytest.mark.parametrize("mode, measure, message", [
    ("1F1B", 1, "schedule_mode '1F1B' does not search; only \\['auto', 'autoV'\\]"),
    ("auto", None, "measure_costs\\(strategy, None\\) turned it off")])
def test_a_memory_budget_the_engine_cannot_serve_is_refused(mode, measure, message):
    from pipesplit.passes.engine.user_options import check_memory_budget

    pipeline = _pipeline_strategy(mode, vpp=1)
    ps_strategy.use_memory_budget(pipeline, 64 << 20)
    ps_strategy.measure_costs(pipeline, measure)
    with pytest.raises(ValueError, match=message):
        check_memory_budget(pipeline)


@pytest.mark.parametrize("budget, error, message", [
    ("48", ValueError, "budget must be bytes with a suffix"), (-1, ValueError, "> 0 bytes"),
    (1.5, TypeError, "budget must be an int of bytes")])
def test_bad_memory_budgets_are_refused_and_change_nothing(budget, error, message):
    strategy = paddle.distributed.Strategy()
    with pytest.raises(error, match=message):
        ps_strategy.use_memory_budget(strategy, budget)
    assert not hasattr(strategy.pipeline, HANDLE)


def _attached(pipeline):
    """``pipeline`` with an engine's session attached, its request resolved once, as
    ``Engine.__init__``'s hook attaches it."""
    from pipesplit.passes.engine.session import EngineSession
    from pipesplit.passes.engine.state import UserOptions
    from pipesplit.passes.engine.strategy_checks import checked_request

    state = EngineSession(checked_request(pipeline), UserOptions(), None, {}, frozenset())
    setattr(pipeline, HANDLE, state)
    return state


def test_the_engine_reads_the_request_from_its_state():
    """Resolved once: the user's spelling, the spec, pp, vpp, the placement and whether the
    schedule searches; the strategy's fields are not read again (nor rewritten)."""
    pipeline = _pipeline_strategy("auto-v", vpp=2)
    state = _attached(pipeline)
    request = state.request
    assert (request.name, request.spec.name, request.pp, request.vpp) == ("auto-v", "autoV", 2, 2)
    assert request.placement.kind == "v" and request.searches and state.requested == "auto-v"
    pipeline.pp_degree, pipeline.vpp_degree = 4, 1  # (no later reader looks at them)
    config = ps_strategy.config_from_strategy(pipeline, pp_stage=1)
    assert (config.pp_degree, config.vpp_degree, config.pp_stage) == (2, 2, 1)
    assert ps_strategy.requested_schedule(pipeline) == "auto-v" == pipeline.schedule_mode


def test_paddle_is_shown_vpp_only_while_its_own_code_tests_for_it():
    """``Engine._parallel_pir`` and ``Engine.run`` (Paddle's chunk completion and check, its
    loss fetch from ``forward{vpp-1}``) see ``schedule_mode == "VPP"``; the engine's copy keeps
    the user's name before and after (after a failed call too); Paddle's own engine (no
    state) is left alone."""
    import types

    from pipesplit.passes.engine.hooks import shown_vpp

    pipeline = _pipeline_strategy("ZBV", vpp=2)
    engine = types.SimpleNamespace(_strategy=types.SimpleNamespace(pipeline=pipeline))
    seen = []

    def paddle_code(self, fail=False):
        seen.append(self._strategy.pipeline.schedule_mode)
        if fail:
            raise RuntimeError("a failed step")
        return "logs"

    shown = shown_vpp(paddle_code)
    assert shown(engine) == "logs"  # Paddle's own engine
    _attached(pipeline)
    assert shown(engine) == "logs"
    with pytest.raises(RuntimeError, match="a failed step"):
        shown(engine, fail=True)
    assert seen == ["ZBV", "VPP", "VPP"] and pipeline.schedule_mode == "ZBV"


def test_one_rule_says_which_schedules_search():
    from pipesplit.job_list.auto import AUTO_NAMES
    from pipesplit.job_list.registry import get_spec, schedule_names, searching_schedules

    assert searching_schedules() == list(AUTO_NAMES) == ["auto", "autoV"]
    assert [n for n in schedule_names() if get_spec(n).searches] == list(AUTO_NAMES)


def test_a_replanned_config_is_checked_like_any_other():
    """A re-plan's config (new costs, a memory limit) goes through the same checks as every
    config (``PipelineConfig.replaced``), never ``dataclasses.replace``."""
    from dataclasses import replace

    from pipesplit.job_list import Costs
    from pipesplit.job_list.request import PipelineConfig

    fixed = PipelineConfig.from_attrs("1F1B", dict(num_micro_batches=4, pp_degree=2))
    with pytest.raises(ValueError, match="memory_limit is not used by schedule 1F1B"):
        fixed.replaced(memory_limit=3.0)
    with pytest.raises(ValueError, match="costs.forward has 3 entries; the schedule has 2"):
        fixed.replaced(costs=Costs(forward=[1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="pp_stage must be < pp_degree"):
        fixed.replaced(pp_stage=2)
    assert fixed.replaced(pp_stage=1) == replace(fixed, pp_stage=1)
    searched = PipelineConfig.from_attrs("auto", dict(num_micro_batches=4, pp_degree=2))
    assert searched.replaced(memory_limit=3.0).memory_limit == 3.0

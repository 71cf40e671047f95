"""One plan opening (``passes.split.core.open_schedule``, its schedule side ``job_list.opening``): a plan's schedule is built once (the
``auto`` search too), lowered once and simulated once, whoever opens it: the demo, the pass,
and the engine hook, whose strategy check builds the schedule the pass then takes."""
import collections
import importlib

import pytest

from pipesplit.ir_utils import build_gpt
from pipesplit.passes import strategy as ps_strategy

from _strategies import pipeline_section as _pipeline_strategy


@pytest.fixture
def calls(monkeypatch):
    """Counts of schedule builds (by name, at every module that imported ``build_schedule``,
    and by a request), lowerings and latency simulations, at every module that imported the
    function by name."""
    counts = collections.Counter()

    def counting(label, function):
        def counted(*args, **kwargs):
            counts[label] += 1
            return function(*args, **kwargs)
        return counted

    build = counting("build", importlib.import_module("pipesplit.job_list.registry").build_schedule)
    simulate = counting("simulate",
                        importlib.import_module("pipesplit.job_list.latency").simulate_latency)
    lower = importlib.import_module("pipesplit.job_list.lower")
    for name in ("pipesplit.job_list", "pipesplit.job_list.registry"):
        monkeypatch.setattr(importlib.import_module(name), "build_schedule", build)
    # a request builds through its spec, not by name
    request = importlib.import_module("pipesplit.job_list.request").PipelineConfig
    monkeypatch.setattr(request, "build", counting("build", request.build))
    monkeypatch.setattr(lower, "_lower", counting("lower", lower._lower))
    for name in ("pipesplit.job_list.lower", "pipesplit.job_list.simulate",
                 "pipesplit.job_list.opening"):
        monkeypatch.setattr(importlib.import_module(name), "simulate_latency", simulate)
    return counts


def test_the_demo_builds_lowers_and_simulates_once(calls, capsys):
    from pipesplit.tools import demo

    assert demo.main(["--schedule", "ZBV", "--steps", "1", "--quiet"]) == 0
    assert dict(calls) == {"build": 1, "lower": 1, "simulate": 1}
    assert "ZBV: pp=2 vpp=2" in capsys.readouterr().out


@pytest.mark.parametrize("mode,vpp", [("auto", 1), ("ZBV", 2)])
def test_the_engine_check_builds_the_schedule_the_pass_takes(calls, mode, vpp):
    from pipesplit.passes.engine.session import EngineSession
    from pipesplit.passes.engine.state import HANDLE, UserOptions
    from pipesplit.passes.engine.strategy_checks import checked_request

    strategy = _pipeline_strategy(mode, vpp=vpp)
    request = checked_request(strategy)  # what the Engine.__init__ hook does
    searched = calls["simulate"]  # (auto's search simulates its candidates)
    assert calls["build"] == 1
    setattr(strategy, HANDLE, EngineSession(request, UserOptions(), None, {}, frozenset()))
    built = build_gpt(num_stages=2 * vpp, hidden=16, batch_size=8, seed=3)
    ps_strategy.pipeline_pass([built.main], [built.main], strategy)
    assert dict(calls) == {"build": 1, "lower": 1, "simulate": searched + 1}
    assert ps_strategy.last_pipeline().schedule is request.schedule
    assert getattr(strategy, HANDLE).built is ps_strategy.last_pipeline()


def test_a_schedule_requested_for_another_config_is_refused():
    from pipesplit.job_list.request import request_schedule
    from pipesplit.passes import PipelineConfig
    from pipesplit.passes.split.core import open_schedule

    config = PipelineConfig.from_attrs("1F1B", dict(num_micro_batches=4, pp_degree=2))
    other = request_schedule("1F1B", dict(num_micro_batches=6, pp_degree=2))
    built = build_gpt(num_stages=2, hidden=16, batch_size=8, seed=3)
    with pytest.raises(ValueError, match=r"^the request given \(1F1B, pp=2, vpp=1, m=6\) is not "
                                         r"this config's \(1F1B, pp=2, vpp=1, m=4\)$"):
        open_schedule(config, built.main, other)
    mine = request_schedule("1F1B", dict(num_micro_batches=4, pp_degree=2))
    for rank in (None, 0, 1):  # the request, or that on one of its ranks: its schedule taken
        assert open_schedule(config.on_rank(rank), built.main, mine).schedule is mine.schedule

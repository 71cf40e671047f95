"""The request carries its spec: an engine's opening looks the schedule's name up in the
registry once, and a pipeline pass not at all (``get_spec`` counted at every module that
imported it by name); a rank is set on a request without checking it all again."""
from __future__ import annotations

import sys
import types

import paddle
import pytest

from pipesplit.ir_utils import build_gpt
from pipesplit.job_list import registry
from pipesplit.job_list.placement import SizeError
from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes import strategy as ps_strategy
from pipesplit.passes.engine.open_state import check_and_fill_in, open_engine_state
from pipesplit.passes.engine.session import EngineSession
from pipesplit.passes.engine.state import HANDLE, UserOptions
from pipesplit.passes.engine.strategy_checks import checked_request

M = 4


@pytest.fixture
def lookups(monkeypatch):
    """Names looked up in the schedule registry (``registry.get_spec``), wherever imported."""
    looked_up = []
    original = registry.get_spec

    def counted(name):
        looked_up.append(name)
        return original(name)

    for module in list(sys.modules.values()):
        if module is not None and vars(module).get("get_spec") is original:
            monkeypatch.setattr(module, "get_spec", counted)
    return looked_up


def _strategy(mode: str, pp: int, vpp: int):
    """A ``paddle.distributed.Strategy`` whose pipeline asks for ``mode`` on pp x vpp."""
    strategy = paddle.distributed.Strategy()
    fields = dict(enable=True, schedule_mode=mode, pp_degree=pp, vpp_degree=vpp,
                  accumulate_steps=M, vpp_seg_method="Linear" if vpp > 1 else "")
    for name, value in fields.items():
        setattr(strategy.pipeline, name, value)
    return strategy


def _model(blocks: int):
    """A dygraph model of ``blocks`` Linear blocks (the seg method's class)."""
    with paddle.base.dygraph.guard():
        return paddle.nn.Sequential(*[paddle.nn.Linear(4, 4) for _ in range(blocks)])


def _pass_of_the_whole_model(pipeline, stages: int) -> None:
    """One pipeline pass of the engine's pipeline section (its state attached)."""
    built = build_gpt(num_stages=stages, hidden=16, batch_size=8, seed=3)
    ps_strategy.pipeline_pass([built.main], [built.main], pipeline)


@pytest.mark.parametrize("mode,vpp", [("zb-v", 2), ("auto", 1)])
def test_an_engine_opening_looks_up_once_and_a_pass_never(lookups, mode, vpp):
    """The whole opening (``open_engine_state``, one process: pp 1), then a pass."""
    strategy = _strategy(mode, pp=1, vpp=vpp)
    engine = types.SimpleNamespace(_strategy=strategy, _model=_model(blocks=2))
    with paddle.base.dygraph.guard():  # (dist.to_static opens an engine in dynamic mode)
        state = open_engine_state(engine, make=EngineSession)
    assert lookups == [mode]
    setattr(strategy.pipeline, HANDLE, state)
    del lookups[:]
    _pass_of_the_whole_model(strategy.pipeline, stages=vpp)
    assert lookups == []


@pytest.mark.parametrize("mode,vpp", [("ZBV", 2), ("auto", 1), ("autoV", 2), ("1F1B", 1)])
def test_the_opening_of_a_pipeline_looks_up_once_and_its_passes_never(lookups, mode, vpp):
    """pp 2: what the opening calls for 2 processes, then each rank's config and a pass."""
    strategy = _strategy(mode, pp=2, vpp=vpp)
    pipeline = strategy.pipeline
    with paddle.base.dygraph.guard():  # (dist.to_static opens an engine in dynamic mode)
        check_and_fill_in(strategy, _model(blocks=2 * vpp), world_size=2)
        request = checked_request(pipeline)
    assert lookups == [mode]
    setattr(pipeline, HANDLE, EngineSession(request, UserOptions(), None, {},
                                            frozenset()))
    del lookups[:]
    for rank in range(2):
        assert ps_strategy.config_from_strategy(pipeline, pp_stage=rank).pp_stage == rank
    _pass_of_the_whole_model(pipeline, stages=2 * vpp)
    assert lookups == []
    assert ps_strategy.last_pipeline().schedule is request.schedule


def test_a_request_on_a_rank_is_the_request_with_that_rank():
    config = PipelineConfig.from_attrs("zb-v", dict(num_micro_batches=M, pp_degree=2,
                                                    vpp_degree=2))
    assert config.schedule == "ZBV" and config.placement.kind == "v"
    for rank in (None, 0, 1):
        on_rank = config.on_rank(rank)
        assert on_rank == config.replaced(pp_stage=rank) and on_rank.pp_stage == rank
        assert hash(on_rank) == hash(config.replaced(pp_stage=rank))
        assert on_rank.spec is config.spec and on_rank.placement == config.placement
    with pytest.raises(ValueError, match=r"^pp_stage must be < pp_degree \(2\), got 2$"):
        config.on_rank(2)
    with pytest.raises(SizeError, match=r"^pp_stage must be >= 0, got -1$"):
        config.on_rank(-1)
    with pytest.raises(TypeError, match=r"^pp_stage must be an int, got bool True$"):
        config.on_rank(True)
    assert repr(config).startswith("PipelineConfig(schedule='ZBV', num_micro_batches=4, ")


def _calls_into_job_list(forms):
    """A tracer and the calls it records: (function, caller's file) for each function of
    ``job_list`` entered from ``passes`` with one of ``forms`` as an argument (``self``
    included; a property is a read of what was resolved, not a call)."""
    import inspect
    from pathlib import Path

    import pipesplit
    root = Path(pipesplit.__file__).resolve().parent
    # (in a checkout pipesplit/ links to the folders: compare where the files really are)
    job_list, passes = str((root / "job_list").resolve()), str((root / "passes").resolve())
    calls = []

    def tracer(frame, event, arg):
        code = frame.f_code
        if event != "call" or not str(Path(code.co_filename).resolve()).startswith(job_list):
            return None
        caller = frame.f_back
        if caller is None or not str(Path(caller.f_code.co_filename).resolve()).startswith(passes):
            return None
        values = inspect.getargvalues(frame)
        args = [values.locals[name] for name in values.args if name in values.locals]
        args += list(values.locals.get(values.varargs, ())) if values.varargs else []
        args += list(values.locals.get(values.keywords, {}).values()) if values.keywords else []
        me = values.locals.get("self")
        if me is not None and isinstance(inspect.getattr_static(type(me), code.co_name, None),
                                         property):
            return None
        if any(form(value) for value in args for form in forms):
            calls.append((code.co_name, Path(caller.f_code.co_filename).name))
        return None
    return tracer, calls


@pytest.mark.parametrize("mode,vpp", [("zb-v", 2), ("auto", 1), ("1F1B", 1)])
def test_passes_ask_job_list_about_the_request_once(mode, vpp):
    """The walk of ``schedule_mode`` from the engine's opening to the plan (docs/design.md,
    "Data flow"): passes' code enters job_list with the request in one of its forms (the name,
    its spec, a config) once, ``request_schedule``; after it, what job_list answered is read
    (a rank's config, the built schedule), never asked again."""
    from pipesplit.job_list.registry import ScheduleSpec
    from pipesplit.job_list.request import RequestedSchedule

    forms = (lambda v: isinstance(v, (ScheduleSpec, PipelineConfig, RequestedSchedule)),
             lambda v: isinstance(v, str) and v == mode)
    tracer, calls = _calls_into_job_list(forms)
    strategy = _strategy(mode, pp=1, vpp=vpp)
    engine = types.SimpleNamespace(_strategy=strategy, _model=_model(blocks=2))
    sys.settrace(tracer)
    try:
        with paddle.base.dygraph.guard():  # (dist.to_static opens an engine in dynamic mode)
            state = open_engine_state(engine, make=EngineSession)
        setattr(strategy.pipeline, HANDLE, state)
        _pass_of_the_whole_model(strategy.pipeline, stages=vpp)
    finally:
        sys.settrace(None)
    assert calls == [("request_schedule", "strategy_config.py")]
    assert ps_strategy.last_pipeline().schedule is state.request.schedule

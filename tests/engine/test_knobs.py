"""The table of every strategy field that meets a pipeline (``passes/engine/knobs.py``), walked:
every field of Paddle's ``pipeline`` and ``gradient_merge`` sections has a row, the table in
``docs/engine.md`` is the code's, and each handler refuses or says what its row says, on real
``paddle.distributed.Strategy()`` objects (one process, nothing built).  The launches that train
with each knob set as a user sets it: ``tests/multiprocess/test_user_conventions.py``."""
from __future__ import annotations

import re
import warnings

import pytest

import paddle.distributed as dist
from paddle.distributed.auto_parallel.constants import get_category_default_config

from pipesplit.job_list import build_schedule
from pipesplit.job_list.simulate import simulate
from pipesplit.passes.engine import knobs
from pipesplit.passes.engine.open_state import opening_of
from pipesplit.passes.engine.strategy_config import resolve_request, runtimes_costs
from pipesplit.passes.engine.user_options import measured_step, use_costs, use_memory_budget

from _paths import REPO


def _strategy(schedule="1F1B", **fields):
    strategy = dist.Strategy()
    strategy.pipeline.enable = True
    strategy.pipeline.schedule_mode = schedule
    strategy.pipeline.pp_degree = 2
    strategy.pipeline.vpp_degree = 2 if schedule in ("ZBV", "autoV", "VPP") else 1
    strategy.pipeline.vpp_seg_method = "DecoderBlock"
    strategy.pipeline.accumulate_steps = 4
    for path, value in fields.items():
        section, field = path.split("__")
        setattr(getattr(strategy, section), field, value)
    return strategy


def _said(strategy, on_cpu=True):
    """What the engine's opening refuses and says: with the request it resolved."""
    opening = opening_of(strategy, on_cpu, resolve_request(strategy.pipeline))
    knobs.refuse_what_cannot_work(opening)
    return knobs.notices_at_the_opening(opening)


def test_every_field_of_the_pipeline_and_gradient_merge_sections_has_a_row():
    rows = {k.path for k in knobs.KNOBS}
    for section in ("pipeline", "gradient_merge"):
        for field in get_category_default_config(section):
            assert f"{section}.{field}" in rows, f"{section}.{field} has no row"
    assert all(k.verdict in knobs.VERDICTS for k in knobs.KNOBS)
    assert len(rows) == len(knobs.KNOBS)  # one row per field


def test_the_docs_table_is_the_code_table():
    text = (REPO / "docs" / "engine.md").read_text()
    table = text[text.index("## Every knob"):]
    found = dict(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| ([a-z ]+) \|", table, re.M))
    assert found == {k.path: k.verdict for k in knobs.KNOBS}


def test_defaults_say_nothing_and_refuse_nothing():
    for schedule in ("1F1B", "ZBV", "auto"):
        assert _said(_strategy(schedule)) == ()


@pytest.mark.parametrize("fields,start", [
    ({"pipeline__enable_send_recv_overlap": True},
     "strategy.pipeline.enable_send_recv_overlap=True has no effect on this CPU build"),
    ({"gradient_merge__avg": False}, "strategy.gradient_merge.avg=False: the micro-batch "
                                     "gradients are averaged"),
    ({"pipeline__auto_parallel_sync_shared_params": True},
     "strategy.pipeline.auto_parallel_sync_shared_params=True: a weight read on another stage"),
    ({"pipeline__generation_batch_size": 2},
     "strategy.pipeline.generation_batch_size=2 has no effect"),
    ({"pipeline__job_schedule_profiler_start": 3},
     "strategy.pipeline.job_schedule_profiler_start=3 has no effect"),
    ({"pipeline__memory_limit_times": 1.5},
     "strategy.pipeline.memory_limit_times=1.5 has no effect on schedule_mode='1F1B'"),
])
def test_a_field_not_served_as_asked_is_said_once(fields, start):
    said = _said(_strategy(**fields))
    assert len(said) == 1 and said[0].startswith(start), said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        knobs.say(said)
    assert [str(w.message) for w in caught] == list(said)
    assert all(w.category is knobs.PipesplitNotice for w in caught)


def test_overlap_is_honoured_where_streams_exist():
    assert _said(_strategy(pipeline__enable_send_recv_overlap=True), on_cpu=False) == ()


@pytest.mark.parametrize("schedule,fields,error,match", [
    ("1F1B", {"sharding__enable_overlap": True}, ValueError,
     r"strategy.sharding.enable_overlap=True beside a pipeline cannot run on a CPU build"),
    ("1F1B", {"sharding__enable_tensor_fusion": True}, ValueError,
     r"strategy.sharding.enable_tensor_fusion=True beside a pipeline"),
    ("auto", {"fused_passes__enable": True, "fused_passes__gemm_epilogue": True}, ValueError,
     r"strategy.fused_passes with schedule_mode='auto' on a CPU build"),
    ("auto", {"pipeline__program_runtimes": [1, 2]}, ValueError,
     r"strategy.pipeline.program_runtimes must be 5 finite numbers >= 0"),
    ("auto", {"pipeline__program_runtimes": "1,2,3,4,5"}, TypeError,
     r"strategy.pipeline.program_runtimes must be a list of 5 numbers"),
    ("auto", {"pipeline__memory_limit_times": "2"}, TypeError,
     r"strategy.pipeline.memory_limit_times must be a number"),
    ("auto", {"pipeline__memory_limit_times": 0}, ValueError,
     r"strategy.pipeline.memory_limit_times must be > 0"),
])
def test_what_cannot_work_is_refused_by_name(schedule, fields, error, match):
    strategy = _strategy(schedule, **fields)
    before = strategy.to_dict() if hasattr(strategy, "to_dict") else None
    with pytest.raises(error, match=match):
        _said(strategy)
    if before is not None:
        assert strategy.to_dict() == before  # changes nothing


def test_a_cuda_build_keeps_sharding_overlap_and_fused_passes_to_paddle():
    _said(_strategy(sharding__enable_overlap=True), on_cpu=False)
    strategy = _strategy("auto", fused_passes__enable=True, fused_passes__gemm_epilogue=True)
    use_costs(strategy, {"forward": 1.0, "backward_b": 1.0, "backward_w": 1.0})  # no re-plan
    _said(strategy)


def test_two_sources_of_one_setting_are_refused():
    strategy = _strategy("auto", pipeline__program_runtimes=[1, 3, 1, 1, 2])
    use_costs(strategy, {"forward": 1.0, "backward_b": 1.0, "backward_w": 1.0})
    with pytest.raises(ValueError, match=r"program_runtimes and use_costs.*both give job costs"):
        _said(strategy)
    strategy = _strategy("auto", pipeline__memory_limit_times=2)
    use_memory_budget(strategy, "1GB")
    with pytest.raises(ValueError, match=r"memory_limit_times=2 and use_memory_budget"):
        _said(strategy)


def test_program_runtimes_become_the_job_costs_and_nothing_is_measured():
    strategy = _strategy("auto", pipeline__program_runtimes=[2, 3, 1, 4, 0.5])
    costs = runtimes_costs(strategy.pipeline, 2)
    assert (costs.forward, costs.backward_b, costs.backward_w, costs.comm) == \
        ([2.0, 6.0], 3.0, 1.0, 0.5)
    assert resolve_request(strategy.pipeline).config.costs == costs
    assert measured_step(strategy.pipeline) is None
    assert runtimes_costs(_strategy("auto").pipeline, 2) is None  # Paddle's default: unset


def test_memory_limit_times_is_that_multiple_of_1f1b_peak_per_rank():
    peaks = simulate(build_schedule("1F1B", pp=2, vpp=1, m=4)).peak_memory
    for schedule, vpp in (("auto", 1), ("autoV", 2)):
        config = resolve_request(_strategy(schedule, pipeline__memory_limit_times=1.5)
                                 .pipeline).config
        assert list(config.memory_limit) == [1.5 * p * vpp for p in peaks]
    assert resolve_request(_strategy("ZBV", pipeline__memory_limit_times=2).pipeline) \
        .config.memory_limit is None  # a fixed order: said, not applied


def test_micro_batch_size_is_said_only_when_the_batch_cuts_otherwise():
    assert knobs.micro_batch_notice(2, 8, 4) is None
    assert knobs.micro_batch_notice(3, 8, 4) == (
        "strategy.pipeline.micro_batch_size=3 has no effect: the batch of 8 is cut into "
        "accumulate_steps=4 micro-batches of 2, as Paddle's engine cuts it")

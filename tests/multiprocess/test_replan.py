"""``auto`` through the engine measures its jobs and re-plans once (pipesplit.passes.measure.replan).

The pieces with fixed numbers (deterministic): the costs every process's measurement gives,
a rank's measurement of its jobs, the step each strategy measures; the profiler's job events
from a real plan run; and, on two processes in one launch (``tests/workers/engine_replan.py``), the
measured re-plan, a re-plan with fixed costs injected and a given cost file.
"""
from __future__ import annotations

import contextlib
import re
import json
import sys

import pytest

import paddle

from pipesplit.job_list import Costs, build_schedule
from pipesplit.passes import strategy as ps_strategy
from pipesplit.passes.engine.state import HANDLE
from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes.measure.profile import job_times, record_jobs
from pipesplit.passes.measure.replan import MEASURED_STEP, costs_from, rank_measurement


from _paths import WORKERS  # noqa: E402

sys.path.insert(0, str(WORKERS))  # the worker's settings, checked here
from engine_replan import COST_FILE, INJECTED, STEPS  # noqa: E402
from _launch import launch  # noqa: E402

SCRIPT = WORKERS / "engine_replan.py"
TOL = 1e-5


def _measurement(stages, comm, optimizer=1.0):
    return {"stages": {k: {str(s): v for s, v in d.items()} for k, d in stages.items()},
            "comm": comm, "optimizer": optimizer}


def test_costs_from_every_process_measurement():
    """Per stage the median over the processes that ran it; B = I + W where only I / W ran;
    comm the median of each process's fastest transfer; the same on every process."""
    everyone = [
        _measurement({"forward": {0: 2.0}, "backward_b": {0: 1.0}, "backward_w": {0: 3.0}}, 0.5),
        _measurement({"forward": {1: 4.0}, "backward_b": {1: 2.0}, "backward_w": {1: 1.0}}, 0.3),
        # a data-parallel copy of stage 1
        _measurement({"forward": {1: 6.0}, "backward_b": {1: 2.0}, "backward_w": {1: 1.0}}, 0.1),
    ]
    costs = costs_from(everyone, 2, "rendezvous")
    assert costs == Costs(forward=(2.0, 5.0), backward_b=(1.0, 2.0), backward_w=(3.0, 1.0),
                          comm=0.3, comm_mode="rendezvous")
    assert costs.of("backward", 1) == 3.0
    assert costs_from(list(reversed(everyone)), 2, "rendezvous") == costs


def test_costs_from_a_stage_that_ran_b_only():
    everyone = [_measurement({"forward": {0: 2.0}, "backward": {0: 4.0}}, None),
                _measurement({"forward": {1: 1.0}, "backward_b": {1: 1.0},
                              "backward_w": {1: 0.5}}, None)]
    costs = costs_from(everyone, 2, "latency")
    assert costs.backward == (4.0, 1.5) and costs.backward_b == (2.0, 1.0)
    assert costs.backward_w == (2.0, 0.5) and costs.comm == 0.0


def test_costs_from_refuses_a_stage_nobody_measured():
    one = [_measurement({"forward": {0: 2.0}, "backward": {0: 4.0}}, 0.1)]
    with pytest.raises(ValueError, match=r"no forward / backward times for stage\(s\) \[1\] of 2"):
        costs_from(one, 2, "latency")


def test_a_rank_measures_its_chunks_at_their_global_stages():
    """ZBV (V placement), pipeline rank 0 of 2 holds stages 0 and 3: local chunk 1 is stage 3.
    Medians over micro-batches; the fastest comm job; jobs that are not pipesplit's ignored."""
    config = PipelineConfig.from_attrs("ZBV", dict(num_micro_batches=2, pp_degree=2,
                                                   vpp_degree=2, pp_stage=0))
    jobs = [("forward0", 0, 1.0), ("forward0", 1, 3.0), ("forward1", 0, 5.0),
            ("forward1", 1, 6.0), ("send_forward0", 0, 0.7), ("recv_backward1", 0, 0.2),
            ("backward_b1", 0, 2.0), ("backward_w1", 0, 4.0), ("optimizer", 0, 9.0),
            ("something_else", 0, 100.0)]
    got = rank_measurement(jobs, config)
    assert got == {"stages": {"forward": {"0": 2.0, "3": 5.5}, "backward_b": {"3": 2.0},
                              "backward_w": {"3": 4.0}},
                   "comm": 0.2, "optimizer": 9.0}
    assert job_times(jobs)["forward0"] == [1.0, 3.0]
    with pytest.raises(ValueError, match="needs config.pp_stage"):
        rank_measurement(jobs, PipelineConfig.from_attrs("ZBV", dict(
            num_micro_batches=2, pp_degree=2, vpp_degree=2)))


@contextlib.contextmanager
def _static_mode():
    """Static mode for a block, then the mode it found (other test files build programs in
    the static mode their module set at collection)."""
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        yield
    finally:
        if was_dynamic:
            paddle.disable_static()


def test_the_profiler_names_every_job_a_plan_ran():
    """Paddle's executor records each job as ``<type>-<micro-batch>``: the jobs read back are
    the plan's own order, each with a time."""
    from pipesplit.ir_utils import init_scope
    from pipesplit.ir_utils.measure import TimedExecutor
    from pipesplit.passes import apply_pipeline
    from pipesplit.passes.measure.profile import build_model

    with _static_mode():
        model = build_model("gpt", 2, 4, hidden=16)
        pipeline = apply_pipeline(model.main, model.startup, "ZBH1",
                                  dict(num_micro_batches=4, pp_degree=2))
        place = paddle.CPUPlace()
        ex = TimedExecutor(pipeline.plan, init_scope(model, pipeline.split, place),
                           model.make_batch(0), place)
        ex.run()
        _, jobs = record_jobs(ex.run)
    assert [(t, mb) for t, mb, _ in jobs] == list(pipeline.job_order)
    assert all(ms > 0 for _, _, ms in jobs)


def _recording_threads(run) -> int:
    """How many threads recorded events while Paddle's profiler watched ``run()``."""
    import paddle.profiler as profiler

    prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU], on_trace_ready=lambda _: None)
    prof.start()
    try:
        run()
    finally:
        prof.stop()
    return sum(1 for root in prof.profiler_result.get_data().values() if root.children_node)


def test_the_measured_steps_interpreters_run_every_op_on_the_profiling_thread():
    """Interpreters built and run under ``ops_on_this_thread`` (as the steps up to the measured
    one build them and the measured one runs) record every event on the calling thread (the
    profiler's unlocked gather then races with no worker); those built and run after it use
    Paddle's worker threads again; the flag is as it was.  (Paddle 3.3.1 reads the flag when it
    builds an interpreter, 3.0.0 each time one runs: pipesplit holds it on for both.)"""
    from pipesplit.ir_utils import init_scope
    from pipesplit.ir_utils.measure import TimedExecutor
    from pipesplit.passes import apply_pipeline
    from pipesplit.passes.measure.profile import build_model
    from pipesplit.passes.measure.profile import ops_on_this_thread

    flag = "FLAGS_enable_pir_in_executor_trace_run"
    with _static_mode():
        model = build_model("gpt", 2, 4, hidden=16)
        pipeline = apply_pipeline(model.main, model.startup, "ZBH1",
                                  dict(num_micro_batches=4, pp_degree=2))
        place = paddle.CPUPlace()

        def executor():
            ex = TimedExecutor(pipeline.plan, init_scope(model, pipeline.split, place),
                               model.make_batch(0), place)
            ex.run()  # (builds the interpreters)
            return ex

        with ops_on_this_thread():
            measured = executor()
            assert _recording_threads(measured.run) == 1
        assert paddle.get_flags([flag])[flag] is False
        assert _recording_threads(executor().run) > 1


def _pipeline(schedule="auto"):
    strategy = paddle.distributed.Strategy()
    strategy.pipeline.schedule_mode = schedule
    return strategy


def test_which_step_each_strategy_measures(monkeypatch):
    from pipesplit.passes.engine.user_options import measured_step

    assert measured_step(_pipeline("auto").pipeline) == MEASURED_STEP == 1
    assert measured_step(_pipeline("auto-v").pipeline) == MEASURED_STEP
    assert measured_step(_pipeline("ZBV").pipeline) is None  # its order needs no costs
    given = _pipeline("auto")
    ps_strategy.use_costs(given, str(COST_FILE))
    assert measured_step(given.pipeline) is None
    off = _pipeline("auto")
    ps_strategy.measure_costs(off, None)
    assert measured_step(off.pipeline) is None
    chosen = _pipeline("1F1B")
    ps_strategy.measure_costs(chosen.pipeline, 3)
    assert measured_step(chosen.pipeline) == 3


@pytest.mark.parametrize("step,error,message", [
    ("1", TypeError, "step must be an int or None, got str"),
    (True, TypeError, "step must be an int or None, got bool"),
    (-1, ValueError, r"step must be >= 0 \(a 0-based training step\), got -1"),
])
def test_bad_measure_steps_are_refused(step, error, message):
    strategy = _pipeline()
    with pytest.raises(error, match=message):
        ps_strategy.measure_costs(strategy, step)
    assert not hasattr(strategy.pipeline, HANDLE)
    with pytest.raises(TypeError, match="strategy must be a paddle.distributed.Strategy"):
        ps_strategy.measure_costs(object())


def test_replan_needs_a_dist_model():
    with pytest.raises(TypeError, match="dist_model must be what dist.to_static returned"):
        ps_strategy.replan(object(), INJECTED)
    with pytest.raises(TypeError, match="dist_model must be what dist.to_static returned"):
        ps_strategy.replanned(3)


def _store(master: bool, port: int):
    from paddle.base import core

    return core.TCPStore("127.0.0.1", port, master, 1, 30)


def test_the_rendezvous_names_the_rank_that_did_not_arrive(monkeypatch):
    """Two processes' arrivals through a real TCP store (one a second client in a thread):
    together they pass; alone, rank 0 gives up after the bound, naming rank 1 and the phase."""
    import threading
    from _launch import free_port
    from pipesplit.passes.transport.rendezvous import (TIMEOUT_ENV, rendezvous,
                                                      rendezvous_timeout)

    port = free_port()
    store = _store(True, port)
    with pytest.raises(RuntimeError, match=re.escape(
            "pipesplit: rank 0 waited 0.2 s at the rendezvous before the measured training "
            "step 1; rank(s) [1] of 2 did not arrive")):
        rendezvous("alone", "the measured training step 1", 0, 2, store, timeout_s=0.2)
    peer = threading.Thread(target=rendezvous, args=("together", "x", 1, 2, _store(False, port),
                                                     5.0))
    peer.start()
    assert rendezvous("together", "x", 0, 2, store, timeout_s=5.0) < 5.0
    peer.join()
    monkeypatch.setenv(TIMEOUT_ENV, "45")
    assert rendezvous_timeout() == 45.0
    for bad in ("0", "-3", "soon", "inf", "nan"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"{TIMEOUT_ENV} must be a positive number of "
                                             f"seconds, got '{bad}'"):
            rendezvous_timeout()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    work = tmp_path_factory.mktemp("replan")
    done = launch(work, SCRIPT, work)
    assert done.returncode == 0, done.report()
    return {name: [json.loads((work / f"{name}.rank{r}.json").read_text()) for r in range(2)]
            for name in ("measured", "injected", "given")}


def _trains_like_the_reference(ranks):
    holder = next(r for r in ranks if r["losses"])
    assert len(holder["losses"]) == STEPS
    assert max(abs(a - b) for got, ref in zip(holder["losses"], holder["reference_losses"])
               for a, b in zip(got, ref)) < TOL
    assert max(r["max_param_diff"] for r in ranks) < TOL


@pytest.mark.slow
def test_auto_measures_step_1_and_replans_once(launched):
    """Both ranks measured step 1, agreed on the same costs and ran the new order from step 2
    on (read back from the profiler on each rank, the rank that fetches no loss too); the
    losses and parameters stay those of the one-process reference."""
    ranks = launched["measured"]
    done = [r["replanned"] for r in ranks]
    assert [d["step"] for d in done] == [1, 1]
    assert done[0]["costs"] == done[1]["costs"]
    costs = Costs.from_dict(done[0]["costs"])
    assert costs.comm_mode == "rendezvous" and len(costs.forward) == 2
    assert all(t > 0 for t in costs.forward + costs.backward_w)
    for r in ranks:
        assert r["executed_after"] == r["replanned"]["after_order"]
        assert r["plan_costs"] == done[0]["costs"]
        # every phase timed, the ranks met before the measured step and after the re-plan
        assert list(r["replanned"]["timings"]) == [
            "profiler_start_s", "wait_before_step_s", "step_s", "exchange_s", "replan_s",
            "wait_after_replan_s"]
    _trains_like_the_reference(ranks)


@pytest.mark.slow
def test_a_replan_with_injected_costs_runs_their_schedule(launched):
    """``replan(dist_model, costs)`` with fixed costs: the schedule the search gives for them
    (not the default one), run from the next step, with the reference's losses."""
    ranks = launched["injected"]
    expected = build_schedule("auto", 2, 1, 4, costs=INJECTED).ranks
    default = build_schedule("auto", 2, 1, 4).ranks
    assert expected != default
    for r in ranks:
        assert r["replanned"]["step"] is None
        assert r["replanned"]["costs"] == INJECTED.to_dict()
        assert r["replanned"]["after_ranks"] == [[str(j) for j in jobs] for jobs in expected]
        assert r["replanned"]["before_order"] != r["replanned"]["after_order"]
        assert r["executed_after"] == r["replanned"]["after_order"]
    _trains_like_the_reference(ranks)


@pytest.mark.slow
def test_a_given_cost_file_is_used_and_nothing_is_measured(launched):
    ranks = launched["given"]
    assert [r["replanned"] for r in ranks] == [None, None]
    assert [r["executed_after"] for r in ranks] == [None, None]
    assert [r["plan_costs"] for r in ranks] == [Costs.load(str(COST_FILE)).to_dict()] * 2
    _trains_like_the_reference(ranks)

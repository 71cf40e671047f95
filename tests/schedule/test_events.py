"""The one event engine (job_list/events.py): the simulator, the search's fast simulator, the
validator and the lowering replay all run on it; the memory walks match passes/profile's."""
import pytest

from pipesplit.job_list import (build_schedule, global_order, lower_comm, schedule_names,
                                serves, simulate)
from pipesplit.job_list.auto import SearchContext
from pipesplit.job_list.events import execute, rank_peaks, serial_memory, walk
from pipesplit.job_list.simulate import Costs
from pipesplit.job_list.validate import ScheduleError

COSTS = Costs(1.0, None, 1.5, 0.5, comm=0.25, w_memory=0.7)


def test_walk_times_a_chain_and_reports_the_blocked_heads():
    # rank 0 runs job 0 then 1; rank 1 runs job 2 (needs 0, across ranks) then 3 (needs 1)
    needs = [(), (), ((0, 0),), ((1, 0), (2, 1))]
    starts = [0.0] * 4
    state = walk([[0, 1], [2, 3]], needs, [1.0, 2.0, 1.0, 1.0], 4, comm=0.5,
                 delta=[1.0, 1.0, 1.0, -1.0], starts=starts)
    assert state.finished and state.blocked() == []
    assert starts == [0.0, 1.0, 1.5, 3.5]
    assert state.clock == [3.0, 4.5] and state.peaks == [2.0, 1.0] and state.peak == 2.0
    # job 0 needs job 1, queued behind it on rank 0; job 2 on rank 1 needs job 0
    stuck = walk([[0, 1], [2]], [((1, 0),), (), ((0, 0),)], [1.0] * 3, 3)
    assert not stuck.finished and stuck.blocked() == [(0, 0), (1, 0)]


@pytest.mark.parametrize("name", [n for n in schedule_names() if n not in ("auto", "autoV")])
def test_search_simulator_agrees_with_simulate(name):
    vpp = 2 if serves(name, 4, 2, 8) else 1
    spec_schedule = build_schedule(name, 4, vpp, 8, split_backward=True)
    result = simulate(spec_schedule, COSTS)
    ctx = SearchContext(spec_schedule.pp, spec_schedule.vpp, spec_schedule.m,
                        spec_schedule.placement.kind, COSTS)
    fast = ctx.simulate(ctx.from_schedule(spec_schedule))
    assert fast[0] == pytest.approx(result.makespan)
    # list order, per rank: never below the timed curve
    assert all(a >= b - 1e-9 for a, b in zip(fast[1], result.peak_memory))


def test_replay_is_the_validating_execution():
    lowered = lower_comm(build_schedule("VPP", 4, 2, 8), COSTS)
    recorded = []
    assert execute(lowered, record=recorded.append).state.finished
    assert recorded == global_order(lowered)
    assert len(recorded) == sum(len(jobs) for jobs in lowered.ranks)


def test_deadlocked_execution_names_its_heads():
    schedule = build_schedule("1F1B", 2, 1, 2)
    ranks = [list(jobs) for jobs in schedule.ranks]
    ranks[1] = ranks[1][1:] + ranks[1][:1]  # rank 1 starts with the backward of mb 0
    bad = schedule.with_ranks(ranks)
    state = execute(bad).state
    assert not state.finished and (1, 0) in state.blocked()
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(bad)


def _reference_rank_peaks(sim, delta):
    """The walk as written before the engine: each rank's compute jobs in order."""
    peaks = []
    for row in sim.timeline:
        level = peak = 0.0
        for t in row:
            if t.job.is_compute:
                level += delta(t.job.kind, t.stage)
                peak = max(peak, level)
        peaks.append(peak)
    return peaks


def _reference_serial_memory(order, delta):
    level, curve = 0.0, []
    for job_type, _ in order:
        kind = job_type.rstrip("0123456789")
        if kind == "optimizer" or kind.startswith(("send", "recv")):
            continue
        level += delta(kind, int(job_type[len(kind):]))
        curve.append(level)
    return max(curve, default=0.0), curve


@pytest.mark.parametrize("name,vpp", (("1F1B", 1), ("ZBH1", 1), ("VPP", 2), ("ZBV", 2)))
def test_memory_walks_match_a_plain_walk(name, vpp):
    schedule = build_schedule(name, 4, vpp, 8, split_backward=True)
    sim = simulate(schedule, COSTS)
    act = [1.0 + 0.5 * s for s in range(schedule.num_stages)]

    def delta(kind, stage):
        return COSTS.memory_delta(kind) * act[stage]

    assert rank_peaks(sim, delta) == _reference_rank_peaks(sim, delta)
    order = [(job.type if job.kind == "optimizer" else
              f"{job.kind}{schedule.stage_of(rank, job)}", rank)
             for rank, job in global_order(schedule, COSTS)]
    assert serial_memory(order, delta) == _reference_serial_memory(order, delta)
    assert any(kind.startswith("send") for kind, _ in order)  # comm jobs are walked past

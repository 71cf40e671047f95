"""The simulator's memory model and its calibrated parameter w_memory."""
import pytest

from pipesplit.job_list import Costs, build_schedule, simulate
from pipesplit.job_list.auto import auto_search, minimum_memory

TIMES = dict(forward=1, backward_b=1, backward_w=1)


def peak(name, pp, vpp, m, split_backward=False, **costs):
    schedule = build_schedule(name, pp, vpp, m, split_backward=split_backward)
    return simulate(schedule, Costs(**TIMES, **costs)).peak_memory


def test_default_model_is_the_zero_bubble_papers():
    assert peak("1F1B", 4, 1, 8) == [4, 3, 2, 1]
    assert max(peak("ZBH1", 4, 1, 8)) <= 4          # half a unit held while W waits
    assert max(peak("ZBV", 4, 2, 8)) <= 8


def test_w_memory_sets_what_a_deferred_w_holds():
    # 1F1B with I right before its W briefly holds the gradients I made (h - 1 = 0.75) ...
    assert peak("1F1B", 4, 1, 8, split_backward=True, w_memory=1.75) == [4.75, 3.75, 2.75, 1.75]
    assert peak("1F1B", 4, 1, 8, split_backward=True) == [4, 3, 2, 1]
    # ... but ZB-H1 defers W, so with Paddle-like w_memory it needs more than 1F1B
    assert max(peak("ZBH1", 4, 1, 8, w_memory=1.75)) > 4.75
    assert max(peak("ZBH1", 4, 1, 8, w_memory=0.0)) <= 4


def test_costs_round_trip_and_checks():
    costs = Costs(forward=1, backward_b=2, backward_w=0.5, comm=0.1, w_memory=1.25)
    assert Costs.from_dict(costs.to_dict()) == costs
    assert Costs.from_dict({"forward": 1, "backward_b": 1, "backward_w": 1}).w_memory == 0.5
    with pytest.raises(ValueError, match="w_memory"):
        Costs(w_memory=-1)
    assert costs.memory_delta("backward_b") == pytest.approx(0.25)
    assert costs.memory_delta("backward_w") == pytest.approx(-1.25)


def test_auto_respects_the_limit_under_a_calibrated_model():
    costs = Costs(**TIMES, w_memory=1.75)
    result = auto_search(4, 1, 8, costs, memory_limit=6)
    assert simulate(result.schedule, costs).max_peak_memory <= 6
    assert minimum_memory(4, 1, 8, 1.75) == 1.75
    with pytest.raises(ValueError, match="must be >= 1.75"):
        auto_search(4, 1, 8, costs, memory_limit=1.5)

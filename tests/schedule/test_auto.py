"""auto / autoV: validity, memory limit, never worse than the best fitting fixed schedule."""
import pytest

from pipesplit.job_list import build_schedule
from pipesplit.job_list.auto import (auto_search, default_memory_limit, fixed_candidates,
                                     greedy_orders, GreedyPolicy, SearchContext)
from pipesplit.job_list.bounds import checked_memory_limit, fits, memory_lower_bound
from pipesplit.job_list.placement import LOOPED, V_SHAPE
from pipesplit.job_list.search_context import INF
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.validate import validate

C01 = Costs(1.0, None, 1.0, 1.0, comm=0.1)
UNEQUAL = Costs(1.0, None, 1.5, 0.5)


@pytest.mark.parametrize("name", ("auto", "autoV"))
def test_small_grid_valid(name):
    for pp in (1, 2, 3, 4):
        for vpp in (1, 2, 3):
            for m in (1, 2, pp + 1, 2 * pp + 1):
                schedule = build_schedule(name, pp, vpp, m, costs=C01)
                validate(schedule)
                result = simulate(schedule, C01)
                assert result.max_peak_memory <= default_memory_limit(pp, vpp, m) + 1e-9


@pytest.mark.parametrize("costs", (C01, UNEQUAL, Costs(1.0, None, 1.0, 1.0)))
@pytest.mark.parametrize("placement", (LOOPED, V_SHAPE))
def test_never_worse_than_best_fitting_fixed(costs, placement):
    for pp, vpp, m in ((2, 1, 3), (4, 1, 8), (4, 2, 8), (4, 2, 5), (3, 2, 7), (4, 4, 4)):
        limit = default_memory_limit(pp, vpp, m)
        result = auto_search(pp, vpp, m, costs, limit, (placement,))
        assert result.peak <= limit + 1e-9
        assert simulate(result.schedule, costs).makespan == pytest.approx(result.makespan)
        fitting = [span for _, _, span, peak in fixed_candidates(pp, vpp, m, placement, costs)
                   if max(peak) <= limit + 1e-9]
        if fitting:
            assert result.makespan <= min(fitting) + 1e-9


@pytest.mark.parametrize("placement", (LOOPED, V_SHAPE))
def test_a_limit_per_rank_holds_on_each_rank(placement):
    """One limit per rank (what a budget in bytes gives): each rank's peak within its own,
    never slower than the fixed schedules that fit them all, never slower than under the
    tightest for every rank, and bounded below by the memory bound of those limits."""
    for pp, vpp, m, limits in ((2, 1, 4, (2.0, 1.0)), (4, 1, 8, (4.0, 3.0, 1.5, 1.0)),
                               (4, 2, 8, (8.0, 4.0, 2.0, 2.0)), (3, 2, 7, (2.0, 6.0, 3.0))):
        result = auto_search(pp, vpp, m, C01, limits, (placement,))
        validate(result.schedule)
        assert result.memory_limit == limits
        assert fits(simulate(result.schedule, C01).peak_memory, limits)
        assert fits(result.peaks, limits) and result.peak == max(result.peaks)
        fitting = [span for _, _, span, peak in fixed_candidates(pp, vpp, m, placement, C01)
                   if fits(peak, limits)]
        assert result.makespan <= min(fitting, default=INF) + 1e-9
        tightest = auto_search(pp, vpp, m, C01, min(limits), (placement,))
        assert result.makespan <= tightest.makespan + 1e-9
        assert result.makespan >= memory_lower_bound(pp, vpp, m, C01, limits, placement) - 1e-9


def test_a_limit_per_rank_is_checked():
    with pytest.raises(ValueError, match=r"memory_limit must be one number or one per pipeline "
                                         r"rank \(4\), got 2 numbers"):
        auto_search(4, 1, 8, C01, [2.0, 2.0])
    with pytest.raises(ValueError, match=r"memory_limit must be >= 2 on every rank .*got "
                                         r"\(4, 1.5, 4, 4\)"):
        build_schedule("auto", 4, 2, 8, memory_limit=(4, 1.5, 4, 4))
    with pytest.raises(TypeError, match="memory_limit must be a number or a sequence"):
        auto_search(4, 1, 8, C01, (2.0, "2", 2.0, 2.0))
    with pytest.raises(ValueError, match="memory_limit must be a finite number > 0"):
        auto_search(2, 1, 8, C01, (2.0, float("nan")))
    assert checked_memory_limit([3, 2], 2) == (3.0, 2.0)
    assert checked_memory_limit(3, 2) == 3.0


def test_memory_limit_respected_and_tradeoff():
    spans = []
    for limit in (2, 3, 4, 6, 8):
        result = auto_search(4, 2, 8, C01, limit, (LOOPED,))
        validate(result.schedule)
        assert result.peak <= limit + 1e-9
        spans.append(result.makespan)
    assert spans[-1] <= spans[0]


def test_too_low_limit_states_minimum():
    with pytest.raises(ValueError, match=r"memory_limit must be >= 2"):
        build_schedule("auto", 4, 2, 8, memory_limit=1.5)
    with pytest.raises(ValueError, match=r"memory_limit must be >= 1"):
        auto_search(4, 1, 8, C01, 0.5)


def test_minimum_limit_is_feasible():
    for pp, vpp, m in ((4, 1, 8), (4, 2, 5), (2, 4, 3)):
        result = auto_search(pp, vpp, m, UNEQUAL, float(vpp), (LOOPED, V_SHAPE))
        validate(result.schedule)
        assert result.peak <= vpp + 1e-9


def test_per_stage_costs_and_both_placements():
    costs = Costs(forward=[1, 1.2, 0.8, 1], backward_b=[1, 1.5, 1, 2], backward_w=0.5, comm=0.2)
    result = auto_search(2, 2, 6, costs, None, (LOOPED, V_SHAPE))
    assert result.placement in (LOOPED, V_SHAPE)
    assert result.schedule.placement.kind == result.placement
    validate(result.schedule)


def test_reserve_policy_never_deadlocks():
    for pp, vpp, m in ((4, 4, 9), (8, 2, 5), (3, 3, 7)):
        for placement in (LOOPED, V_SHAPE):
            ctx = SearchContext(pp, vpp, m, placement, C01)
            assert greedy_orders(ctx, float(vpp), GreedyPolicy(admit="reserve")) is not None


def test_auto_strictly_better_somewhere():
    better = 0
    for pp, vpp, m in ((4, 2, 4), (4, 4, 4), (2, 2, 2)):
        result = auto_search(pp, vpp, m, UNEQUAL, None, (V_SHAPE,))
        better += result.makespan < result.baseline_makespan - 1e-9
    assert better >= 2


def test_memory_lower_bound_is_a_lower_bound():
    from pipesplit.job_list.auto import memory_lower_bound
    from pipesplit.job_list.bounds import lower_bound
    for costs in (C01, UNEQUAL, Costs(1.0, None, 1.0, 1.0)):
        for placement in (LOOPED, V_SHAPE):
            for pp, vpp, m in ((2, 1, 2), (4, 1, 8), (4, 2, 5), (2, 2, 4), (3, 2, 7)):
                for limit in (None, float(vpp), 2.0 * pp * vpp):
                    bound = memory_lower_bound(pp, vpp, m, costs, limit, placement)
                    assert bound >= lower_bound(pp, vpp, m, costs) - 1e-9
                    cap = default_memory_limit(pp, vpp, m) if limit is None else limit
                    for _, _, span, peak in fixed_candidates(pp, vpp, m, placement, costs):
                        if max(peak) <= cap + 1e-9:
                            assert span >= bound - 1e-9
                    result = auto_search(pp, vpp, m, costs, limit, (placement,))
                    assert result.makespan >= bound - 1e-9


def test_fixed_optimal_shortcut_keeps_fixed():
    # ZB-H1 meets the memory lower bound at pp=4, m=8 with unequal costs: auto returns it
    result = auto_search(4, 1, 8, UNEQUAL, None, (LOOPED,))
    assert result.makespan == pytest.approx(result.bound)
    assert result.source == "fixed:ZBH1"


def test_layout_search_fits_limit():
    from pipesplit.job_list.auto import layout_search
    for pp, vpp, m in ((4, 2, 8), (4, 1, 6), (2, 2, 4)):
        ctx = SearchContext(pp, vpp, m, LOOPED, C01)
        limit = default_memory_limit(pp, vpp, m) + 1
        found = layout_search(ctx, limit)
        assert found is not None
        span, _, _, orders = found
        fast = ctx.simulate(orders)
        assert fast[0] == pytest.approx(span) and max(fast[1]) <= limit + 1e-9
        schedule = build_schedule("InterleavedZB", pp, vpp, m).with_ranks(ctx.to_jobs(orders))
        validate(schedule)


def test_bench_counts_no_fit_apart():
    import io
    from pipesplit.tools.bench.bench_auto import run
    summary = run([2], [2], [LOOPED], out=io.StringIO())
    for counts in summary.values():
        # m = 3 (pp + 1): no fixed looped schedule fits 1F1B's memory at vpp = 2
        assert counts["no_fixed"] >= 1
        assert counts["faster"] + counts["equal"] + counts["no_fixed"] == counts["total"] == 5

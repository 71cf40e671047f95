"""Zero-bubble family and DualPipeV: validity over the grid, lowering, pinned target figures."""
import pytest

from pipesplit.job_list import build_schedule, get_spec
from pipesplit.job_list.ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD
from pipesplit.job_list.placement import LOOPED, V_SHAPE
from pipesplit.job_list.bounds import lower_bound
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.validate import validate

NEW = ("ZBH1", "ZBH2", "InterleavedZB", "ZBV", "ZBVPP", "DualPipeV")
PLACEMENT = {"ZBH1": LOOPED, "ZBH2": LOOPED, "InterleavedZB": LOOPED,
             "ZBV": V_SHAPE, "ZBVPP": V_SHAPE, "DualPipeV": V_SHAPE}
UNIT = Costs(1.0, None, 1.0, 1.0)  # (tF, tB, tI, tW) = (1, 2, 1, 1), c = 0


def serves(name, vpp):
    return {"ZBH1": vpp == 1, "ZBH2": vpp == 1, "InterleavedZB": True, "ZBV": vpp == 2,
            "ZBVPP": vpp % 2 == 0, "DualPipeV": vpp == 2}[name]


@pytest.mark.parametrize("name", NEW)
def test_registered_with_split_backward(name):
    spec = get_spec(name)
    assert spec.splits_backward
    assert spec.placement == PLACEMENT[name]


@pytest.mark.parametrize("name", NEW)
def test_grid_valid_or_value_error(name):
    """pp 1..3 x vpp 1..4 x m 1..4pp+3: valid and simulatable, or ValueError naming vpp.
    (pp 1..8, lowered too, in tests/schedule/test_exhaustive.py.)"""
    for pp in range(1, 4):
        for vpp in range(1, 5):
            for m in range(1, 4 * pp + 4):
                if not serves(name, vpp):
                    with pytest.raises(ValueError, match="vpp"):
                        build_schedule(name, pp, vpp, m)
                    continue
                schedule = build_schedule(name, pp, vpp, m)
                assert schedule.split_backward
                kinds = {job.kind for jobs in schedule.ranks for job in jobs}
                assert BACKWARD not in kinds and kinds <= {FORWARD, BACKWARD_B, BACKWARD_W}
                validate(schedule)
                simulate(schedule, UNIT)


@pytest.mark.parametrize("name", NEW)
def test_lowered_comm_is_deadlock_free(name):
    import pipesplit.job_list.lower as lower
    for pp in (1, 2, 3):  # the whole grid: tests/schedule/test_exhaustive.py
        for vpp in (1, 2, 4):
            if not serves(name, vpp):
                continue
            for m in sorted({1, pp - 1 or 1, pp, pp + 1, 2 * pp + 1, 4 * pp + 3}):
                validate(lower.lower_comm(build_schedule(name, pp, vpp, m)))


def _figures(name, vpp):
    result = simulate(build_schedule(name, 4, vpp, 8), UNIT)
    return result.makespan, result.max_peak_memory


def test_zbh1_target():
    makespan, peak = _figures("ZBH1", 1)
    assert makespan == 27
    assert peak <= 4


def test_zbh1_peak_equals_1f1b():
    for pp in (2, 4, 8):
        for m in (pp, 2 * pp, 3 * pp + 1):
            zb = simulate(build_schedule("ZBH1", pp, 1, m), UNIT).max_peak_memory
            ref = simulate(build_schedule("1F1B", pp, 1, m), UNIT).max_peak_memory
            assert zb <= ref


def test_zbh2_zero_bubble_at_twice_memory():
    for pp in (2, 4, 8):
        for m in (2 * pp, 3 * pp):
            result = simulate(build_schedule("ZBH2", pp, 1, m), UNIT)
            assert result.makespan == lower_bound(pp, 1, m, UNIT)
            assert result.max_peak_memory <= 2 * pp


@pytest.mark.parametrize("name", ("InterleavedZB", "ZBV", "ZBVPP"))
def test_v2_targets(name):
    makespan, peak = _figures(name, 2)
    assert makespan == 51 == lower_bound(4, 2, 8, UNIT)
    assert peak <= 8


def test_dualpipev_figures():
    makespan, peak = _figures("DualPipeV", 2)
    assert makespan == 51
    assert peak <= 9  # DualPipeV keeps one more micro-batch of activations than ZB-V


def test_zbvpp_even_vpp_only():
    with pytest.raises(ValueError, match="vpp must be even"):
        build_schedule("ZBVPP", 4, 3, 8)
    result = simulate(build_schedule("ZBVPP", 4, 4, 8), UNIT)
    assert result.max_peak_memory <= 16


def test_small_m_keeps_every_job():
    for name, vpp in (("ZBV", 2), ("DualPipeV", 2), ("ZBH1", 1), ("InterleavedZB", 3)):
        schedule = build_schedule(name, 4, vpp, 3)
        count = sum(len(jobs) for jobs in schedule.ranks)
        assert count == 3 * 4 * vpp * 3

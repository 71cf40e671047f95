"""Exhaustive grid: every fixed schedule x pp 1..8 x vpp 1..4 x m 1..4pp+3 (with and without
split_backward for the classic ones) is valid and simulates, and so is its comm lowering — or the
generator refuses the configuration with a ValueError naming the parameter.

``auto`` / ``autoV`` search instead of following a fixed rule; tests/schedule/test_auto.py has their own,
smaller grid.  One test per schedule (and split variant); each reports every failing
configuration at once.
"""
import pytest

from pipesplit.job_list import build_schedule, get_spec, lower_comm, schedule_names
from pipesplit.job_list.ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD
from pipesplit.job_list.simulate import simulate
from pipesplit.job_list.validate import validate

SEARCHED = ("auto", "autoV")
FIXED = [name for name in schedule_names() if name not in SEARCHED]

#: vpp a schedule serves (the rest must be refused with a ValueError naming vpp); any schedule
#: not listed serves the whole grid.
SERVES_VPP = {"ZBH1": lambda vpp: vpp == 1, "ZBH2": lambda vpp: vpp == 1,
              "ZBV": lambda vpp: vpp == 2, "DualPipeV": lambda vpp: vpp == 2,
              "ZBVPP": lambda vpp: vpp % 2 == 0}


def variants():
    """(name, split_backward): both splits where the generator leaves it to the caller."""
    for name in FIXED:
        splits = (False,) if get_spec(name).splits_backward else (False, True)
        for split in splits:
            yield pytest.param(name, split, id=f"{name}-split" if split else name)


def grid():
    for pp in range(1, 9):
        for vpp in range(1, 5):
            for m in range(1, 4 * pp + 4):
                yield pp, vpp, m


def check(name, pp, vpp, m, split):
    """Raise AssertionError / ScheduleError if configuration (pp, vpp, m) is not served right."""
    served = SERVES_VPP.get(name, lambda vpp: True)(vpp)
    try:
        schedule = build_schedule(name, pp, vpp, m, split_backward=split)
    except ValueError as error:
        assert not served, f"refused: {error}"
        assert "vpp" in str(error), f"refusal does not name vpp: {error}"
        return
    assert served, "built, but the schedule is documented to refuse this vpp"
    kinds = {job.kind for jobs in schedule.ranks for job in jobs}
    if schedule.split_backward:
        assert BACKWARD not in kinds and kinds <= {FORWARD, BACKWARD_B, BACKWARD_W}, kinds
    else:
        assert kinds <= {FORWARD, BACKWARD}, kinds
    assert schedule.split_backward == (split or get_spec(name).splits_backward)
    validate(schedule)
    timing = simulate(schedule)  # default costs: tF = tI = tW = 1, tB = 2, no comm latency
    assert timing.makespan > 0
    lowered = lower_comm(schedule, timing=timing)  # reuses the timing instead of simulating again
    assert lowered.compute_only().ranks == schedule.ranks  # lowering only adds send / recv
    validate(lowered)


@pytest.mark.slow
@pytest.mark.parametrize("name, split", list(variants()))
def test_every_configuration(name, split):
    failures = []
    for pp, vpp, m in grid():
        try:
            check(name, pp, vpp, m, split)
        except (AssertionError, ValueError) as error:  # ScheduleError is a ValueError
            failures.append(f"pp={pp} vpp={vpp} m={m}: {type(error).__name__}: {error}")
    assert not failures, f"{len(failures)} failing configurations:\n" + "\n".join(failures[:20])


def test_grid_covers_every_fixed_schedule():
    assert set(FIXED) >= {"FThenB", "1F1B", "Eager1F1B", "VPP", "LoopedBFS", "ZBH1", "ZBH2",
                          "InterleavedZB", "ZBV", "ZBVPP", "DualPipeV"}
    assert set(SERVES_VPP) <= set(FIXED)

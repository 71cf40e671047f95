"""Classic schedules: every (pp, vpp, m) on the grid is valid and simulates; pinned figures;
golden orders."""
import csv
import os

import pytest

from pipesplit.job_list import build_schedule, classic, lower_comm
from pipesplit.job_list.classic import interleave, micro_batch_groups
from pipesplit.job_list.ir import BACKWARD, FORWARD, Job
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.validate import validate

CLASSIC = ("FThenB", "1F1B", "Eager1F1B", "VPP", "LoopedBFS")
GOLDEN_DIR = os.path.join(os.path.dirname(classic.__file__), "golden")
TF1_TB2 = Costs(forward=1.0, backward_b=1.0, backward_w=1.0)  # tB = tI + tW = 2


# A quick sample of the grid: pp 1..3 with every vpp and m.  The whole grid (pp 1..8) runs in
# tests/schedule/test_exhaustive.py (slow).
def grid():
    for pp in range(1, 4):
        for vpp in range(1, 5):
            for m in range(1, 4 * pp + 4):
                yield pp, vpp, m


def check_config(name, pp, vpp, m, split):
    """None if served and valid everywhere; the ValueError text if the generator refuses."""
    try:
        schedule = build_schedule(name, pp, vpp, m, split_backward=split)
    except ValueError as error:
        return str(error)
    validate(schedule)
    timing = simulate(schedule)
    assert timing.makespan > 0
    lowered = lower_comm(schedule, timing=timing)
    validate(lowered)
    return None


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("name", CLASSIC)
def test_grid_valid_simulates_and_lowers(name, split):
    configs = list(grid())
    refusals = [(c, check_config(name, *c, split)) for c in configs]
    refusals = [(c, text) for c, text in refusals if text is not None]
    for _, text in refusals:  # a refusal must name what it refuses
        assert any(p in text for p in ("pp", "vpp", "m")), text
    assert refusals == []  # every classic schedule serves the whole grid


def test_pinned_1f1b():
    result = simulate(build_schedule("1F1B", 4, 1, 8), TF1_TB2)
    assert result.makespan == 33
    assert result.peak_memory == [4, 3, 2, 1]


def test_pinned_fthenb_and_gpipe_alias():
    for name in ("FThenB", "GPipe"):
        result = simulate(build_schedule(name, 4, 1, 8), TF1_TB2)
        assert result.makespan == 33
        assert result.peak_memory == [8, 8, 8, 8]


def test_pinned_vpp_and_alias():
    for name in ("VPP", "Interleaved1F1B"):
        assert simulate(build_schedule(name, 4, 2, 8), TF1_TB2).makespan == 57


def test_eager_warmup_is_paddles():
    # 2*(pp-r)-1 forwards before the first backward, capped at m.
    schedule = build_schedule("Eager1F1B", 4, 1, 8)
    warmups = [next(i for i, j in enumerate(jobs) if j.kind == BACKWARD) for jobs in schedule.ranks]
    assert warmups == [8, 6, 4, 2]  # warm-up + the first steady forward
    capped = build_schedule("Eager1F1B", 4, 1, 3)
    assert [j.kind for j in capped.ranks[0]] == [FORWARD] * 3 + [BACKWARD] * 3


def test_looped_bfs_order():
    schedule = build_schedule("LoopedBFS", 2, 2, 2)
    assert [str(a) for a in schedule.actions(0)] == [
        "0F0", "0F1", "2F0", "2F1", "2B0", "2B1", "0B0", "0B1"]


def test_paddle_deadlock_config_is_served():
    # Paddle 3.3.1's VPP deadlocks at pp=4, vpp=4, m=5; here m=5 is one group of 5.
    schedule = build_schedule("VPP", 4, 4, 5)
    validate(schedule)
    assert simulate(schedule, TF1_TB2).makespan == 69


def test_micro_batch_groups():
    assert micro_batch_groups(8, 4) == [range(0, 4), range(4, 8)]
    assert micro_batch_groups(3, 4) == [range(0, 3)]
    assert micro_batch_groups(5, 4) == [range(0, 5)]
    assert micro_batch_groups(15, 4) == [range(0, 5), range(5, 10), range(10, 15)]
    for m in range(1, 40):
        for size in range(1, 9):
            groups = micro_batch_groups(m, size)
            assert [mb for g in groups for mb in g] == list(range(m))
            lengths = [len(g) for g in groups]
            assert max(lengths) - min(lengths) <= 1
            assert len(groups) == 1 or min(lengths) >= size


def test_interleave_phases():
    f = [Job(FORWARD, 0, i) for i in range(3)]
    b = [Job(BACKWARD, 0, i) for i in range(3)]
    assert interleave(f, b, 1) == [f[0], f[1], b[0], f[2], b[1], b[2]]
    assert interleave(f, b, 9) == f + b
    with pytest.raises(ValueError):
        interleave(f, b[:2], 1)


def test_vpp_group_size_option():
    schedule = build_schedule("VPP", 2, 2, 8, group_size=4)
    validate(schedule)
    with pytest.raises(ValueError, match="group_size"):
        build_schedule("VPP", 4, 2, 8, group_size=2)


def read_golden(filename):
    with open(os.path.join(GOLDEN_DIR, filename), newline="") as f:
        return [[cell.strip() for cell in row if cell.strip()] for row in csv.reader(f)]


@pytest.mark.parametrize("name, pp, vpp, m", [("1F1B", 4, 1, 8), ("VPP", 4, 2, 8), ("VPP", 4, 4, 5)])
def test_golden_orders(name, pp, vpp, m):
    expected = read_golden(f"{name.lower()}_pp{pp}_vpp{vpp}_m{m}.csv")
    schedule = build_schedule(name, pp, vpp, m)
    assert [[str(a) for a in schedule.actions(r)] for r in range(pp)] == expected

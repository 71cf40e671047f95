"""Views: ASCII grid, Chrome trace, PNG, CSV and JSON round trips."""
import json

import pytest

from pipesplit.job_list import (BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, Job, Placement,
                                Schedule, build_schedule, schedule_names, serves)
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.validate import validate
from pipesplit.job_list.views import (ascii_grid, chrome_trace, from_csv, from_json, plot_timeline,
                                      to_csv, to_json)
from pipesplit.tools.cli import load_schedules

load_schedules()  # register whatever generator modules exist (classic, zero-bubble, ...)


def hand_gpipe(pp=2, m=3, split=False):
    """GPipe built by hand, independent of any registered generator."""
    ranks = []
    for _ in range(pp):
        jobs = [Job(FORWARD, 0, mb) for mb in range(m)]
        for mb in range(m):
            jobs += [Job(BACKWARD_B, 0, mb), Job(BACKWARD_W, 0, mb)] if split else [Job(BACKWARD, 0, mb)]
        ranks.append(jobs)
    return Schedule("hand", pp, 1, m, Placement("looped", pp, 1), ranks, split_backward=split)


def hand_v(pp=2, m=2):
    """A V-placed schedule (2 chunks, chunk 1 mirrored) built by hand: all F then all B."""
    placement = Placement("v", pp, 2)
    ranks = [[] for _ in range(pp)]
    for stage in range(2 * pp):
        rank, chunk = placement.rank_chunk(stage)
        ranks[rank] += [Job(FORWARD, chunk, mb) for mb in range(m)]
    for stage in reversed(range(2 * pp)):
        rank, chunk = placement.rank_chunk(stage)
        ranks[rank] += [Job(BACKWARD, chunk, mb) for mb in range(m)]
    return Schedule("handV", pp, 2, m, placement, ranks)


CONFIGS = [(2, 1, 2), (4, 1, 8), (4, 2, 8), (4, 4, 5), (2, 2, 3), (8, 2, 16)]
HAND = {"hand": hand_gpipe, "hand-split": lambda: hand_gpipe(3, 4, split=True), "handV": hand_v}
# (schedule name or hand-built key, pp, vpp, m, split_backward)


CASES = [(key, 0, 0, 0, False) for key in HAND] + [
    (name, pp, vpp, m, split) for name in schedule_names() for pp, vpp, m in CONFIGS
    if serves(name, pp, vpp, m) for split in (False, True)]
IDS = [key if not pp else f"{key}-pp{pp}-v{vpp}-m{m}{'-split' if split else ''}"
       for key, pp, vpp, m, split in CASES]


def make(case):
    key, pp, vpp, m, split = case
    if key in HAND and not pp:
        return HAND[key]()
    return build_schedule(key, pp, vpp, m, split_backward=split)


def short_forms(schedule):
    return {str(a) for r in range(schedule.pp) for a in schedule.actions(r)}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_csv_round_trip_is_exact(case):
    schedule = make(case)
    text = to_csv(schedule)
    assert len(text.splitlines()) == schedule.pp
    back = from_csv(text, placement=schedule.placement.kind, name=schedule.name)
    assert back.ranks == schedule.ranks
    assert (back.pp, back.vpp, back.m, back.placement) == (schedule.pp, schedule.vpp, schedule.m,
                                                           schedule.placement)
    assert back.split_backward == schedule.split_backward
    assert back == schedule.with_ranks(schedule.ranks, options={})


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_json_round_trip_is_exact(case):
    schedule = make(case)
    sim = simulate(schedule)
    data = json.loads(to_json(schedule, sim))
    assert data["ranks"][0] == [str(a) for a in schedule.actions(0)]
    assert len(data["jobs"]) == sum(len(r) for r in schedule.ranks)
    assert data["summary"]["makespan"] == sim.makespan
    assert from_json(to_json(schedule)) == schedule
    assert from_json(to_json(schedule, sim)) == schedule


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ascii_grid_has_a_row_per_rank_and_every_job(case):
    schedule = make(case)
    grid = ascii_grid(simulate(schedule))
    rows = [line for line in grid.splitlines() if line.startswith("rank ")]
    assert len(rows) == schedule.pp
    for rank, row in enumerate(rows):
        cells = set(row.split("|", 1)[1].split())
        assert {str(a) for a in schedule.actions(rank)} <= cells
    assert "legend" in grid.splitlines()[-1]


def test_ascii_grid_with_latency_and_uneven_costs_keeps_every_job():
    schedule = hand_gpipe(3, 4, split=True)
    for costs in (Costs(1, None, 1, 1, comm=0.1), Costs(1, None, 0.5, 0.5, comm=0.3),
                  Costs(0.7, None, 1.3, 0.4, comm=0.05)):
        grid = ascii_grid(simulate(schedule, costs))
        for short in short_forms(schedule):
            assert short in grid, (short, costs)


def test_ascii_grid_width_limits_line_length():
    """A grid wider than ``width`` is cut into bands of columns; every job keeps its cell."""
    schedule = hand_gpipe(4, 8)
    grid = ascii_grid(simulate(schedule), width=60)
    rows = [line for line in grid.splitlines() if line.startswith("rank")]
    assert rows and all(len(line) <= 60 for line in rows)
    assert len(rows) == 3 * schedule.pp and "3 bands of 13 columns" in grid.splitlines()[0]
    assert grid.splitlines()[1] == "t 0 to 13" and "+N" not in grid
    cells = {c for line in rows for c in line.split("|", 1)[1].split()}
    assert short_forms(schedule) <= cells
    single = ascii_grid(simulate(schedule))
    assert sum(line.startswith("rank") for line in single.splitlines()) == schedule.pp


def test_ascii_grid_idle_cells_are_dots():
    grid = ascii_grid(simulate(hand_gpipe(2, 1)))
    # rank 1 waits one F for its first forward
    assert grid.splitlines()[2].split("|")[1].split()[0] == "."


@pytest.mark.parametrize("case", CASES[:3] + CASES[3::5], ids=IDS[:3] + IDS[3::5])
def test_chrome_trace_one_track_per_rank_and_all_jobs(case):
    schedule = make(case)
    sim = simulate(schedule, Costs(1, None, 1, 1, comm=0.25))
    trace = chrome_trace(sim)
    json.dumps(trace)  # serialisable
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in events} == set(range(schedule.pp))
    assert len(events) == sum(len(r) for r in schedule.ranks)
    assert {e["name"] for e in events} == short_forms(schedule)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {r: f"rank {r}" for r in range(schedule.pp)}
    for e in events:
        assert e["dur"] > 0 and e["ts"] >= 0
        assert set(e["args"]) >= {"kind", "chunk", "micro_batch"}
    last = max(e["ts"] + e["dur"] for e in events)
    assert last == pytest.approx(sim.makespan * 1000.0)


def test_plot_timeline_writes_png(tmp_path):
    import matplotlib  # noqa: F401
    for i, schedule in enumerate([hand_gpipe(), hand_v(), hand_gpipe(3, 4, split=True)]):
        path = tmp_path / f"t{i}.png"
        assert plot_timeline(simulate(schedule), str(path)) == str(path)
        data = path.read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_from_csv_pytorch_format_with_empty_cells_and_inference():
    # torchtitan-style rows: row index = rank, empty cells for idle steps, global stage index
    text = "0F0,0F1,,0B0,0B1\n,1F0,1B0,1F1,1B1\n"
    schedule = from_csv(text)
    assert (schedule.pp, schedule.vpp, schedule.m) == (2, 1, 2)
    validate(schedule)
    assert to_csv(schedule) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    # crlf line ends (csv.writer's default) and spaces are fine
    assert from_csv("0F0, 0B0\r\n1F0 ,1B0\r\n").ranks == from_csv("0F0,0B0\n1F0,1B0\n").ranks
    # explicit pp pads missing ranks; explicit m / vpp are kept
    padded = from_csv("0F0,0B0\n", pp=2, vpp=1, m=3)
    assert padded.ranks == [[Job(FORWARD, 0, 0), Job(BACKWARD, 0, 0)], []]
    assert padded.m == 3
    # vpp inferred from the highest stage
    assert from_csv("0F0,2F0\n1F0,3F0\n").vpp == 2


def test_from_csv_rejects_bad_input():
    with pytest.raises(ValueError, match="line 1"):
        from_csv("0F0,0X0\n")
    with pytest.raises(ValueError, match="belongs to rank 1"):
        from_csv("0F0,1F0\n1F0,1B0\n")
    with pytest.raises(ValueError, match="vpp"):
        from_csv("0F0,2F0\n1F0,1B0\n")  # 3 stages over 2 ranks
    with pytest.raises(ValueError, match="rank rows"):
        from_csv("0F0\n1F0\n2F0\n", pp=2)
    with pytest.raises(ValueError, match="micro-batch"):
        from_csv("0F0,0F5\n", m=2)


def test_v_placement_needs_placement_argument():
    schedule = hand_v()
    text = to_csv(schedule)
    with pytest.raises(ValueError, match="belongs to rank"):
        from_csv(text)  # looped placement puts stage 2 on rank 0, V puts it on rank 1
    assert from_csv(text, placement="v", name="handV") == schedule


def test_lowered_schedule_round_trips():
    import pipesplit.job_list.lower as lower
    schedule = build_schedule("1F1B", 4, 1, 6) if "1F1B" in schedule_names() else hand_gpipe(4, 6)
    lowered = lower.lower_comm(schedule)
    assert any(j.is_comm for r in lowered.ranks for j in r)
    back = from_csv(to_csv(lowered), name=lowered.name)
    assert back.ranks == lowered.ranks and back.lowered
    validate(back)
    assert from_json(to_json(lowered)).ranks == lowered.ranks


def test_views_do_not_import_matplotlib_or_paddle_eagerly():
    import subprocess
    import sys

    code = ("import sys; import pipesplit.job_list.views as v; "
            "assert 'matplotlib' not in sys.modules and 'paddle' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- step grid

def test_step_grid_of_a_valid_schedule():
    from pipesplit.job_list import lower_comm
    from pipesplit.job_list.grid import step_grid

    schedule = build_schedule("1F1B", 2, 1, 3)
    assert step_grid(schedule) == (
        "step   |  0    1    2    3    4    5\n"
        "rank 0 | 0F0  0F1  0B0  0F2  0B1  0B2\n"
        "rank 1 | 1F0  1B0  1F1  1B1  1F2  1B2")
    assert step_grid(schedule, {(1, 2)}).splitlines()[2] == "rank 1 | 1F0  1B0 [1F1] 1B1  1F2  1B2"
    lowered = step_grid(lower_comm(schedule)).splitlines()
    assert len(lowered) == 3 and "[" not in "".join(lowered)
    assert lowered[1].split()[3:5] == ["0F0", "0SEND_F0"]  # comm jobs are shown in their place


def test_deadlock_error_shows_the_grid_with_the_blocked_heads():
    from pipesplit.job_list.ir import BACKWARD, FORWARD, Job
    from pipesplit.job_list.validate import ScheduleError

    schedule = build_schedule("1F1B", 2, 1, 2)
    f, b = (lambda mb: Job(FORWARD, 0, mb)), (lambda mb: Job(BACKWARD, 0, mb))
    bad = schedule.with_ranks([[f(0), b(0), f(1), b(1)], [f(0), f(1), b(0), b(1)]])
    expected = (
        "deadlock: rank 0, job #1 (0B0) waits for 1B0, which rank 1 runs only after 1F1; "
        "rank 1, job #1 (1F1) waits for 0F1, which rank 0 runs only after 0B0\n"
        "per rank, the jobs in list order; [blocked] heads:\n"
        "step   |  0    1    2    3\n"
        "rank 0 | 0F0 [0B0] 0F1  0B1\n"
        "rank 1 | 1F0 [1F1] 1B0  1B1")
    with pytest.raises(ScheduleError) as caught:
        validate(bad)
    assert str(caught.value) == expected
    with pytest.raises(ScheduleError) as caught:
        simulate(bad)
    assert str(caught.value) == expected

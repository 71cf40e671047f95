"""How tools/bench/bench_engine.py samples until its goals resolve (issue 58): which engines a
round steps and how long, from fixed rows and goals (no launch)."""
from __future__ import annotations

import pytest

from pipesplit.tools.bench.bench_engine_report import goals
from pipesplit.tools.bench.bench_engine_rounds import (PASS_ROUNDS_OVER_ASKED, RESERVE_MARGIN_S,
                                                       ROUND_MIN_STEPS, goal_engines, goal_key,
                                                       goal_source, plan_round,
                                                       record_resolutions, reserve_s)
from pipesplit.tools.bench.verdicts import STEPS_CAP

NOISY = [100.0, 130.0, 80.0, 120.0, 90.0, 110.0, 70.0, 125.0]


def row(schedule, impl, times, m=4, **fields):
    return {"schedule": schedule, "impl": impl, "m": m, "step_ms_all": list(times),
            "step_ids": list(range(len(times))), "step_ms": sorted(times)[len(times) // 2],
            "peak_bytes": [10, 10], "pass_ms": 20.0, **fields}


def the_rows():
    """Paddle's 1F1B; pipesplit's 1F1B as fast, its noise its own (unresolved against 1.03);
    ZBH1 clearly faster (the fastest goal met)."""
    paddle = row("1F1B", "paddle", [100.0] * 8)
    ours = row("1F1B", "pipesplit", NOISY)
    zbh1 = row("ZBH1", "pipesplit", [60.0, 61.0, 59.0, 60.0, 62.0, 60.0, 59.0, 61.0],
               peak_bytes=[10, 20])
    return [paddle, ours, zbh1]


def test_each_goal_reads_its_own_samples():
    rows = the_rows()
    named = {g["name"]: g for g in goals(rows)}
    assert goal_source(named["1f1b"]) == "timed" and goal_source(named["fastest"]) == "timed"
    assert goal_source({"name": "split_stage0", "ratio_ci": [1, 1]}) == "profiled"
    assert goal_source({"name": "pass", "ratio_ci": [1, 1]}) == "pass"
    assert goal_source({"name": "peaks", "ratio_ci": None}) is None
    assert goal_engines(named["1f1b"], rows) == [(4, "1F1B paddle"), (4, "1F1B pipesplit")]
    both = [row("1F1B", "pipesplit", [1.0]), row("1F1B", "paddle", [1.0]),
            row("ZBH1", "pipesplit", [1.0])]
    assert goal_engines({"name": "pass", "m": 4}, both) == [(4, "1F1B paddle"),
                                                            (4, "1F1B pipesplit")]


def test_a_round_steps_only_the_engines_of_unresolved_goals():
    rows = the_rows()
    goal_list = goals(rows)
    named = {g["name"]: g for g in goal_list}
    assert named["fastest"]["verdict"] == "met" and named["1f1b"]["verdict"] == "unresolved"
    plan = plan_round(rows, goal_list, left_s=1e9)
    # ZBH1 is the fastest row, but its goals are resolved: only the 1F1B pair (bubble's and
    # best's engines are the same two rows or resolved) steps on
    assert "m=4 1f1b" in plan["goals"] and "m=4 fastest" not in plan["goals"]
    engines = {label for _, label in plan["engines"]["timed"]}
    assert engines == {"1F1B paddle", "1F1B pipesplit"}
    nearest = min(g["steps_to_resolve"] for g in goal_list if g["verdict"] == "unresolved")
    assert plan["samples"]["timed"] == min(max(nearest, ROUND_MIN_STEPS), 8)


def test_a_round_fits_the_budget_left_or_is_not_made():
    rows = the_rows()
    goal_list = goals(rows)
    full = plan_round(rows, goal_list, left_s=1e9)["samples"]["timed"]
    # one sample of both engines costs 0.2 s (their medians, 100 ms each)
    assert plan_round(rows, goal_list, left_s=0.45)["samples"]["timed"] == min(2, full)
    assert plan_round(rows, goal_list, left_s=0.1) is None
    assert plan_round(rows, goal_list, left_s=0.0) is None


def test_nothing_left_stops_and_a_tie_waits_its_turn():
    rows = the_rows()
    resolved = [dict(g, verdict="met", steps_to_resolve=None) for g in goals(rows)]
    assert plan_round(rows, resolved, left_s=1e9) is None
    tie = dict(goals(rows)[0], verdict="unresolved", steps_to_resolve=STEPS_CAP)
    near = dict(tie, name="fthenb", steps_to_resolve=3, numerator="ZBH1 pipesplit")
    assert plan_round(rows, [tie, near], left_s=1e9)["goals"] == [goal_key(near)]
    assert plan_round(rows, [tie], left_s=1e9)["goals"] == [goal_key(tie)]


def test_resolutions_keep_the_first_count():
    first = {}
    record_resolutions(first, [{"name": "1f1b", "m": 4, "verdict": "unresolved", "steps": 8,
                                "ratio_ci": [0.9, 1.1]}])
    record_resolutions(first, [{"name": "1f1b", "m": 4, "verdict": "met", "steps": 16,
                                "ratio_ci": [0.9, 1.0]},
                               {"name": "peaks", "m": 4, "verdict": "met", "ratio_ci": None}])
    record_resolutions(first, [{"name": "1f1b", "m": 4, "verdict": "met", "steps": 32,
                                "ratio_ci": [0.9, 1.0]}])
    assert first == {"m=4 1f1b": 16}


def test_the_passes_keep_their_share_of_the_budget():
    rows = the_rows()
    assert reserve_s(rows, 12) == pytest.approx(
        RESERVE_MARGIN_S + 12 * (1 + PASS_ROUNDS_OVER_ASKED) * 3 * 0.020)

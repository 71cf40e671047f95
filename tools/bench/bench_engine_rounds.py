"""How ``tools/bench/bench_engine.py`` samples until its goals resolve: which samples a goal
reads, which engines a round steps, how long a round is, and when sampling stops (issue 58).

A goal reads one of three samples: paired **timed** steps (step times), paired **profiled**
steps (its jobs' times: the split goals) or paired repeats of the engines' **pass** (the pass
goal).  After the samples asked, each round gives more of them only to the engines an
unresolved goal reads -- step i of two engines still ran side by side, so a goal pairs its two
rows' samples of the same index (``bench_engine_report.paired_times``) -- as many as the
nearest such goal's estimate (``verdicts.steps_to_resolve``), at least
:data:`ROUND_MIN_STEPS`, at most the samples so far (the estimate assumes the spread holds:
re-check at twice the sample) and what the rest of the budget fits at the engines' own pace.
A goal whose median sits on its bound (:data:`~pipesplit.tools.bench.verdicts.STEPS_CAP`) is
sampled only when nothing else is left.  Sampling stops when every goal is resolved or the
budget is spent; the report says which, and how many paired samples each verdict rests on
(``resolved_at``: how many it had when it first resolved).

Everything here is pure (rows and goals in, a plan out): rank 0 decides and tells rank 1.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from pipesplit.tools.bench.verdicts import STEPS_CAP

#: the shortest round (one sample moves a median too little to re-check)
ROUND_MIN_STEPS = 2
#: seconds kept for what follows a round: the report's gathering and the passes' repeats
#: beyond their own estimate (``reserve_s``)
RESERVE_MARGIN_S = 20.0
#: the step rounds leave the passes' rounds time for this many times the repeats asked (a
#: pass is tens of ms against a step's hundreds: cheap samples)
PASS_ROUNDS_OVER_ASKED = 4
#: a profiled step's time over a timed one's (the profiler's own cost), for the pace
PROFILED_OVER_TIMED = 1.3

Engine = Tuple[int, str]  # (m, "schedule impl")


def goal_key(goal: dict) -> str:
    """``"m=4 1f1b"``: a goal's name in the resolution record."""
    return f"m={goal['m']} {goal['name']}"


def goal_source(goal: dict) -> Optional[str]:
    """The sample a goal's verdict rests on: ``timed``, ``profiled`` (the split goals),
    ``pass``, or None (a verdict without an interval: "best" when no row fits)."""
    if goal.get("ratio_ci") is None:
        return None
    if goal["name"].startswith("split"):
        return "profiled"
    return "pass" if goal["name"] == "pass" else "timed"


def goal_engines(goal: dict, rows: Sequence[dict]) -> List[Engine]:
    """The engines whose samples ``goal`` reads: its numerator and denominator rows (the pass
    goal: every schedule both impls serve, at its m)."""
    m = goal["m"]
    if goal["name"] == "pass":
        labels = {f"{r['schedule']} {r['impl']}" for r in rows if r["m"] == m}
        return sorted((m, label) for label in labels
                      if label.split()[0] + " paddle" in labels
                      and label.split()[0] + " pipesplit" in labels)
    return sorted({(m, goal["numerator"]), (m, goal["denominator"])})


def record_resolutions(resolved_at: Dict[str, int], goal_list: Sequence[dict]) -> None:
    """Note in ``resolved_at`` the samples each goal had when its verdict first came out met
    or missed (a later check with more samples can still change it; the report's verdict is
    the last)."""
    for goal in goal_list:
        if goal_source(goal) is None:
            continue  # (exact bytes, or nothing fits: no samples to count)
        if goal["verdict"] != "unresolved" and goal_key(goal) not in resolved_at:
            resolved_at[goal_key(goal)] = goal.get("steps")


def unresolved(goal_list: Sequence[dict], sources: Sequence[str]) -> List[dict]:
    """The unresolved goals reading one of ``sources``; those a tie would hold forever only
    when nothing else is left."""
    open_goals = [g for g in goal_list if g["verdict"] == "unresolved"
                  and goal_source(g) in sources]
    return [g for g in open_goals if g["steps_to_resolve"] < STEPS_CAP] or open_goals


def samples_of(row: dict, source: str) -> int:
    """How many samples of ``source`` the engine of ``row`` has."""
    field = {"timed": "step_ms_all", "profiled": "job_ms_steps", "pass": "pass_ms_all"}[source]
    return len(row.get(field) or [])


def seconds_per_sample(row: dict, source: str) -> float:
    """The pace of one more sample of ``source`` on ``row``'s engine (its median so far)."""
    if source == "pass":
        samples = row.get("pass_ms_all") or [row["pass_ms"]]
        return sorted(samples)[len(samples) // 2] / 1e3
    scale = PROFILED_OVER_TIMED if source == "profiled" else 1.0
    return row["step_ms"] * scale / 1e3


def plan_round(rows: Sequence[dict], goal_list: Sequence[dict], left_s: float,
               sources: Sequence[str] = ("timed", "profiled")) -> Optional[dict]:
    """The next round: ``{"engines": {source: [engine, ...]}, "samples": {source: n},
    "goals": [goal keys]}``, or None when no goal of ``sources`` is unresolved or ``left_s``
    (seconds) fits no sample.  Each source's round is as long as its nearest goal's estimate,
    at least ROUND_MIN_STEPS, at most the samples its engines have so far; when the budget
    fits fewer, every source is shortened alike."""
    targets = unresolved(goal_list, sources)
    if not targets or left_s <= 0:
        return None
    by_label = {(r["m"], f"{r['schedule']} {r['impl']}"): r for r in rows}
    engines, samples, cost = {}, {}, 0.0
    for source in sources:
        wanted = [g for g in targets if goal_source(g) == source]
        if not wanted:
            continue
        chosen = sorted({e for g in wanted for e in goal_engines(g, rows)})
        have = max(samples_of(by_label[e], source) for e in chosen)
        nearest = min(g["steps_to_resolve"] for g in wanted)
        engines[source] = chosen
        samples[source] = min(max(nearest, ROUND_MIN_STEPS), max(have, ROUND_MIN_STEPS))
        cost += samples[source] * sum(seconds_per_sample(by_label[e], source) for e in chosen)
    if cost > left_s:
        scale = left_s / cost
        samples = {s: math.floor(n * scale) for s, n in samples.items()}
        if not any(samples.values()):
            return None
    return {"engines": engines, "samples": samples, "goals": [goal_key(g) for g in targets]}


def reserve_s(rows: Sequence[dict], pass_repeats: int) -> float:
    """Seconds to keep for the passes' repeats asked (every engine, at its pace), their
    rounds (:data:`PASS_ROUNDS_OVER_ASKED` times as many more) and the report, out of the
    budget the step rounds may spend."""
    repeats = pass_repeats * (1 + PASS_ROUNDS_OVER_ASKED)
    return RESERVE_MARGIN_S + repeats * sum(seconds_per_sample(r, "pass") for r in rows)


def describe_round(plan: dict) -> str:
    """``2 timed steps of 1F1B pipesplit, 1F1B paddle (m=4); ...`` for the workers' log."""
    parts = []
    for source, chosen in plan["engines"].items():
        if plan["samples"].get(source):
            names = ", ".join(f"{label} (m={m})" for m, label in chosen)
            parts.append(f"{plan['samples'][source]} {source} samples of {names}")
    return "; ".join(parts) + " for " + ", ".join(plan["goals"])

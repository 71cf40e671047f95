"""How ``tools/bench/bench_engine.py`` samples until its goals resolve: which samples a goal
reads, which goals a round serves and which engines it steps, how long a round is, and when
sampling stops (issue 58).

A goal reads one of three samples: paired **timed** steps (step times), paired **profiled**
steps (its jobs' times: the split goals) or paired repeats of the engines' **pass** (the pass
goal).  After the samples asked, each round gives more of them only to the engines of the
unresolved goals nearest to resolving -- step i of two engines still ran side by side, so a
goal pairs its two rows' samples of the same index (``bench_engine_report.paired_times``).

A goal's price (:func:`price_s`) is the seconds its resolution would take: its estimate
(``verdicts.steps_to_resolve``) times the pace of the engines it reads (their medians so far),
an engine the round already steps not counted again (stepping it serves every goal that reads
it).  A round takes the goals cheapest first while their prices together fit the rest of the
budget (:func:`choose_goals`), so the budget goes to the goals it can resolve: a goal it
cannot resolve waits while a cheaper one is left, and is sampled (the cheapest first) when none
is.  The goals the run owes a verdict (a median more than
:data:`~pipesplit.tools.bench.verdicts.NEAR_BOUND` from its bound: :func:`must_resolve`) come
first; a goal nearer its bound may stay unresolved, and is sampled when none of those is left
(or for free, its engines stepped already).  Each source's round is as long as its nearest
chosen goal's estimate, at least :data:`ROUND_MIN_STEPS`, at most the samples so far (the
estimate assumes the spread holds: re-check at twice the sample) and what the rest of the
budget fits at the engines' own pace.
A goal whose median sits on its bound (:data:`~pipesplit.tools.bench.verdicts.STEPS_CAP`) is
sampled only when nothing else is left.

Sampling stops when every goal is resolved or the budget is spent; the report says which, how
many paired samples each verdict rests on (``resolved_at``: how many it had when it first
resolved) and, for each goal left unresolved, whether its median is within
:data:`~pipesplit.tools.bench.verdicts.NEAR_BOUND` of its bound (it may stay unresolved) or
further (the budget fell short).

Everything here is pure (rows and goals in, a plan out): rank 0 decides and tells rank 1.
"""
from __future__ import annotations

import math
from typing import Collection, Dict, List, Optional, Sequence, Tuple

from pipesplit.tools.bench.verdicts import STEPS_CAP, near_bound

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


def rows_by_engine(rows: Sequence[dict]) -> Dict[Engine, dict]:
    """Each engine's row."""
    return {(r["m"], f"{r['schedule']} {r['impl']}"): r for r in rows}


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


def price_s(goal: dict, rows: Sequence[dict], stepped: Collection[Tuple[str, Engine]] = ()
            ) -> float:
    """Seconds ``goal``'s resolution would take: its estimate (``steps_to_resolve``) times the
    pace of the engines it reads, less those ``stepped`` already ((source, engine) pairs of the
    round: stepping an engine serves every goal that reads it)."""
    source, by_label = goal_source(goal), rows_by_engine(rows)
    fresh = [e for e in goal_engines(goal, rows) if (source, e) not in stepped]
    return goal["steps_to_resolve"] * sum(seconds_per_sample(by_label[e], source) for e in fresh)


def must_resolve(goal: dict) -> bool:
    """Whether the run owes ``goal`` a verdict: its median lies more than
    :data:`~pipesplit.tools.bench.verdicts.NEAR_BOUND` from its bound (one nearer may stay
    unresolved: ``verdicts.near_bound``), or it has no median yet."""
    return goal.get("ratio") is None or not near_bound(goal["ratio"], goal["bound"])


def choose_goals(rows: Sequence[dict], targets: Sequence[dict], left_s: float) -> List[dict]:
    """The goals a round serves: those the run owes a verdict (:func:`must_resolve`) while any
    is left, else the others; among them cheapest first (:func:`price_s`, each priced beside
    the engines already chosen; ties in ``targets``' order) while their prices together fit
    ``left_s``: a goal the rest of the budget cannot resolve waits while a cheaper one is
    left.  The cheapest is always taken (when none fits, nothing cheaper is left); any other
    goal whose engines are all chosen already costs nothing and rides along."""
    owed = [g for g in targets if must_resolve(g)]
    chosen = _cheapest_first(rows, owed or list(targets), left_s)
    stepped = _stepped(rows, chosen)
    riders = [g for g in targets if g not in chosen and price_s(g, rows, stepped) == 0]
    return chosen + riders


def _stepped(rows: Sequence[dict], goal_list: Sequence[dict]) -> set:
    """The (source, engine) pairs a round serving ``goal_list`` steps."""
    return {(goal_source(g), e) for g in goal_list for e in goal_engines(g, rows)}


def _cheapest_first(rows: Sequence[dict], candidates: Sequence[dict], left_s: float
                    ) -> List[dict]:
    chosen: List[dict] = []
    waiting, spent = list(candidates), 0.0
    while waiting:
        stepped = _stepped(rows, chosen)
        prices = [price_s(g, rows, stepped) for g in waiting]
        cheapest = min(range(len(waiting)), key=prices.__getitem__)
        if chosen and prices[cheapest] > 0 and spent + prices[cheapest] > left_s:
            break
        chosen.append(waiting.pop(cheapest))
        spent += prices[cheapest]
    return chosen


def round_samples(goals_of_source: Sequence[dict], have: int) -> int:
    """A source's round length: its nearest chosen goal's estimate, at least ROUND_MIN_STEPS,
    at most the ``have`` samples its engines have so far (the estimate assumes the spread
    holds: re-check at twice the sample)."""
    nearest = min(g["steps_to_resolve"] for g in goals_of_source)
    return min(max(nearest, ROUND_MIN_STEPS), max(have, ROUND_MIN_STEPS))


def plan_round(rows: Sequence[dict], goal_list: Sequence[dict], left_s: float,
               sources: Sequence[str] = ("timed", "profiled")) -> Optional[dict]:
    """The next round: ``{"engines": {source: [engine, ...]}, "samples": {source: n},
    "goals": [goal keys served], "waiting": [unresolved goal keys not served],
    "price_s": {goal key: seconds alone}}``, or None when no goal of ``sources`` is unresolved
    or ``left_s`` (seconds) fits no sample.  The goals served are :func:`choose_goals`'; each
    source's round is :func:`round_samples` long over its chosen goals; when the budget fits
    fewer, every source is shortened alike."""
    targets = unresolved(goal_list, sources)
    if not targets or left_s <= 0:
        return None
    by_label = rows_by_engine(rows)
    chosen = choose_goals(rows, targets, left_s)
    engines, samples, cost = {}, {}, 0.0
    for source in sources:
        served = [g for g in chosen if goal_source(g) == source]
        if not served:
            continue
        engines[source] = sorted({e for g in served for e in goal_engines(g, rows)})
        samples[source] = round_samples(served, max(samples_of(by_label[e], source)
                                                     for e in engines[source]))
        cost += samples[source] * sum(seconds_per_sample(by_label[e], source)
                                      for e in engines[source])
    if cost > left_s:
        scale = left_s / cost
        samples = {s: math.floor(n * scale) for s, n in samples.items()}
        if not any(samples.values()):
            return None
    keys = [goal_key(g) for g in chosen]
    return {"engines": engines, "samples": samples, "goals": keys,
            "waiting": [goal_key(g) for g in goal_list if g["verdict"] == "unresolved"
                        and goal_source(g) in sources and goal_key(g) not in keys],
            "price_s": {goal_key(g): round(price_s(g, rows), 1) for g in targets}}


def reserve_s(rows: Sequence[dict], pass_repeats: int) -> float:
    """Seconds to keep for the passes' repeats asked (every engine, at its pace), their
    rounds (:data:`PASS_ROUNDS_OVER_ASKED` times as many more) and the report, out of the
    budget the step rounds may spend."""
    repeats = pass_repeats * (1 + PASS_ROUNDS_OVER_ASKED)
    return RESERVE_MARGIN_S + repeats * sum(seconds_per_sample(r, "pass") for r in rows)


def describe_round(plan: dict) -> str:
    """``2 timed samples of 1F1B paddle (m=4), 1F1B pipesplit (m=4) for m=4 1f1b; waiting:
    m=8 1f1b (~3312 s alone)`` for the workers' log."""
    parts = []
    for source, chosen in plan["engines"].items():
        if plan["samples"].get(source):
            names = ", ".join(f"{label} (m={m})" for m, label in chosen)
            parts.append(f"{plan['samples'][source]} {source} samples of {names}")
    text = "; ".join(parts) + " for " + ", ".join(plan["goals"])
    prices = plan.get("price_s", {})
    waiting = [key + (f" (~{prices[key]:.0f} s alone)" if key in prices else "")
               for key in plan.get("waiting", ())]
    return text + ("; waiting: " + ", ".join(waiting) if waiting else "")

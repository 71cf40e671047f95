"""Verdicts with confidence for the benchmarks' ratio goals ("A <= 0.88 x B"), standard library
only.

On a machine whose fixed unit of work has an interquartile range of 12-15 % of its median
(``tools/bench/machine_noise.py``), one run's ratio of two medians lands on either side of a
bound a few per cent away.  The benchmarks step their engines in turn, so step i of engine A
and step i of engine B ran at nearly the same time and share the machine's drift: their ratio
is one *paired* sample.  A goal's figure is the median of the paired ratios, with a percentile
bootstrap interval around it, and its verdict is

* ``met``: the whole interval is on the goal's side of the bound;
* ``missed``: the whole interval is on the other side;
* ``unresolved``: the interval straddles the bound -- more steps, or a steadier machine, would
  tell; :func:`steps_to_resolve` estimates how many.

Everything here is deterministic given the seed (``random.Random(seed)``), so two processes
that compute a verdict from the same figures agree.
"""
from __future__ import annotations

import math
import random
from statistics import median, quantiles
from typing import Dict, List, Optional, Sequence, Tuple, Union

#: the interval's coverage unless told otherwise
DEFAULT_CONFIDENCE = 0.95
#: bootstrap resamples: the interval's ends move by well under 1 % of its width between seeds
#: at this many, and 2000 medians of a few hundred ratios take a fraction of a second
DEFAULT_RESAMPLES = 2000
#: the bootstrap's seed unless told otherwise (verdicts must not change between two reports
#: of the same figures)
DEFAULT_SEED = 0
#: the most further steps :func:`steps_to_resolve` reports: beyond it (a median on, or almost
#: on, the bound) the goal is a tie at this machine's spread, whatever the count says
STEPS_CAP = 1_000_000
#: which side of the bound a goal wants its ratio: ``at_most`` (ratio <= bound),
#: ``at_least`` (ratio >= bound), ``between`` (bound is a (low, high) pair, both inclusive)
DIRECTIONS = ("at_most", "at_least", "between")
VERDICTS = ("met", "missed", "unresolved")
#: how near its bound (relative: |ratio / bound - 1|) a goal's median may lie and the goal stay
#: unresolved without the run having fallen short: at a machine noise of 12-15 % a 3 % answer
#: needs 54-166 paired steps (docs/measurements.md, "How many steps a 3 % answer needs"), more
#: than a default run's budget holds, while a median further off resolves within it on a quiet
#: machine (issue 58)
NEAR_BOUND = 0.03

Interval = Tuple[float, float, float]  # (median, low, high)


# =========================================================================== samples

def iqr(values: Sequence[float]) -> float:
    """Interquartile range (0 for a single value)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = quantiles(values, n=4, method="inclusive")
    return q3 - q1


def paired_ratios(a_times: Sequence[float], b_times: Sequence[float]) -> List[float]:
    """``a_times[i] / b_times[i]`` per step: step i of both engines ran back to back, so their
    ratio cancels what the machine did to both (its drift), unlike a ratio of medians."""
    if len(a_times) != len(b_times):
        raise ValueError(f"a_times and b_times must pair step by step: {len(a_times)} vs "
                         f"{len(b_times)} times")
    if len(a_times) < 2:
        raise ValueError(f"a_times and b_times need at least 2 paired times for an interval, "
                         f"got {len(a_times)}")
    for name, times in (("a_times", a_times), ("b_times", b_times)):
        bad = [(i, t) for i, t in enumerate(times) if not (math.isfinite(t) and t > 0)]
        if bad:
            raise ValueError(f"{name}: times must be finite and > 0, got {bad[0][1]!r} at "
                             f"index {bad[0][0]}")
    return [a / b for a, b in zip(a_times, b_times)]


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered``, linear between the nearest two."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _check_ratios(ratios: Sequence[float]) -> None:
    if len(ratios) < 2:
        raise ValueError(f"ratios: need at least 2 for an interval, got {len(ratios)}")
    bad = [r for r in ratios if not math.isfinite(r)]
    if bad:
        raise ValueError(f"ratios must be finite, got {bad[0]!r}")


def _check_options(confidence: float, resamples: int) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")


# =========================================================================== the interval

def bootstrap_interval(ratios: Sequence[float], confidence: float = DEFAULT_CONFIDENCE,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
                       ) -> Interval:
    """(median, low, high): the median of ``ratios`` and the percentile bootstrap interval of
    it at ``confidence`` (the median of ``resamples`` resamples with replacement; their
    (1 - confidence) / 2 and (1 + confidence) / 2 quantiles).

    The median, not the mean: a step the machine stalled in is an outlier the mean follows.
    The percentile bootstrap assumes nothing about the ratios' distribution, only that the
    steps are exchangeable (no trend over the run).  Its interval of a median can, for a few
    lumpy samples, leave out the sample median itself; the ends are then widened to it, so
    ``low <= median <= high`` always holds."""
    _check_ratios(ratios)
    _check_options(confidence, resamples)
    rng = random.Random(seed)
    values, n = list(ratios), len(ratios)
    medians = sorted(median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    mid = median(values)
    return mid, min(_percentile(medians, tail), mid), max(_percentile(medians, 1 - tail), mid)


def _bounds(bound, direction: str) -> Tuple[float, ...]:
    """The goal's bound(s) as a tuple, checked against ``direction``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if direction == "between":
        if not (isinstance(bound, (tuple, list)) and len(bound) == 2 and bound[0] <= bound[1]):
            raise ValueError(f"bound must be a (low, high) pair with low <= high for "
                             f"'between', got {bound!r}")
        return float(bound[0]), float(bound[1])
    if isinstance(bound, (tuple, list)) or not math.isfinite(bound):
        raise ValueError(f"bound must be one finite number for {direction!r}, got {bound!r}")
    return (float(bound),)


def verdict(interval: Interval, bound, direction: str = "at_most") -> str:
    """``met`` when the whole interval (the ``(median, low, high)`` of
    :func:`bootstrap_interval`) is on the goal's side of ``bound`` (the bound itself counts as
    that side), ``missed`` when the whole interval is on the other side, else
    ``unresolved``."""
    _, low, high = interval
    if not low <= high:
        raise ValueError(f"interval: low must be <= high, got {interval!r}")
    bounds = _bounds(bound, direction)
    if direction == "at_most":
        met, missed = high <= bounds[0], low > bounds[0]
    elif direction == "at_least":
        met, missed = low >= bounds[0], high < bounds[0]
    else:
        met = bounds[0] <= low and high <= bounds[1]
        missed = high < bounds[0] or low > bounds[1]
    return "met" if met else "missed" if missed else "unresolved"


# =========================================================================== how many more

def _steps_past(interval: Interval, bound: float, n: int) -> int:
    """Further steps until the interval's side facing ``bound`` stops short of it, its width
    shrinking as 1 / sqrt(steps) about a median that stays put."""
    mid, low, high = interval
    distance = abs(bound - mid)
    if distance == 0:
        return STEPS_CAP
    half_width = high - mid if bound >= mid else mid - low
    needed = math.ceil(n * (half_width / distance) ** 2)
    return min(max(needed - n, 1), STEPS_CAP)


def steps_to_resolve(ratios: Sequence[float], bound, direction: str = "at_most",
                     confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
                     seed: int = DEFAULT_SEED, interval: Optional[Interval] = None
                     ) -> Optional[int]:
    """About how many more paired steps would resolve an unresolved goal; None when the
    verdict is already ``met`` or ``missed``.  ``interval``: :func:`bootstrap_interval` of
    ``ratios`` with these options, if already computed.

    The estimate assumes the median of the ratios stays where it is and their spread stays
    what it is, so the interval's half-width on the bound's side shrinks as 1 / sqrt(n) (as a
    median's standard error does): ``n * (half_width / |median - bound|) ** 2`` steps in all,
    less the ``n`` done, at least 1.  A median on the bound never resolves: :data:`STEPS_CAP`
    (the cap also bounds a median a hair off it).  Both assumptions fail when the machine's
    speed drifts, so the count is a guide for the next round's length, not a promise."""
    if interval is None:
        interval = bootstrap_interval(ratios, confidence, resamples, seed)
    if verdict(interval, bound, direction) != "unresolved":
        return None
    _, low, high = interval
    straddled = [b for b in _bounds(bound, direction) if low <= b <= high]
    return max(_steps_past(interval, b, len(ratios)) for b in straddled)


# =========================================================================== goals

def min_steps(confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest ratios whose whole range (smallest to largest) holds their distribution's
    median with probability >= ``confidence``: 1 - 2 * 0.5 ** n >= confidence (6 at 95 %).
    Below it no interval of the sample can have that coverage -- a percentile bootstrap of
    2 ratios returns their range, which holds the median half the time -- so a goal gets no
    verdict from fewer."""
    _check_options(confidence, 1)
    return math.ceil(math.log2(2 / (1 - confidence)) - 1e-12)


def ratio_figures(ratios: Sequence[float], bound, direction: str = "at_most",
                  confidence: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED
                  ) -> Dict[str, object]:
    """A goal's figures from its per-step ratios, as the benchmarks' JSON carries them:
    ``ratio`` (median), ``ratio_ci`` [low, high], ``bound``, ``direction``, ``confidence``,
    ``steps`` (ratios), ``verdict`` and ``steps_to_resolve``.  Fewer ratios than
    :func:`min_steps` leave the goal ``unresolved`` whatever the interval says, at least the
    missing ones to go."""
    mid, low, high = interval = bootstrap_interval(ratios, confidence, seed=seed)
    bounds = _bounds(bound, direction)
    judged = verdict(interval, bound, direction)
    more = steps_to_resolve(ratios, bound, direction, confidence, seed=seed, interval=interval)
    short = min_steps(confidence) - len(ratios)
    if short > 0:
        judged, more = "unresolved", max(short, more or 0)
    return {"ratio": mid, "ratio_ci": [low, high],
            "bound": list(bounds) if direction == "between" else bounds[0],
            "direction": direction, "confidence": confidence, "steps": len(ratios),
            "verdict": judged, "steps_to_resolve": more}


def combine(verdicts: Sequence[str]) -> str:
    """One verdict for a goal that needs every part met: ``missed`` if any part is,
    ``unresolved`` if any part is (and none missed), else ``met``."""
    bad = [v for v in verdicts if v not in VERDICTS]
    if bad:
        raise ValueError(f"verdicts must be among {VERDICTS}, got {bad[0]!r}")
    return "missed" if "missed" in verdicts else "unresolved" if "unresolved" in verdicts \
        else "met"


def combined_steps(parts: Sequence[Dict[str, object]]) -> Optional[int]:
    """Further steps for a goal that needs every part met (``parts``: :func:`ratio_figures`
    dicts): None when resolved (met, or one part already missed), else the most any
    unresolved part needs."""
    if combine([p["verdict"] for p in parts]) != "unresolved":
        return None
    return max(p["steps_to_resolve"] for p in parts if p["verdict"] == "unresolved")


def bound_distance(ratio: float, bound) -> float:
    """How far ``ratio`` lies from ``bound``, relative to it: |ratio / bound - 1|, to the
    nearer end of a ``between`` pair."""
    bounds = bound if isinstance(bound, (tuple, list)) else (bound,)
    return min(abs(ratio / b - 1) for b in bounds)


def near_bound(ratio: float, bound, margin: float = NEAR_BOUND) -> bool:
    """Whether ``ratio`` lies within ``margin`` of ``bound`` (:func:`bound_distance`; the
    margin itself counts, whatever the floats' rounding): a goal that may stay unresolved."""
    distance = bound_distance(ratio, bound)
    return distance <= margin or math.isclose(distance, margin)


def describe(figures: Dict[str, object]) -> str:
    """``1.012 [0.981, 1.043] over 12 steps, ~40 more to resolve`` (the verdict is the
    caller's to print), for the reports."""
    low, high = figures["ratio_ci"]
    text = f"{figures['ratio']:.3f} [{low:.3f}, {high:.3f}] over {figures['steps']} steps"
    more = figures.get("steps_to_resolve")
    if more is not None:
        text += f", ~{more} more to resolve" if more < STEPS_CAP else ", a tie at this spread"
    return text


def bound_text(bound: Union[float, Sequence[float]], direction: str) -> str:
    """``<= 1.03``, ``>= 0.9`` or ``in [0.85, 1.15]``."""
    if direction == "between":
        return f"in [{bound[0]:g}, {bound[1]:g}]"
    return f"{'<=' if direction == 'at_most' else '>='} {bound:g}"

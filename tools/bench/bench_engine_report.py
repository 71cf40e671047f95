"""The report of ``tools/bench/bench_engine.py``: loss differences, the issue's goals with their
verdicts (``tools/bench/verdicts.py``), the table and the figures that explain a miss (simulated
beside measured, and each schedule's own job times read back from Paddle's profiler)."""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from pipesplit.job_list.ir import COMPUTE_KINDS, FORWARD, OPTIMIZER
from pipesplit.job_list.text import text_table
from pipesplit.tools.bench.memory_model import memory_model_table, predictions
from pipesplit.tools.bench.verdicts import (DEFAULT_CONFIDENCE, NEAR_BOUND, bound_distance,
                                            bound_text, combine, combined_steps, describe,
                                            near_bound, paired_ratios, ratio_figures)

REFERENCE = ("1F1B", "paddle")
#: the goals, each a bound on the median of paired ratios (numerator / denominator)
GOAL_1F1B_RATIO = 1.03     # pipesplit 1F1B step <= this x Paddle 1F1B step (issue 31)
#: pipesplit's fastest schedule <= this x Paddle's fastest, per m (issue 31 at m = 4, where
#: 1F1B idles 1/5 of its step at pp 2; issue 42 at m = 8, 1/9)
GOAL_FASTEST_RATIO = {4: 0.88, 8: 0.93}
GOAL_AUTO_RATIO = 1.03     # auto <= this x the fastest other pipesplit schedule (issue 42)
#: issue 21's goal, kept: pipesplit best <= this x Paddle best, at no more peak per rank
GOAL_BEST_RATIO = 0.90
#: issue 42: pipesplit's FThenB <= this x Paddle's FThenB (the same order), every m
GOAL_FTHENB_RATIO = 1.02
#: issue 42: VPP (vpp 2) <= this x pipesplit's 1F1B, at GOAL_VPP_M
GOAL_VPP_RATIO, GOAL_VPP_M = 1.0, 8
#: issue 42: a stage's split backward (I + W of SPLIT_SCHEDULE) <= this x its fused backward
#: (B of 1F1B), from the profiled steps' job times, per stage
GOAL_SPLIT_RATIO, SPLIT_SCHEDULE = 1.05, "ZBH1"
#: issue 42: ``auto`` under a memory budget of Paddle 1F1B's measured peak (BUDGET_SCHEDULE)
#: <= this x Paddle's 1F1B step, at GOAL_BUDGET_M
GOAL_BUDGET_RATIO, GOAL_BUDGET_M, BUDGET_SCHEDULE = 0.95, 4, "auto-budget"
#: pipesplit's pipeline pass <= this x Paddle's, same schedule (issue 42)
GOAL_PASS_RATIO = 1.0
#: issue 58: pipesplit's fastest <= this x the zero-bubble limit, m / (m + pp - 1) x Paddle's
#: 1F1B (1F1B idles (pp - 1) / (m + pp - 1) of its step; a schedule without a bubble does not)
GOAL_BUBBLE_MARGIN = 1.03


def add_loss_diffs(rows: List[dict], reference: Optional[List[List[float]]]) -> None:
    """``max_loss_diff`` of every row against Paddle's 1F1B row, else ``reference``, over the
    steps both have (a run stepped past the example's steps cycles its batches; the
    example's reference stops at its own)."""
    ref_row = next((r for r in rows if (r["schedule"], r["impl"]) == REFERENCE), None)
    ref = ref_row["losses"] if ref_row is not None else reference
    for row in rows:
        row["loss_reference"] = "paddle 1F1B" if ref_row is not None else "example reference"
        if row["losses"] is None or ref is None:
            row["max_loss_diff"] = None
            continue
        row["max_loss_diff"] = max(abs(a - b) for ours, theirs in zip(row["losses"], ref)
                                   for a, b in zip(ours, theirs))


def by_m(rows: List[dict]) -> List[Tuple[int, List[dict]]]:
    """``(m, that m's rows)`` in increasing m."""
    return [(m, [r for r in rows if r["m"] == m]) for m in sorted({r["m"] for r in rows})]


def goals(rows: List[dict]) -> List[dict]:
    """Every goal at every m, in one list: each a dict with ``name``, ``m``, ``text``,
    ``numerator`` / ``denominator`` (the rows, "schedule impl") and the figures of
    :func:`~pipesplit.tools.bench.verdicts.ratio_figures` (``ratio``, ``ratio_ci``, ``bound``,
    ``verdict``, ``steps_to_resolve``, ...).  Computed from the rows' per-step times only, so
    the workers' check between rounds and the final report agree."""
    out = []
    for m, group in by_m(rows):
        out += [{"name": goal["name"], "m": m, **goal} for goal in goals_at(m, group)]
    return out


def goals_at(m: int, rows: List[dict]) -> List[dict]:
    """The goals that ``rows`` (one m) have the rows for."""
    find = {(r["schedule"], r["impl"]): r for r in rows}
    budgeted = find.get((BUDGET_SCHEDULE, "pipesplit"))
    ours = [r for r in rows if r["impl"] == "pipesplit" and r is not budgeted]
    theirs = [r for r in rows if r["impl"] == "paddle"]
    out = []
    if ("1F1B", "pipesplit") in find and REFERENCE in find:
        out.append(ratio_goal("1f1b", "pipesplit 1F1B <= {bound} x Paddle 1F1B",
                              find[("1F1B", "pipesplit")], find[REFERENCE], GOAL_1F1B_RATIO))
    if ("FThenB", "pipesplit") in find and ("FThenB", "paddle") in find:
        out.append(ratio_goal("fthenb", "pipesplit FThenB <= {bound} x Paddle FThenB (the same "
                              "order)", find[("FThenB", "pipesplit")], find[("FThenB", "paddle")],
                              GOAL_FTHENB_RATIO))
    if ours and theirs and m in GOAL_FASTEST_RATIO:
        out.append(ratio_goal("fastest", "pipesplit's fastest ({num}) <= {bound} x Paddle's "
                              "fastest ({den})", fastest(ours), fastest(theirs),
                              GOAL_FASTEST_RATIO[m]))
    if ours and REFERENCE in find:
        out.append(bubble_goal(m, fastest(ours), find[REFERENCE]))
    if ours and theirs:
        out.append(best_goal(ours, theirs))
    auto = find.get(("auto", "pipesplit"))
    others = [r for r in ours if r is not auto]
    if auto and others:
        out.append(ratio_goal("auto", f"auto (measured step "
                              f"{(auto.get('replanned') or {}).get('step')}, re-planned) <= "
                              "{bound} x the fastest other pipesplit schedule ({den})",
                              auto, fastest(others), GOAL_AUTO_RATIO))
    if m == GOAL_VPP_M and ("VPP", "pipesplit") in find and ("1F1B", "pipesplit") in find:
        vpp, one = find[("VPP", "pipesplit")], find[("1F1B", "pipesplit")]
        out.append(ratio_goal("vpp", "VPP (vpp 2) <= {bound} x pipesplit 1F1B" +
                              _transfers_beside(vpp, one), vpp, one, GOAL_VPP_RATIO))
    if m == GOAL_BUDGET_M and budgeted and REFERENCE in find:
        out.append(budget_goal(budgeted, find[REFERENCE]))
    split, fused = find.get((SPLIT_SCHEDULE, "pipesplit")), find.get(("1F1B", "pipesplit"))
    if split and fused and split.get("job_ms_steps") and fused.get("job_ms_steps"):
        out += split_goals(split, fused)
    passes = [(name, row, find[(name, "paddle")]) for (name, impl), row in find.items()
              if impl == "pipesplit" and (name, "paddle") in find]
    if passes:
        out.append(peaks_goal(passes))
    if passes and all(a.get("pass_ms_all") and b.get("pass_ms_all") for _, a, b in passes):
        # (none while the steps run: the passes are repeated after the last)
        out.append(pass_goal(passes))
    return out


def _transfers_beside(row: dict, other: dict) -> str:
    """``row``'s and ``other``'s ms in transfer jobs per rank in their last profiled step (the
    measured why of an interleaved schedule on a slow transport); empty without profiles."""
    if not (row.get("job_ms") and other.get("job_ms")):
        return ""
    comm = dict(_JOB_COLUMNS)["comm"]

    def per_rank(r):
        return "/".join(f"{sum(rank['total'].get(k, 0.0) for k in comm):.0f}"
                        for rank in r["job_ms"])

    return (f" (ms in transfers, last profiled step, per rank: {row['schedule']} "
            f"{per_rank(row)}, {other['schedule']} {per_rank(other)})")


def budget_goal(budgeted: dict, base: dict) -> dict:
    """``auto`` under a memory budget of Paddle 1F1B's measured peak (its worst rank: what a
    device must hold, on top of what the process holds for its other engines): its step
    against Paddle 1F1B's (paired), and missed outright when the process's peak exceeds the
    budget on some rank (exact bytes, no interval).  The row's own peak (resident + transient)
    beside Paddle 1F1B's is stated too: it differs from the budget's view by what the rest of
    the process freed or allocated between the budget's reading and the step."""
    budget = budgeted["budget_bytes"]
    goal = ratio_goal("budget", "auto under a memory budget of Paddle 1F1B's peak (" +
                      mib_per_rank([max(base["peak_bytes"])]) + " of its own; the process's "
                      "budget " + mib_per_rank([budget]) + ") <= {bound} x Paddle 1F1B (the "
                      "process's peak " + mib_per_rank(budgeted["process_peak_bytes"]) + "; its "
                      "own " + mib_per_rank(budgeted["peak_bytes"]) + ")", budgeted, base,
                      GOAL_BUDGET_RATIO)
    if max(budgeted["process_peak_bytes"]) > budget:
        goal.update(verdict="missed", steps_to_resolve=None,
                    text=goal["text"] + ": a process's peak is above its budget")
    return goal


def split_ms(summaries: Sequence[dict], rank: int, kinds: Sequence[str]) -> List[float]:
    """Per profiled step, ``rank``'s ms in the job kinds ``kinds`` (all micro-batches)."""
    return [sum(step[rank]["total"].get(kind, 0.0) for kind in kinds) for step in summaries]


def split_ops(split: dict, fused: dict, rank: int) -> Tuple[int, int, Dict[str, int]]:
    """``rank``'s backward op count under 1F1B (B) and under the split schedule (I + W), and
    the ops the split adds (> 0) or removes (< 0), by name."""
    def counted(row, prefixes):
        total: Dict[str, int] = {}
        for job_type, ops in (row.get("backward_ops") or [{}] * (rank + 1))[rank].items():
            if job_type.rstrip("0123456789") in prefixes:
                for name, n in ops.items():
                    total[name] = total.get(name, 0) + n
        return total
    fused_ops, split_ops_ = counted(fused, ("backward",)), counted(split, ("backward_b",
                                                                             "backward_w"))
    change = {name: split_ops_.get(name, 0) - fused_ops.get(name, 0)
              for name in sorted(set(fused_ops) | set(split_ops_))}
    return (sum(fused_ops.values()), sum(split_ops_.values()),
            {name: n for name, n in change.items() if n})


def split_goals(split: dict, fused: dict) -> List[dict]:
    """Per stage (rank: pp ranks, vpp 1): ``SPLIT_SCHEDULE``'s I + W against 1F1B's B, the
    ratio of each profiled step's sums over the micro-batches (step i of one against step i of
    the other: they ran in the same rotation)."""
    out = []
    for rank in range(len(split["job_ms_steps"][0])):
        num = split_ms(split["job_ms_steps"], rank, ("backward_b", "backward_w"))
        den = split_ms(fused["job_ms_steps"], rank, ("backward",))
        figures = ratio_figures(paired_ratios(num, den), GOAL_SPLIT_RATIO)
        b_ops, iw_ops, change = split_ops(split, fused, rank)
        out.append({"name": f"split_stage{rank}", "ops_b": b_ops, "ops_i_w": iw_ops,
                    "ops_added": change,
                    "text": f"stage {rank}: I + W of {SPLIT_SCHEDULE} <= {GOAL_SPLIT_RATIO:g} x "
                            f"B of 1F1B (profiled steps, sums over the micro-batches: "
                            f"{statistics.median(num):.1f} vs {statistics.median(den):.1f} ms; "
                            f"ops {iw_ops} vs {b_ops}"
                            + (": " + ", ".join(f"{n:+d} {name.split('.')[-1]}"
                                                for name, n in change.items()) if change else "")
                            + ")",
                    "numerator": label(split), "denominator": label(fused), **figures})
    return out


def label(row: dict) -> str:
    return f"{row['schedule']} {row['impl']}"


def fastest(rows: List[dict]) -> dict:
    """The row of the lowest median step (the choice itself is by medians)."""
    return min(rows, key=lambda r: r["step_ms"])


def bubble_goal(m: int, ours: dict, paddle_1f1b: dict) -> dict:
    """pipesplit's fastest row <= GOAL_BUBBLE_MARGIN x m / (m + pp - 1) x Paddle's 1F1B: the
    step of a pipeline without a bubble, within the margin.  With profiled steps of both rows
    the goal also carries the fastest row's ``floor`` (:func:`floor_figures`): whether any
    order of its jobs could meet the bound on this machine."""
    pp = paddle_1f1b.get("pp", 2)
    limit = m / (m + pp - 1)
    bound = round(GOAL_BUBBLE_MARGIN * limit, 4)
    goal = ratio_goal("bubble", "pipesplit's fastest ({num}) <= {bound} x Paddle 1F1B "
                      f"({GOAL_BUBBLE_MARGIN:g} x the zero-bubble limit m / (m + pp - 1) = "
                      f"{limit:.4f})", ours, paddle_1f1b, bound)
    floor = floor_figures(ours, paddle_1f1b, bound)
    if floor is not None:
        goal["floor"] = floor
        goal["text"] += (f"; its own jobs, in any order with free transfers: at least "
                         f"{describe(dict(floor, steps_to_resolve=None))} (profiled steps) x "
                         f"Paddle 1F1B: {FLOOR_MEANING[floor['verdict']]}")
    return goal


#: the job kinds in which a rank computes (the IR's compute kinds and the optimizer; its
#: transfers, and the waits inside them, left out): what a profiled step's floor sums
FLOOR_KINDS = COMPUTE_KINDS + (OPTIMIZER,)
#: what the floor's verdict against the bubble bound says of the goal
FLOOR_MEANING = {"met": "within reach, the rest is transfers and waits",
                 "missed": "out of reach on this machine, whatever the order",
                 "unresolved": "the bound lies within the floor's interval"}


def step_floor(step: Sequence[dict]) -> float:
    """The least time (ms) any order of one profiled step's jobs could take, every transfer
    free and no rank waiting but for its first input: rank r computes its jobs' sum
    (:data:`FLOOR_KINDS`) after ranks 0 .. r - 1 each ran one forward of its first chunk
    (the first micro-batch reaches it no sooner; that job's median stands for the first).
    ``step``: the ranks' :func:`job_summary`, in pipeline order."""
    floor = start = 0.0
    for summary in step:
        compute = sum(summary["total"].get(kind, 0.0) for kind in FLOOR_KINDS)
        floor = max(floor, start + compute)
        first = summary["median"]
        start += first.get(f"{FORWARD}0", first.get(FORWARD, 0.0))
    return floor


def floor_figures(row: dict, base: dict, bound: float) -> Optional[dict]:
    """``row``'s :func:`step_floor` over ``base``'s step, profiled step i beside profiled step
    i (the same rotation), judged against ``bound`` (``verdicts.ratio_figures``); None with
    fewer than two profiled steps of both."""
    spans = base.get("profiled_ms_all") or []
    floors = [step_floor(step) for step in row.get("job_ms_steps") or []]
    n = min(len(floors), len(spans))
    if n < 2:  # (no interval from fewer)
        return None
    return ratio_figures(paired_ratios(floors[:n], spans[:n]), bound)


def paired_times(num: dict, den: dict) -> Tuple[List[float], List[float]]:
    """The two rows' step times that ran side by side: the steps of the same index
    (``step_ids``: rounds step only the engines an unresolved goal reads), else position by
    position."""
    if "step_ids" not in num or "step_ids" not in den:
        return num["step_ms_all"], den["step_ms_all"]
    theirs = dict(zip(den["step_ids"], den["step_ms_all"]))
    pairs = [(t, theirs[i]) for i, t in zip(num["step_ids"], num["step_ms_all"]) if i in theirs]
    return [a for a, _ in pairs], [b for _, b in pairs]


def ratio_goal(name: str, text: str, num: dict, den: dict, bound: float) -> dict:
    """``num`` <= ``bound`` x ``den``, from the paired ratios of their per-step times;
    ``text`` may name ``{num}``, ``{den}`` and ``{bound}``."""
    figures = ratio_figures(paired_ratios(*paired_times(num, den)), bound)
    return {"name": name, "text": text.format(num=num["schedule"], den=den["schedule"],
                                              bound=f"{bound:g}"),
            "numerator": label(num), "denominator": label(den), **figures}


def best_goal(ours: List[dict], theirs: List[dict]) -> dict:
    """The fastest pipesplit row whose peak (exact bytes) is no more than the fastest Paddle
    row's on every rank, against GOAL_BEST_RATIO x that Paddle row; ``missed`` outright when
    none fits (no interval: peak bytes do not vary)."""
    base = fastest(theirs)
    fitting = [r for r in ours if all(a <= b for a, b in zip(r["peak_bytes"], base["peak_bytes"]))]
    text = (f"pipesplit best at no more peak <= {{bound}} x Paddle best ({base['schedule']}, "
            f"peak {mib_per_rank(base['peak_bytes'])})")
    if fitting:
        best = fastest(fitting)
        return ratio_goal("best", text + f": {best['schedule']} (peak "
                          f"{mib_per_rank(best['peak_bytes'])})", best, base, GOAL_BEST_RATIO)
    top = fastest(ours)
    return {"name": "best", "text": text.format(bound=f"{GOAL_BEST_RATIO:g}") +
            f": no pipesplit schedule fits (fastest {top['schedule']}, peak "
            f"{mib_per_rank(top['peak_bytes'])})", "numerator": None, "denominator": label(base),
            "ratio": None, "ratio_ci": None, "bound": GOAL_BEST_RATIO, "direction": "at_most",
            "verdict": "missed", "steps_to_resolve": None}


def pass_goal(passes: Sequence[Tuple[str, dict, dict]]) -> dict:
    """pipesplit's pass time <= Paddle's for every schedule both serve ((name, pipesplit's
    row, Paddle's row)), from the paired repeats of each engine's pass (``pass_ms_all``): met
    when every schedule's is; the figures are the worst schedule's (by median)."""
    parts = [(name, ratio_figures(paired_ratios(ours["pass_ms_all"], theirs["pass_ms_all"]),
                                  GOAL_PASS_RATIO), ours, theirs)
             for name, ours, theirs in passes]
    name, worst, ours, theirs = max(parts, key=lambda part: part[1]["ratio"])
    medians = ", ".join(f"{n} {statistics.median(a['pass_ms_all']):.1f} vs "
                        f"{statistics.median(b['pass_ms_all']):.1f} ms" for n, _, a, b in parts)
    return {"name": "pass", "text": f"pipesplit pass time <= {GOAL_PASS_RATIO:g} x Paddle's, "
            f"same schedule (repeats of each engine's pass, medians: {medians}; worst {name})",
            "numerator": label(ours), "denominator": label(theirs), **worst,
            "verdict": combine([figures["verdict"] for _, figures, _, _ in parts]),
            "steps_to_resolve": combined_steps([figures for _, figures, _, _ in parts])}


#: the peaks goal's words for bytes whose smallest the memory steps did not measure twice
_UNSETTLED = "bytes of memory steps whose smallest did not repeat"


def peaks_goal(passes: Sequence[Tuple[str, dict, dict]]) -> dict:
    """Issue 58: pipesplit's peak <= Paddle's own pass's on every rank, for every schedule
    both serve ((name, pipesplit's row, Paddle's row)): exact bytes, no interval; the text
    gives both rows' bytes per rank."""
    over = [name for name, ours, theirs in passes
            if any(a > b for a, b in zip(ours["peak_bytes"], theirs["peak_bytes"]))]
    exact = all(r.get("exact_peak", False) for _, a, b in passes for r in (a, b))
    figures = "; ".join(f"{name} {'/'.join(f'{b:,}' for b in ours['peak_bytes'])} vs "
                        f"{'/'.join(f'{b:,}' for b in theirs['peak_bytes'])}"
                        for name, ours, theirs in passes)
    name, ours, theirs = passes[0]
    return {"name": "peaks", "text": "pipesplit's peak <= Paddle's own pass's on every rank, "
            f"same schedule ({'exact bytes' if exact else _UNSETTLED} per rank, "
            f"pipesplit vs Paddle: {figures})"
            + (f": above on {', '.join(over)}" if over else ""),
            "numerator": label(ours), "denominator": label(theirs), "ratio": None,
            "ratio_ci": None, "bound": 1.0, "direction": "at_most",
            "verdict": "missed" if over else "met", "steps_to_resolve": None}


def mark_numerators(rows: List[dict], goal_list: List[dict]) -> None:
    """Each row's ``ratio_ci``: {goal name: [low, high]} of the goals it is the numerator of."""
    for row in rows:
        row["ratio_ci"] = {g["name"]: g["ratio_ci"] for g in goal_list
                           if g["m"] == row["m"] and g["numerator"] == label(row)
                           and g["ratio_ci"] is not None}


def goal_line(goal: dict) -> str:
    """``UNRESOLVED  m=4 1f1b: <text>: 1.012 [0.981, 1.043] over 12 steps, ...``, and for a
    verdict with an interval how many paired samples it first resolved at; for an unresolved
    one how far its median is from its bound (:func:`unresolved_note`)."""
    figures = f": {describe(goal)}" if goal["ratio_ci"] is not None else \
        f": {goal['ratio']:.3f}, bound {bound_text(goal['bound'], goal['direction'])}" \
        if goal["ratio"] is not None else ""
    if goal["ratio_ci"] is not None and goal["verdict"] != "unresolved" \
            and goal.get("resolved_at"):
        figures += f" (first resolved at {goal['resolved_at']})"
    if goal["ratio_ci"] is not None and goal["verdict"] == "unresolved":
        figures += f"; {unresolved_note(goal)}"
    return f"{goal['verdict'].upper():<10}  m={goal['m']} {goal['name']}: {goal['text']}{figures}"


def is_near(goal: dict) -> Optional[bool]:
    """Whether a goal's median lies within NEAR_BOUND of its bound
    (``verdicts.near_bound``): an unresolved goal that may stay so; None without an
    interval."""
    if goal.get("ratio_ci") is None or goal.get("ratio") is None:
        return None
    return near_bound(goal["ratio"], goal["bound"])


def unresolved_note(goal: dict) -> str:
    """``0.9% from its bound (within 3%: may stay unresolved)`` or ``8.9% from its bound
    (beyond 3%: the budget fell short)``."""
    off = f"{bound_distance(goal['ratio'], goal['bound']):.1%} from its bound"
    if is_near(goal):
        return f"{off} (within {NEAR_BOUND:.0%}: may stay unresolved)"
    return f"{off} (beyond {NEAR_BOUND:.0%}: the budget fell short)"


def mib_per_rank(values) -> str:
    """Bytes per rank as one cell in a fixed unit, MiB (``"32.19M/23.56M"``), so a column
    compares down its rows; a single size in words is ``job_list.text.format_bytes``."""
    return "/".join(f"{v / 2 ** 20:.2f}M" for v in values)


def table(head: Sequence[str], body: Sequence[Sequence[str]]) -> List[str]:
    """The lines of a report table: schedule and implementation left, the numbers right."""
    return text_table([head] + list(body), left=(0, 1)).split("\n")


def add_goals(report: dict) -> None:
    """The report's ``goals`` list (each with its ``resolved_at`` and ``near_bound``:
    :func:`is_near`), each numerator row's ``ratio_ci``, and the memory model's predictions
    beside the measured peaks (``memory_model``: exact figures, no interval)."""
    report["goals"] = goals(report["rows"])
    first = report.get("resolved_at", {})
    for goal in report["goals"]:
        goal["resolved_at"] = first.get(f"m={goal['m']} {goal['name']}")
        goal["near_bound"] = is_near(goal)
    mark_numerators(report["rows"], report["goals"])
    report["memory_model"] = predictions(report["rows"])


def base_row(rows: List[dict]) -> Optional[dict]:
    """Paddle's 1F1B among ``rows`` (one m), the table's "/ P1F1B"."""
    return next((r for r in rows if (r["schedule"], r["impl"]) == REFERENCE), None)


def format_report(report: dict) -> str:
    rows = report["rows"]
    lines = [f"{report['model']}; pp={report['pp']} m={','.join(map(str, report['m']))}, "
             f"2 processes x 1 thread; {report['warmup']} warm-up steps, "
             f"{report['memory_steps']} memory steps, then {report['steps']} paired steps "
             "asked of every engine", sampling_line(report),
             "peak MiB per rank (rank0/rank1) = resident (engine's allocated bytes after its "
             "first step) + a step's peak above its start (memory steps behind the executor's "
             "GC thread: exact bytes), Paddle's host allocator stats"]
    for m, group in by_m(rows):
        lines += ["", f"m = {m}:"] + rows_table(group)
    lines += ["", f"goals: the median of the paired per-step ratios (step i of one engine / "
              f"step i of the other) with its {DEFAULT_CONFIDENCE:.0%} bootstrap interval; "
              "met / missed when the interval is wholly on one side of the bound"]
    lines += [goal_line(g) for g in report["goals"]]
    if any(g["verdict"] == "missed" for g in report["goals"]):
        for m, group in by_m(rows):
            lines += explain(group, base_row(group), m)
    lines += memory_model_table(report.get("memory_model", []))
    lines += ["", "each schedule's own jobs in its last profiled step, Paddle's profiler (ms per rank, "
              "rank0/rank1; comm includes waiting for the peer):"]
    for m, group in by_m(rows):
        lines += [f"m = {m}:"] + job_times_table(group)
    return "\n".join(lines)


def sampling_line(report: dict) -> str:
    """How sampling ended: every goal resolved, or the budget spent (with what is left: how
    many of those lie within NEAR_BOUND of their bound, how many beyond, a shortfall of the
    budget), and the rounds it took."""
    counts = [len(r["step_ms_all"]) for r in report["rows"]]
    rounds = report.get("rounds", [])
    left = [g for g in report.get("goals", []) if g["verdict"] == "unresolved"]
    near = sum(bool(is_near(g)) for g in left)
    short = (f", {len(left) - near} beyond it: the budget fell short"
             if len(left) > near else "")
    stop = ("every goal resolved" if not left else
            f"budget of {report['budget_s']:g} s spent with {len(left)} goal(s) unresolved "
            f"({near} within {NEAR_BOUND:.0%} of their bound{short})")
    cut = "; ".join(report.get("cut", []))
    return (f"sampling: {len(rounds)} round(s) for unresolved goals, {min(counts)}-"
            f"{max(counts)} timed steps per engine, {report.get('sampling_s', 0):.0f} s in the "
            f"workers" + (f" (cut short: {cut})" if cut else "") + f"; stopped: {stop}")


def rows_table(rows: List[dict]) -> List[str]:
    """One m's table, its loss reference and what ``auto`` measured."""
    base = base_row(rows)
    head = ("schedule", "impl", "steps", "step ms", "IQR ms", "/ P1F1B", "peak MiB", "pass ms",
            "loss diff")
    body = [(r["schedule"], r["impl"], str(len(r["step_ms_all"])), f"{r['step_ms']:.1f}",
             f"{r['step_ms_spread']:.1f}",
             f"{r['step_ms'] / base['step_ms']:.3f}" if base else "-", mib_per_rank(r["peak_bytes"]),
             f"{r['pass_ms']:.1f}",
             "-" if r["max_loss_diff"] is None else f"{r['max_loss_diff']:.1e}") for r in rows]
    lines = table(head, body) + [f"loss diff against {rows[0]['loss_reference']}"]
    for r in rows:
        if r.get("replanned"):
            c = r["replanned"]["costs"]
            lines.append(f"{r['schedule']} measured in step {r['replanned']['step']} (ms per "
                         f"stage): F {c['forward']}, I {c['backward_b']}, W {c['backward_w']}, "
                         f"comm {c['comm']} ({c['comm_mode']})")
    return lines


#: the job kinds of the "job times" table (Paddle's own jobs carry their p2p inside)
_JOB_COLUMNS = (("F", ("forward",)), ("B", ("backward",)), ("I", ("backward_b",)),
                ("W", ("backward_w",)), ("comm", ("send_forward", "recv_forward",
                                                   "send_backward", "recv_backward")),
                ("opt", ("optimizer", "optimize")))


def job_summary(jobs: Sequence[Sequence]) -> dict:
    """One rank's profiled step: ms per job kind in all (``total``; the kind is the job type
    without its chunk number, so Paddle's own job names count too) and the median of each
    job type (``median``)."""
    total: Dict[str, float] = {}
    by_type: Dict[str, List[float]] = {}
    for job_type, _, ms in jobs:
        kind = job_type.rstrip("0123456789")
        total[kind] = total.get(kind, 0.0) + ms
        by_type.setdefault(job_type, []).append(ms)
    return {"total": total, "median": {t: statistics.median(v) for t, v in by_type.items()}}


def job_times_table(rows: List[dict]) -> List[str]:
    """Each schedule's own profiled step, per rank (rank0/rank1): ms in each job kind, in
    all jobs, and outside them (the executor between jobs, feeding, fetching)."""
    head = ("schedule", "impl", "step ms") + tuple(c for c, _ in _JOB_COLUMNS) + (
        "in jobs", "outside")
    body = []
    for r in rows:
        if not r.get("job_ms"):
            continue
        per_rank = [[sum(s["total"].get(k, 0.0) for k in kinds) for _, kinds in _JOB_COLUMNS]
                    for s in r["job_ms"]]
        columns = list(zip(*per_rank))
        in_jobs = [sum(s["total"].values()) for s in r["job_ms"]]
        body.append((r["schedule"], r["impl"], f"{r['profiled_step_ms']:.0f}",
                     *("/".join(f"{v:.0f}" for v in c) for c in columns),
                     "/".join(f"{v:.0f}" for v in in_jobs),
                     "/".join(f"{r['profiled_step_ms'] - v:.0f}" for v in in_jobs)))
    return table(head, body)


def explain(rows: List[dict], base: Optional[dict], m: int) -> List[str]:
    """What the misses come from: measured against simulated (unit costs) per row (one m)."""
    sim_base = next((r for r in rows if r["schedule"] == "1F1B"), None)  # either impl: same order
    head = ("schedule", "impl", "meas / P1F1B", "sim / 1F1B", "sim bubble", "sim peak units",
            "meas peak / P1F1B", "resident MiB", "transient MiB")
    body = [(r["schedule"], r["impl"], f"{r['step_ms'] / base['step_ms']:.3f}" if base else "-",
             f"{r['sim_makespan'] / sim_base['sim_makespan']:.3f}" if sim_base else "-",
             f"{r['sim_bubble']:.1%}", "/".join(f"{u:g}" for u in r["sim_peak_units"]),
             "/".join(f"{a / b:.2f}" for a, b in zip(r["peak_bytes"], base["peak_bytes"]))
             if base else "-", mib_per_rank(r["resident_bytes"]), mib_per_rank(r["transient_bytes"]))
            for r in rows]
    return ["", f"why, m = {m} (simulator: unit costs F 1, I 1, W 1, no comm; measured: this "
            "run):"] + \
        table(head, body)

"""The report of ``tools/bench/bench_engine.py``: loss differences, the issue's goals, the table and
the figures that explain a miss (simulated beside measured, and each schedule's own job times
read back from Paddle's profiler)."""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence

REFERENCE = ("1F1B", "paddle")
#: issue 21's goals
GOAL_1F1B_RATIO = 1.02     # pipesplit 1F1B step <= this x Paddle 1F1B step
GOAL_BEST_RATIO = 0.90     # pipesplit best <= this x Paddle best, at no more peak per rank
GOAL_AUTO_RATIO = 1.03     # auto <= this x the fastest row measured


def add_loss_diffs(rows: List[dict], reference: Optional[List[List[float]]]) -> None:
    """``max_loss_diff`` of every row against Paddle's 1F1B row, else ``reference``."""
    ref_row = next((r for r in rows if (r["schedule"], r["impl"]) == REFERENCE), None)
    ref = ref_row["losses"] if ref_row is not None else reference
    for row in rows:
        row["loss_reference"] = "paddle 1F1B" if ref_row is not None else "example reference"
        if row["losses"] is None or len(row["losses"]) != len(ref):
            row["max_loss_diff"] = None
            continue
        row["max_loss_diff"] = max(abs(a - b) for ours, theirs in zip(row["losses"], ref)
                                   for a, b in zip(ours, theirs))


def goals(rows: List[dict]) -> Dict[str, dict]:
    """Issue 21's goals, each ``{"met": bool or None, "text": ...}`` (None: a row missing)."""
    find = {(r["schedule"], r["impl"]): r for r in rows}
    out = {}
    ours, theirs = find.get(("1F1B", "pipesplit")), find.get(("1F1B", "paddle"))
    if ours and theirs:
        ratio = ours["step_ms"] / theirs["step_ms"]
        out["1f1b"] = {"met": ratio <= GOAL_1F1B_RATIO, "value": ratio,
                       "text": f"pipesplit 1F1B <= {GOAL_1F1B_RATIO:g} x Paddle 1F1B: "
                               f"{ours['step_ms']:.1f} / {theirs['step_ms']:.1f} ms = {ratio:.3f}"}
    out["best"] = best_goal(rows)
    auto = find.get(("auto", "pipesplit"))
    if auto:
        fastest = min(rows, key=lambda r: r["step_ms"])
        ratio = auto["step_ms"] / fastest["step_ms"]
        out["auto"] = {"met": ratio <= GOAL_AUTO_RATIO, "value": ratio,
                       "text": f"auto (measured step {(auto.get('replanned') or {}).get('step')}, "
                               f"re-planned) <= {GOAL_AUTO_RATIO:g} x the fastest row "
                               f"({fastest['schedule']} {fastest['impl']}): "
                               f"{auto['step_ms']:.1f} / {fastest['step_ms']:.1f} ms = "
                               f"{ratio:.3f}"}
    passes = [(name, row["pass_ms"], find[(name, "paddle")]["pass_ms"]) for (name, impl), row
              in find.items() if impl == "pipesplit" and (name, "paddle") in find]
    if passes:
        out["pass"] = {"met": all(a <= b for _, a, b in passes),
                       "text": "pipesplit pass time <= Paddle's, same schedule: " + ", ".join(
                           f"{n} {a:.1f} vs {b:.1f} ms" for n, a, b in passes)}
    return out


def best_goal(rows: List[dict]) -> dict:
    """The fastest pipesplit row whose peak is no more than the fastest Paddle row's on every
    rank, against GOAL_BEST_RATIO x that Paddle row."""
    paddle_rows = [r for r in rows if r["impl"] == "paddle"]
    ours = [r for r in rows if r["impl"] == "pipesplit"]
    if not paddle_rows or not ours:
        return {"met": None, "text": "pipesplit best vs Paddle best: needs both impls"}
    theirs = min(paddle_rows, key=lambda r: r["step_ms"])
    fitting = [r for r in ours
               if all(a <= b for a, b in zip(r["peak_bytes"], theirs["peak_bytes"]))]
    head = (f"pipesplit best <= {GOAL_BEST_RATIO:g} x Paddle best ({theirs['schedule']} "
            f"{theirs['step_ms']:.1f} ms, peak {fmt_bytes(theirs['peak_bytes'])})")
    if not fitting:
        fastest = min(ours, key=lambda r: r["step_ms"])
        return {"met": False, "text": f"{head} at no more peak: no pipesplit schedule fits "
                f"(fastest {fastest['schedule']} {fastest['step_ms']:.1f} ms, peak "
                f"{fmt_bytes(fastest['peak_bytes'])})"}
    best = min(fitting, key=lambda r: r["step_ms"])
    ratio = best["step_ms"] / theirs["step_ms"]
    return {"met": ratio <= GOAL_BEST_RATIO, "value": ratio,
            "text": f"{head} at no more peak: {best['schedule']} {best['step_ms']:.1f} ms "
                    f"(peak {fmt_bytes(best['peak_bytes'])}) = {ratio:.3f}"}


def fmt_bytes(values) -> str:
    return "/".join(f"{v / 2 ** 20:.2f}M" for v in values)


def table(head: Sequence[str], body: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(x[i]) for x in [head] + list(body)) for i in range(len(head))]
    lines = []
    for i, row in enumerate([head] + list(body)):
        lines.append("  ".join(x.ljust(w) if j < 2 else x.rjust(w)
                               for j, (x, w) in enumerate(zip(row, widths))).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def format_report(report: dict) -> str:
    rows = report["rows"]
    base = next((r for r in rows if (r["schedule"], r["impl"]) == REFERENCE), None)
    lines = [f"{report['model']}; pp={report['pp']} m={report['m']}, median of {report['steps']} "
             f"paired steps after {report['warmup']} warm-up, 2 processes x 1 thread",
             "peak MiB per rank (rank0/rank1) = resident (engine's allocated bytes after its "
             "first step) + transient step peak, Paddle's host allocator stats"]
    head = ("schedule", "impl", "step ms", "IQR ms", "/ P1F1B", "peak MiB", "pass ms",
            "loss diff")
    body = [(r["schedule"], r["impl"], f"{r['step_ms']:.1f}", f"{r['step_ms_spread']:.1f}",
             f"{r['step_ms'] / base['step_ms']:.3f}" if base else "-", fmt_bytes(r["peak_bytes"]),
             f"{r['pass_ms']:.1f}",
             "-" if r["max_loss_diff"] is None else f"{r['max_loss_diff']:.1e}") for r in rows]
    lines += table(head, body)
    lines.append(f"loss diff against {rows[0]['loss_reference']}")
    for r in rows:
        if r.get("replanned"):
            c = r["replanned"]["costs"]
            lines.append(f"{r['schedule']} measured in step {r['replanned']['step']} (ms per "
                         f"stage): F {c['forward']}, I {c['backward_b']}, W {c['backward_w']}, "
                         f"comm {c['comm']} ({c['comm_mode']})")
    results = report["goals"]
    for goal in results.values():
        mark = {True: "PASS", False: "MISS", None: "n/a"}[goal["met"]]
        lines.append(f"{mark}  {goal['text']}")
    if any(g["met"] is False for g in results.values()):
        lines += explain(rows, base)
    lines += ["", "each schedule's own jobs in one more step, Paddle's profiler (ms per rank, "
              "rank0/rank1; comm includes waiting for the peer):"] + job_times_table(rows)
    return "\n".join(lines)


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


def explain(rows: List[dict], base: Optional[dict]) -> List[str]:
    """What the misses come from: measured against simulated (unit costs) per row."""
    sim_base = next((r for r in rows if r["schedule"] == "1F1B"), None)  # either impl: same order
    head = ("schedule", "impl", "meas / P1F1B", "sim / 1F1B", "sim bubble", "sim peak units",
            "meas peak / P1F1B", "resident MiB", "transient MiB")
    body = [(r["schedule"], r["impl"], f"{r['step_ms'] / base['step_ms']:.3f}" if base else "-",
             f"{r['sim_makespan'] / sim_base['sim_makespan']:.3f}" if sim_base else "-",
             f"{r['sim_bubble']:.1%}", "/".join(f"{u:g}" for u in r["sim_peak_units"]),
             "/".join(f"{a / b:.2f}" for a, b in zip(r["peak_bytes"], base["peak_bytes"]))
             if base else "-", fmt_bytes(r["resident_bytes"]), fmt_bytes(r["transient_bytes"]))
            for r in rows]
    return ["", "why (simulator: unit costs F 1, I 1, W 1, no comm; measured: this run):"] + \
        table(head, body)

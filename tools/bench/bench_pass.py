"""Wall-clock benchmark of pipesplit's pass and of one training step through its plan.

    python -m pipesplit.tools.bench.bench_pass [--json PATH] [--quick] [--reps N]

(a) Pass time on the SAME program: a 32-layer MLP (4 chunks of 8 layers, chunk id = global
    virtual stage 0..3, Adam, hidden 16), single rank: pp_degree=1, vpp_degree=4,
    num_micro_batches=4, split_backward=False.  Repetitions alternate ours / Paddle's (who goes
    first alternates too); medians are compared.

    * ``ours``: ``apply_pipeline(main, startup, "VPP", attrs)`` on the RAW program, end to end:
      clone, role / chunk completion, schedule build + validate + comm lowering + simulated
      global order, gradient accumulation, split into sub-programs, skip-gc sets, ``core.Plan``.
    * ``paddle_vpp``: Paddle 3.3.1's own ``PipelineVirtualPipelinePass``
      (``paddle_pass_class("VPP")``) ``.apply`` on a clone that ``complete_program`` prepared
      beforehand (NOT timed: reported separately as ``paddle_prep_ms``).  Timed: its 17 program
      clones, op erasure, handoff variables, job list, skip-gc sets, ``core.Plan``.  Paddle's
      pass cannot run on the raw dense program: grad ops and the loss ``shadow_output`` carry no
      chunk id there ("Cannot infer chunk_id for op builtin.shadow_output"), and it needs
      ``op_role`` set on every op.  Paddle's pass adds no gradient accumulation.
    * a phase breakdown of ours (same steps as ``split_and_schedule``, timed one by one) and the
      time spent inside Paddle's op-creation call-stack recording (``traceback.extract_stack``,
      which Paddle's C++ op builders call for every op created from Python).

(b) Pass time per op (ours end to end, and Paddle's for reference) as the program grows from
    ~1k to ~8k ops (MLP, 4 chunks, Adam, more layers per chunk).

(c) One training step through the plan against the unsplit program on the same micro-batches:
    MLP hidden 512, batch 512, 4 chunks x 1 layer, SGD, m=4, schedule 1F1B with pp_degree=4
    (one process runs every job in the merged global order).

    * ``baseline`` (the ``step_ratio`` denominator): the unsplit main program run once per
      micro-batch with a plain ``Executor`` (m runs, i.e. the same matmul sizes without
      pipelining; it does m SGD updates where the plan does one, and no accumulation).
    * ``full_batch``: the unsplit main program once on the whole batch (reference).
    * ``ours``: ``PlanRunner.step`` on the full batch (the executor cuts it into micro-batches),
      with pipesplit's gradient accumulation.
    * ``ours_no_acc``: the same job order, sub-programs split without gradient accumulation
      (wrong gradients, timing only): isolates the accumulation cost.
    * ``paddle_vpp_plan``: Paddle's own VPP plan (pp=1, v=4) on the completed program (no
      accumulation, fewer comm jobs): executor reference.
    * overhead probe: the same configurations on a hidden-16 / batch-8 model, where compute is
      negligible, give the per-job executor overhead.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional

import numpy as np

from pipesplit.tools._console import (Progress, add_quiet_option, prepare_output, quiet_pipe_main,
                                      write_json)

#: what (a) and (c) aim for: ours / Paddle's pass time, and step time / the unsplit baseline
PASS_RATIO_TARGET = 0.5
STEP_RATIO_TARGET = 1.05
PASS_ATTRS = {"num_micro_batches": 4, "pp_degree": 1, "vpp_degree": 4, "split_backward": False}
NUM_CHUNKS = 4


def _median(xs):
    return float(statistics.median(xs)) if xs else float("nan")


def _ms(xs):
    return [round(x * 1e3, 3) for x in xs]


def _timed(fn: Callable) -> float:
    gc.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# --------------------------------------------------------------------------- passes
def _paddle_attrs(attrs: dict) -> dict:
    out = dict(attrs)
    out.setdefault("pp_stage", 0)
    out.setdefault("enable_send_recv_overlap", False)
    return out


def _prepare_for_paddle(main):
    """``main`` completed, its optimizer ops without a chunk, as Paddle's engine hands its VPP
    pass a program (Paddle 3.0.0's VPP split stops with ``KeyError: 'optimizer0'`` on an
    optimizer op that carries chunk c > 0; later releases ignore the chunk of one)."""
    from pipesplit.ir_utils import complete_program
    from pipesplit.ir_utils.roles import ROLE_OPTIMIZE
    prog = main.clone()
    complete_program(prog)
    for op in prog.global_block().ops:
        if op.op_role == ROLE_OPTIMIZE and op.has_attr("chunk_id"):
            op.set_int_attr("chunk_id", -1)
    return prog


def run_paddle_vpp(prepared, startup, attrs: dict):
    """Paddle's own VPP pass on a prepared (completed) program; returns its core.Plan."""
    from paddle.distributed.passes.pass_base import PassContext
    from pipesplit.passes import paddle_pass_class
    cls = paddle_pass_class("VPP")
    if cls is None:
        raise RuntimeError("Paddle's pipeline_scheduler_VPP pass class is not available")
    p = cls()
    for k, v in _paddle_attrs(attrs).items():
        p.set_attr(k, v)
    context = p.apply([prepared], [startup], PassContext())
    return context.get_attr("plan")


def run_ours(main, startup, attrs: dict, schedule: str = "VPP"):
    from pipesplit.passes import apply_pipeline
    return apply_pipeline(main, startup, schedule, attrs)


def ours_breakdown(main, attrs: dict, schedule: str = "VPP") -> Dict[str, float]:
    """Seconds per phase of ``split_and_schedule`` (the same calls, timed one by one; the input
    checks and ``split_backward``, a no-op here, are left out)."""
    from pipesplit.ir_utils import add_gradient_accumulation, complete_program, make_plan, \
        split_program, without_op_callstacks
    from pipesplit.job_list.lower import lower_comm
    from pipesplit.job_list.validate import validate
    from pipesplit.passes import PipelineConfig, emulated_job_order, make_schedule
    out = {}
    gc.collect()
    with without_op_callstacks():  # as split_sub_programs
        t0 = time.perf_counter()
        config = PipelineConfig.from_attrs(schedule, dict(attrs))
        sched = make_schedule(config)
        validate(lower_comm(sched, config.costs))
        t1 = time.perf_counter()
        work = main.clone()
        t2 = time.perf_counter()
        complete_program(work)
        t3 = time.perf_counter()
        spare = work.clone()  # for the accumulation alone, below (not timed)
        t3_split = time.perf_counter()
        split = split_program(work, config.num_stages, split_backward=config.splits_backward,
                              accumulate=config.grad_accumulation, completed=True,
                              num_micro_batches=config.num_micro_batches)
        t4 = time.perf_counter()
        order = emulated_job_order(sched, config.costs)
        t5 = time.perf_counter()
        make_plan(order, split.programs, config.num_micro_batches, split.required_vars)
        t6 = time.perf_counter()
        add_gradient_accumulation(spare, config.grad_accumulation, config.num_micro_batches)
        t7 = time.perf_counter()
    out["schedule_validate_lower"] = t1 - t0
    out["clone"] = t2 - t1
    out["complete_program"] = t3 - t2
    out["split_program"] = t4 - t3_split
    out["split_program.of_which.grad_accumulation"] = t7 - t6
    out["global_order"] = t5 - t4
    out["make_plan"] = t6 - t5
    out["total"] = (t6 - t0) - (t3_split - t3)
    return out


def callstack_cost(fn: Callable) -> Dict[str, float]:
    """Run ``fn`` once with ``traceback.extract_stack`` wrapped: calls and seconds inside it."""
    orig = traceback.extract_stack
    state = {"n": 0, "t": 0.0}

    def wrapped(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            state["n"] += 1
            state["t"] += time.perf_counter() - t

    traceback.extract_stack = wrapped
    try:
        total = _timed(fn)
    finally:
        traceback.extract_stack = orig
    return {"calls": state["n"], "seconds": state["t"], "total_seconds": total}


def bench_pass_time(reps: int, layers_per_stage: int = 8, optimizer: str = "adam") -> dict:
    from pipesplit.ir_utils import build_mlp
    model = build_mlp(NUM_CHUNKS, layers_per_stage=layers_per_stage, optimizer=optimizer)
    n_ops = len(model.main.global_block().ops)
    res = {"model": f"build_mlp({NUM_CHUNKS}, layers_per_stage={layers_per_stage}, hidden=16, "
                    f"optimizer={optimizer!r})",
           "layers": NUM_CHUNKS * layers_per_stage, "ops": n_ops, "attrs": dict(PASS_ATTRS),
           "reps": reps}
    # warm-up (imports, first-call costs) for both
    pp = run_ours(model.main, model.startup, PASS_ATTRS)
    res["ours_plan_jobs"] = len(pp.plan.job_list())
    res["ours_sub_programs"] = len(pp.split.programs)
    paddle_error = None
    try:
        plan = run_paddle_vpp(_prepare_for_paddle(model.main), model.startup, PASS_ATTRS)
        res["paddle_plan_jobs"] = len(plan.job_list())
        res["paddle_sub_programs"] = len(plan.job_types())
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        paddle_error = f"{type(e).__name__}: {e}"
    try:
        run_paddle_vpp(model.main.clone(), model.startup, PASS_ATTRS)
        res["paddle_on_raw_program"] = "ran"
    except Exception as e:  # noqa: BLE001 - reported in the result, not hidden
        res["paddle_on_raw_program"] = f"fails: {type(e).__name__}: {e}"
    ours, theirs, prep, breakdowns = [], [], [], []
    for i in range(reps):
        def do_ours():
            ours.append(_timed(lambda: run_ours(model.main, model.startup, PASS_ATTRS)))

        def do_paddle():
            t = time.perf_counter()
            prepared = _prepare_for_paddle(model.main)
            prep.append(time.perf_counter() - t)
            theirs.append(_timed(lambda: run_paddle_vpp(prepared, model.startup, PASS_ATTRS)))

        steps = [do_ours] if paddle_error is not None else [do_ours, do_paddle]
        for f in (steps if i % 2 == 0 else steps[::-1]):
            f()
        breakdowns.append(ours_breakdown(model.main, PASS_ATTRS))
    res["ours_samples_ms"] = _ms(ours)
    res["paddle_samples_ms"] = _ms(theirs)
    res["ours_ms"] = _median(ours) * 1e3
    res["paddle_vpp_ms"] = _median(theirs) * 1e3 if theirs else None
    res["paddle_prep_ms"] = _median(prep) * 1e3 if prep else None
    res["ratio"] = res["ours_ms"] / res["paddle_vpp_ms"] if theirs else None
    res["ratio_vs_paddle_plus_prep"] = (res["ours_ms"] / (res["paddle_vpp_ms"] + res["paddle_prep_ms"])
                                        if theirs else None)
    res["paddle_error"] = paddle_error
    res["ours_breakdown_ms"] = {k: _median([b[k] for b in breakdowns]) * 1e3
                                for k in breakdowns[0]}
    cs = callstack_cost(lambda: run_ours(model.main, model.startup, PASS_ATTRS))
    res["ours_callstack_recording"] = {"calls": cs["calls"], "ms": cs["seconds"] * 1e3,
                                       "run_ms": cs["total_seconds"] * 1e3}
    if paddle_error is None:
        prepared = _prepare_for_paddle(model.main)
        cs = callstack_cost(lambda: run_paddle_vpp(prepared, model.startup, PASS_ATTRS))
        res["paddle_callstack_recording"] = {"calls": cs["calls"], "ms": cs["seconds"] * 1e3,
                                             "run_ms": cs["total_seconds"] * 1e3}
    return res


def bench_per_op(sizes: List[int], reps: int, with_paddle: bool = True,
                 on_size: Callable[[str], None] = lambda _: None) -> dict:
    from pipesplit.ir_utils import build_mlp
    rows = []
    for lps in sizes:
        on_size(f"(b) pass time per op, {lps} layers per chunk")
        model = build_mlp(NUM_CHUNKS, layers_per_stage=lps, optimizer="adam")
        n = len(model.main.global_block().ops)
        ours, theirs = [], []
        for i in range(reps):
            o = lambda: ours.append(_timed(lambda: run_ours(model.main, model.startup, PASS_ATTRS)))

            def p():
                prepared = _prepare_for_paddle(model.main)
                theirs.append(_timed(lambda: run_paddle_vpp(prepared, model.startup, PASS_ATTRS)))

            for f in ((o, p) if i % 2 == 0 else (p, o)):
                if f is p and not with_paddle:
                    continue
                f()
        row = {"layers_per_stage": lps, "ops": n, "ours_ms": _median(ours) * 1e3,
               "ours_per_op_us": _median(ours) / n * 1e6, "ours_samples_ms": _ms(ours)}
        if theirs:
            row.update(paddle_ms=_median(theirs) * 1e3, paddle_per_op_us=_median(theirs) / n * 1e6,
                       paddle_samples_ms=_ms(theirs))
        rows.append(row)
        del model
    per_op = [r["ours_per_op_us"] for r in rows]
    out = {"rows": rows, "per_op_us": per_op,
           "per_op_max_over_min": max(per_op) / min(per_op) if per_op else None}
    if len(rows) >= 2:
        xs = [math.log(r["ops"]) for r in rows]
        ys = [math.log(r["ours_ms"]) for r in rows]
        out["ours_loglog_slope"] = float(np.polyfit(xs, ys, 1)[0])
        if all("paddle_ms" in r for r in rows):
            ys = [math.log(r["paddle_ms"]) for r in rows]
            out["paddle_loglog_slope"] = float(np.polyfit(xs, ys, 1)[0])
    return out


# --------------------------------------------------------------------------- step
def _step_fns(hidden: int, batch: int, m: int, layers_per_stage: int = 1) -> Dict[str, Callable]:
    import paddle
    from pipesplit.ir_utils import PlanRunner, build_mlp, init_scope, make_plan, split_program
    from pipesplit.ir_utils import complete_program
    model = build_mlp(NUM_CHUNKS, layers_per_stage=layers_per_stage, hidden=hidden,
                      batch_size=batch, optimizer="sgd", lr=1e-3)
    attrs = {"num_micro_batches": m, "pp_degree": NUM_CHUNKS}
    pp = run_ours(model.main, model.startup, attrs, schedule="1F1B")
    feed = model.make_batch(0)
    ours = PlanRunner(pp.plan, init_scope(model, pp.split))
    # same job order, no gradient accumulation (timing only)
    work = model.main.clone()
    complete_program(work)
    split_na = split_program(work, NUM_CHUNKS, accumulate=None)
    plan_na = make_plan(pp.job_order, split_na.programs, m)
    ours_na = PlanRunner(plan_na, init_scope(model, split_na))
    fns = {"ours": lambda: ours.step(feed), "ours_no_acc": lambda: ours_na.step(feed)}
    info = {"ours_jobs": len(pp.plan.job_list()),
            "ours_compute_jobs": sum(1 for t, _ in pp.job_order
                                     if t.startswith(("forward", "backward", "optimizer"))),
            "ops": len(model.main.global_block().ops)}
    try:
        pplan = run_paddle_vpp(_prepare_for_paddle(model.main), model.startup,
                               {"num_micro_batches": m, "pp_degree": 1, "vpp_degree": NUM_CHUNKS,
                                "split_backward": False})
        prun = PlanRunner(pplan, init_scope(model))
        fns["paddle_vpp_plan"] = lambda: prun.step(feed)
        info["paddle_jobs"] = len(pplan.job_list())
    except Exception as e:  # noqa: BLE001 - reported in the result, not hidden
        info["paddle_vpp_plan_error"] = f"{type(e).__name__}: {e}"
    exe = paddle.static.Executor(paddle.CPUPlace())
    bscope = init_scope(model)
    mb = batch // m
    parts = [{k: v[j * mb:(j + 1) * mb] for k, v in feed.items()} for j in range(m)]

    def baseline():
        with paddle.static.scope_guard(bscope):
            for part in parts:
                exe.run(model.main, feed=part, fetch_list=[model.main_loss])

    def full_batch():
        with paddle.static.scope_guard(bscope):
            exe.run(model.main, feed=feed, fetch_list=[model.main_loss])

    # the unsplit main program as m jobs (one per micro-batch) of a plan on the same
    # _StandaloneExecutor path as ours: same feed splitting, no Executor.run Python overhead
    base_plan = make_plan([("main", j) for j in range(m)], {"main": model.main.clone()}, m)
    base_runner = PlanRunner(base_plan, init_scope(model))
    fns = {"baseline": baseline, "baseline_plan": lambda: base_runner.step(feed),
           "full_batch": full_batch, **fns}
    return fns, info


def _time_side_by_side(fns: Dict[str, Callable], reps: int, warmup: int = 2) -> Dict[str, list]:
    for f in fns.values():
        for _ in range(warmup):
            f()
    names = list(fns)
    samples = {k: [] for k in names}
    for i in range(reps):
        order = names if i % 2 == 0 else list(reversed(names))
        for k in order:
            samples[k].append(_timed(fns[k]))
    return samples


def bench_step(reps: int, hidden: int, batch: int, m: int, probe_reps: int) -> dict:
    fns, info = _step_fns(hidden, batch, m)
    samples = _time_side_by_side(fns, reps)
    med = {k: _median(v) * 1e3 for k, v in samples.items()}
    res = {"model": f"build_mlp({NUM_CHUNKS}, layers_per_stage=1, hidden={hidden}, "
                    f"batch_size={batch}, optimizer='sgd')",
           "schedule": "1F1B", "pp_degree": NUM_CHUNKS, "num_micro_batches": m, "reps": reps,
           **info, "median_ms": med, "samples_ms": {k: _ms(v) for k, v in samples.items()}}
    res["step_ratio"] = med["ours"] / med["baseline"]
    res["ratios_vs_baseline"] = {k: v / med["baseline"] for k, v in med.items()}
    # per-step paired ratios (each rep's ours / the same rep's baseline): less sensitive to drift
    paired = [o / b for o, b in zip(samples["ours"], samples["baseline"])]
    res["step_ratio_paired_median"] = _median(paired)
    res["step_ratio_vs_baseline_plan"] = med["ours"] / med["baseline_plan"]
    res["step_ratio_vs_baseline_plan_paired_median"] = _median(
        [o / b for o, b in zip(samples["ours"], samples["baseline_plan"])])
    # overhead probe: same structure, negligible compute
    pfns, pinfo = _step_fns(16, 8, m)
    psamples = _time_side_by_side(pfns, probe_reps)
    pmed = {k: _median(v) * 1e3 for k, v in psamples.items()}
    probe = {"model": "hidden=16, batch=8 (compute negligible)", "median_ms": pmed,
             "ours_jobs": pinfo["ours_jobs"]}
    probe["baseline_per_run_us"] = pmed["baseline"] / m * 1e3
    probe["baseline_plan_per_job_us"] = pmed["baseline_plan"] / m * 1e3
    probe["ours_per_job_us"] = pmed["ours"] / pinfo["ours_jobs"] * 1e3
    probe["ours_per_compute_job_us"] = pmed["ours"] / pinfo["ours_compute_jobs"] * 1e3
    res["overhead_probe"] = probe
    extra = med["ours"] - med["baseline"]
    res["explained"] = {
        "ours_minus_baseline_ms": extra,
        "ours_minus_baseline_plan_ms": med["ours"] - med["baseline_plan"],
        "accumulation_ms(ours - ours_no_acc)": med["ours"] - med["ours_no_acc"],
        "executor_overhead_ms(probe ours - probe baseline)": pmed["ours"] - pmed["baseline"],
        "executor_overhead_ms(probe ours - probe baseline_plan)":
            pmed["ours"] - pmed["baseline_plan"],
    }
    return res


# --------------------------------------------------------------------------- report
def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def target_status(value: Optional[float], target: float) -> str:
    """``"target <= 0.5: met"`` or ``"target <= 0.5: MISSED"`` for a ratio and its target."""
    if value is None or not math.isfinite(value):
        return f"target <= {target:g}: not measured"
    return f"target <= {target:g}: {'met' if value <= target else 'MISSED'}"


def targets(r: dict) -> dict:
    """Each target with its value and whether this run met it."""
    out = {}
    for key, value, target in (("pass_ratio", r["pass_time"]["ratio"], PASS_RATIO_TARGET),
                               ("step_ratio", r["step"]["step_ratio"], STEP_RATIO_TARGET)):
        out[key] = {"value": value, "target": target,
                    "met": value is not None and math.isfinite(value) and value <= target}
    return out


def print_report(r: dict) -> None:
    a = r["pass_time"]
    print(f"== (a) pass time: {a['model']}, {a['ops']} ops, attrs {a['attrs']}, "
          f"{a['reps']} alternating reps (median)")
    print(f"  {'measurement':58s} {'median ms':>10s}")
    print(f"  {'ours: apply_pipeline on the raw program (end to end)':58s} {a['ours_ms']:10.1f}")
    print(f"  {'paddle VPP pass .apply on a completed clone':58s} {_fmt(a['paddle_vpp_ms']):>10s}")
    print(f"  {'  (untimed prep: clone + complete_program)':58s} {_fmt(a['paddle_prep_ms']):>10s}")
    print(f"  ratio ours / paddle = {_fmt(a['ratio'], '.2f')}, "
          f"{target_status(a['ratio'], PASS_RATIO_TARGET)}   "
          f"(vs paddle + prep: {_fmt(a['ratio_vs_paddle_plus_prep'], '.2f')})")
    print(f"  paddle pass on the raw (uncompleted) program: {a['paddle_on_raw_program']}")
    if a.get("paddle_error"):
        print(f"  paddle pass error: {a['paddle_error']}")
    print(f"  plan jobs: ours {a['ours_plan_jobs']} ({a['ours_sub_programs']} sub-programs), "
          f"paddle {a.get('paddle_plan_jobs', '-')} ({a.get('paddle_sub_programs', '-')})")
    print("  ours, phase breakdown (median ms):")
    for k, v in a["ours_breakdown_ms"].items():
        print(f"    {k:45s} {v:8.1f}")
    cs = a["ours_callstack_recording"]
    print(f"  Paddle op-creation call-stack recording inside ours: {cs['calls']} calls, "
          f"{cs['ms']:.1f} ms of a {cs['run_ms']:.1f} ms run")
    if "paddle_callstack_recording" in a:
        cs = a["paddle_callstack_recording"]
        print(f"  ... inside paddle's pass: {cs['calls']} calls, {cs['ms']:.1f} ms of "
              f"{cs['run_ms']:.1f} ms")
    b = r["per_op"]
    print("== (b) pass time per op (MLP, 4 chunks, Adam), median")
    print(f"  {'layers/chunk':>12s} {'ops':>6s} {'ours ms':>9s} {'us/op':>7s} "
          f"{'paddle ms':>10s} {'us/op':>7s}")
    for row in b["rows"]:
        print(f"  {row['layers_per_stage']:12d} {row['ops']:6d} {row['ours_ms']:9.1f} "
              f"{row['ours_per_op_us']:7.1f} {_fmt(row.get('paddle_ms')):>10s} "
              f"{_fmt(row.get('paddle_per_op_us')):>7s}")
    print(f"  ours per-op max/min {_fmt(b['per_op_max_over_min'], '.2f')}, log-log slope "
          f"{_fmt(b.get('ours_loglog_slope'), '.2f')} (1.0 = linear); paddle slope "
          f"{_fmt(b.get('paddle_loglog_slope'), '.2f')}")
    c = r["step"]
    print(f"== (c) one training step: {c['model']}, {c['schedule']} pp={c['pp_degree']} "
          f"m={c['num_micro_batches']}, {c['reps']} alternating reps")
    print(f"  {'run':18s} {'median ms':>10s} {'/ baseline':>10s}")
    for k, v in c["median_ms"].items():
        print(f"  {k:18s} {v:10.1f} {c['ratios_vs_baseline'][k]:10.3f}")
    print(f"  step_ratio (ours / baseline) = {c['step_ratio']:.3f}, "
          f"{target_status(c['step_ratio'], STEP_RATIO_TARGET)} (paired median "
          f"{c['step_ratio_paired_median']:.3f})\n"
          f"  vs baseline_plan = {c['step_ratio_vs_baseline_plan']:.3f} (paired median "
          f"{c['step_ratio_vs_baseline_plan_paired_median']:.3f}); jobs: ours {c['ours_jobs']} "
          f"({c['ours_compute_jobs']} compute), paddle {c.get('paddle_jobs', '-')}")
    p = c["overhead_probe"]
    print(f"  overhead probe ({p['model']}): " + ", ".join(
        f"{k} {v:.2f} ms" for k, v in p["median_ms"].items()))
    print(f"    baseline {p['baseline_per_run_us']:.0f} us per Executor.run, baseline_plan "
          f"{p['baseline_plan_per_job_us']:.0f} us per job; ours "
          f"{p['ours_per_job_us']:.0f} us per job ({p['ours_per_compute_job_us']:.0f} us per "
          f"compute job)")
    for k, v in c["explained"].items():
        print(f"    {k:52s} {v:8.2f} ms")
    missed = [k for k, t in r["targets"].items() if not t["met"]]
    print("targets: " + ("all met" if not missed else
                         "MISSED " + ", ".join(f"{k} {r['targets'][k]['value']:.3f} > "
                                               f"{r['targets'][k]['target']:g}" for k in missed)))


def run(quick: bool = False, reps: Optional[int] = None, progress=None) -> dict:
    """Every measurement; ``progress`` (a :class:`~pipesplit.tools._console.Progress`) hears of
    each phase."""
    say = progress.step if progress is not None else (lambda _: None)
    os.environ.setdefault("GLOG_minloglevel", "2")
    import warnings
    warnings.filterwarnings("ignore")
    import paddle
    paddle.enable_static()
    if quick:
        pass_reps, sizes, size_reps, step_reps, probe_reps = reps or 3, [2, 4], 1, reps or 3, 3
        step_cfg = dict(hidden=64, batch=64, m=4)
        lps = 2
    else:
        pass_reps, sizes, size_reps, step_reps, probe_reps = reps or 7, [10, 20, 40, 80], 3, \
            reps or 21, 10
        step_cfg = dict(hidden=512, batch=512, m=4)
        lps = 8
    t0 = time.perf_counter()
    result = {"quick": quick, "paddle_version": paddle.__version__, "cpu_count": os.cpu_count()}
    if progress is not None:
        progress.total = 2 + len(sizes)
    say(f"(a) pass time, ours vs Paddle's VPP pass, {pass_reps} reps")
    result["pass_time"] = bench_pass_time(pass_reps, layers_per_stage=lps)
    result["per_op"] = bench_per_op(sizes, size_reps, with_paddle=True, on_size=say)
    say(f"(c) one training step vs the unsplit program, {step_reps} reps")
    result["step"] = bench_step(step_reps, probe_reps=probe_reps, **step_cfg)
    result["ours_ms"] = result["pass_time"]["ours_ms"]
    result["paddle_vpp_ms"] = result["pass_time"]["paddle_vpp_ms"]
    result["ratio"] = result["pass_time"]["ratio"]
    result["per_op_us"] = result["per_op"]["per_op_us"]
    result["step_ratio"] = result["step"]["step_ratio"]
    result["targets"] = targets(result)
    result["wall_s"] = time.perf_counter() - t0
    return result


@quiet_pipe_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="small sizes, few reps (smoke test)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions for (a) and (c)")
    add_quiet_option(ap)
    args = ap.parse_args(argv)
    try:
        prepare_output(args.json, "--json")
    except ValueError as exc:
        print(f"bench_pass: error: {exc}", file=sys.stderr)
        return 2
    result = run(args.quick, args.reps, Progress("bench_pass", quiet=args.quiet))
    print_report(result)
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Share of backward work that ``split_backward`` moves into W (backward_w), by FLOPs and by time.

    python -m pipesplit.tools.bench.report_w_share [--json PATH] [--reps N] [--hidden 128]
                                             [--seq-len 64] [--batch 16] [-m 4]

Model: ``build_gpt(4 stages, 1 layer per stage, hidden 128, 4 heads, vocab 256, seq_len 64)``.

FLOPs: ``split_backward`` on a completed clone (``batch_size`` = the micro-batch size for ``-1``
dims); matmul-type ops only (see ``split_backward.op_flops``).

Time: ``apply_pipeline(..., "FThenB", pp_degree=4, split_backward=True)`` gives the sub-programs
(forward{c}, backward_b{c}, backward_w{c}, optimizer, with gradient accumulation).  Two
independent measurements, each the median over ``--reps`` round-robin repetitions of one step
of a plan made with ``make_plan`` from those sub-programs:

* removal:  W time = T(all jobs) - T(same order without any backward_w job); backward time =
  T(all jobs) - T(forward + optimizer jobs only).  Per chunk: T(all) - T(all but backward_w{c}).
* prefixes: jobs grouped by type (every micro-batch of a type together) in the order
  forward0..3, backward_b3, backward_w3, backward_b2, ... , optimizer; a type's time is
  T(prefix up to it) - T(prefix before it).  Gives B and W time per chunk.

Both include the executor's per-job overhead (about 0.1-0.15 ms per job on this CPU).  Shares
are printed from the per-plan medians and, as a load-noise check, from the per-plan minima.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings
from typing import Dict, List, Tuple

from pipesplit.job_list.ir import BACKWARD_B, BACKWARD_W, FORWARD, OPTIMIZER, job_type
from pipesplit.tools._console import write_json


def _median(xs):
    return float(statistics.median(xs))


def _time_plans(runners: Dict[str, Tuple[object, dict]], reps: int, warmup: int = 1
                ) -> Dict[str, list]:
    """Seconds of one step per named runner and repetition, round-robin (alternating)."""
    for r, feed in runners.values():
        for _ in range(warmup):
            r.step(feed)
    names = list(runners)
    samples = {k: [] for k in names}
    for i in range(reps):
        for k in (names if i % 2 == 0 else names[::-1]):
            r, feed = runners[k]
            gc.collect()
            t = time.perf_counter()
            r.step(feed)
            samples[k].append(time.perf_counter() - t)
    return samples


def run(reps: int = 9, hidden: int = 128, seq_len: int = 64, batch: int = 16, m: int = 4,
        stages: int = 4) -> dict:
    os.environ.setdefault("GLOG_minloglevel", "2")
    warnings.filterwarnings("ignore")
    import paddle
    paddle.enable_static()
    from pipesplit.ir_utils import PlanRunner, build_gpt, complete_program, init_scope, make_plan
    from pipesplit.ir_utils.split_backward import split_backward
    from pipesplit.passes import apply_pipeline

    model = build_gpt(stages, layers_per_stage=1, hidden=hidden, heads=4, vocab=256,
                      seq_len=seq_len, batch_size=batch, optimizer="sgd", lr=1e-3)
    mb = batch // m
    work = model.main.clone()
    complete_program(work)
    rep = split_backward(work, batch_size=mb)
    chunks = sorted(set(rep.b_flops) | set(rep.w_flops))
    out = {"model": f"build_gpt({stages}, hidden={hidden}, heads=4, vocab=256, seq_len={seq_len}, "
                    f"batch_size={batch})", "num_micro_batches": m, "reps": reps,
           "decomposed": rep.decomposed,
           "flops": {"w_share": rep.w_flops_share,
                     "per_chunk": {c: {"b_flops": rep.b_flops.get(c, 0),
                                       "w_flops": rep.w_flops.get(c, 0),
                                       "w_share": rep.w_flops_share_of_chunk(c),
                                       "b_ops": rep.b_ops.get(c, 0), "w_ops": rep.w_ops.get(c, 0)}
                                   for c in chunks}}}

    pp = apply_pipeline(model.main, model.startup, "FThenB",
                        {"num_micro_batches": m, "pp_degree": stages, "split_backward": True})
    progs = pp.split.programs
    feed = model.make_batch(0)

    def runner(order):
        plan = make_plan(order, progs, m)
        return PlanRunner(plan, init_scope(model, pp.split)), feed

    mbs = range(m)
    fwd = [(job_type(FORWARD, c), j) for j in mbs for c in range(stages)]
    opt = [(OPTIMIZER, 0)]

    def bwd(skip_w=()):
        order = []
        for j in mbs:
            for c in reversed(range(stages)):
                order.append((job_type(BACKWARD_B, c), j))
                if c not in skip_w:
                    order.append((job_type(BACKWARD_W, c), j))
        return order

    all_chunks = tuple(range(stages))
    plans = {"all": fwd + bwd() + opt, "no_w": fwd + bwd(all_chunks) + opt, "fwd_only": fwd + opt}
    for c in range(stages):
        plans[f"no_w{c}"] = fwd + bwd((c,)) + opt
    # prefixes by job type
    types = [job_type(FORWARD, c) for c in range(stages)]
    for c in reversed(range(stages)):
        types += [job_type(BACKWARD_B, c), job_type(BACKWARD_W, c)]
    prefixes = {}
    for k in range(len(types) + 1):
        order = [(t, j) for t in types[:k] for j in mbs] + opt
        prefixes[f"prefix{k}"] = order
    runners = {name: runner(order) for name, order in {**plans, **prefixes}.items()}
    samples = _time_plans(runners, reps)
    out["time"] = {"median": _shares({k: _median(v) * 1e3 for k, v in samples.items()}, stages,
                                     types),
                   "min": _shares({k: min(v) * 1e3 for k, v in samples.items()}, stages, types),
                   "jobs_per_type": m,
                   "samples_ms": {k: [x * 1e3 for x in v] for k, v in samples.items()}}
    return out


def _shares(ms: Dict[str, float], stages: int, types: List[str]) -> dict:
    t_all, t_now, t_fwd = ms["all"], ms["no_w"], ms["fwd_only"]
    removal = {"all_ms": t_all, "no_w_ms": t_now, "fwd_only_ms": t_fwd,
               "w_ms": t_all - t_now, "backward_ms": t_all - t_fwd,
               "w_share": (t_all - t_now) / (t_all - t_fwd) if t_all > t_fwd else float("nan"),
               "w_ms_per_chunk": {c: t_all - ms[f"no_w{c}"] for c in range(stages)}}
    per_type = {types[k - 1]: ms[f"prefix{k}"] - ms[f"prefix{k - 1}"]
                for k in range(1, len(types) + 1)}
    prefix = {"optimizer_only_ms": ms["prefix0"], "per_type_ms": per_type, "per_chunk": {}}
    tb = tw = 0.0
    for c in range(stages):
        b, w = per_type[job_type(BACKWARD_B, c)], per_type[job_type(BACKWARD_W, c)]
        tb, tw = tb + b, tw + w
        prefix["per_chunk"][c] = {"b_ms": b, "w_ms": w,
                                  "w_share": w / (b + w) if b + w > 0 else float("nan")}
    prefix["w_share"] = tw / (tb + tw) if tb + tw > 0 else float("nan")
    return {"removal": removal, "prefix": prefix, "ms": ms}


def print_report(r: dict) -> None:
    print(f"W share of backward: {r['model']}, m={r['num_micro_batches']}, {r['reps']} reps")
    print(f"decomposed by split_backward: {r['decomposed'] or 'nothing'}")
    f, t = r["flops"], r["time"]
    pre, rem = t["median"]["prefix"], t["median"]["removal"]
    print(f"{'chunk':>5s} {'B MFLOP':>9s} {'W MFLOP':>9s} {'W share':>8s} | {'B ms':>7s} "
          f"{'W ms':>7s} {'W share':>8s} | {'W ms (removal)':>14s}")
    for c, row in f["per_chunk"].items():
        p = pre["per_chunk"][c]
        print(f"{c:>5} {row['b_flops'] / 1e6:9.2f} {row['w_flops'] / 1e6:9.2f} "
              f"{row['w_share']:8.1%} | {p['b_ms']:7.2f} {p['w_ms']:7.2f} {p['w_share']:8.1%} | "
              f"{rem['w_ms_per_chunk'][c]:14.2f}")
    tb = sum(p["b_ms"] for p in pre["per_chunk"].values())
    tw = sum(p["w_ms"] for p in pre["per_chunk"].values())
    bf = sum(row["b_flops"] for row in f["per_chunk"].values())
    wf = sum(row["w_flops"] for row in f["per_chunk"].values())
    print(f"{'all':>5s} {bf / 1e6:9.2f} {wf / 1e6:9.2f} {f['w_share']:8.1%} | {tb:7.2f} "
          f"{tw:7.2f} {pre['w_share']:8.1%} | {rem['w_ms']:14.2f}")
    print("(FLOPs: matmul-type ops of one micro-batch; ms: per step, all "
          f"{r['num_micro_batches']} micro-batches, prefix-difference method, each type = "
          f"{t['jobs_per_type']} jobs incl. executor overhead)")
    print(f"removal method: step {rem['all_ms']:.2f} ms, without W {rem['no_w_ms']:.2f} ms, "
          f"forward+optimizer only {rem['fwd_only_ms']:.2f} ms -> W {rem['w_ms']:.2f} ms of "
          f"backward {rem['backward_ms']:.2f} ms = {rem['w_share']:.1%}")
    fw = sum(v for k, v in pre["per_type_ms"].items() if k.startswith("forward"))
    print(f"prefix method: forward {fw:.2f} ms, B {tb:.2f} ms, W {tw:.2f} ms, optimizer-only "
          f"plan {pre['optimizer_only_ms']:.2f} ms")
    odd = [c for c, p in pre["per_chunk"].items() if not 0 <= p["w_share"] <= 1]
    if odd:
        print(f"(chunk(s) {', '.join(map(str, odd))}: a time share outside 0-100% is not an "
              f"error: each B / W time is the difference of two measured step times, so it "
              f"carries their noise and the executor's per-job overhead; a chunk with almost "
              f"no B work (chunk 0: the embedding has no input gradient, FLOPs are all W) can "
              f"get a B time below zero and so a W share above 100%, and its neighbour the "
              f"opposite.  The all-chunk share and the FLOPs columns are the reliable figures.)")
    mn = t["min"]
    print(f"same from the fastest rep of each plan (less load noise): W share prefix "
          f"{mn['prefix']['w_share']:.1%}, removal {mn['removal']['w_share']:.1%}; per chunk "
          + ", ".join(f"{c}: {p['w_share']:.0%}" for c, p in mn["prefix"]["per_chunk"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("-m", type=int, default=4)
    args = ap.parse_args(argv)
    r = run(args.reps, args.hidden, args.seq_len, args.batch, args.m)
    print_report(r)
    if args.json:
        write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

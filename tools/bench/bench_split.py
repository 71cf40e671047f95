"""What the B / W split costs per stage in Paddle's executor, and where the extra time goes.

    python -m pipesplit.tools.bench.bench_split [--hidden 512] [--layers-per-stage 2] [--pp 2]
        [--micro-batch-size 8] [--seq-len 64] [--repeats 7] [--json PATH]

On a GPT (``build_gpt``; hidden >= 512 makes it compute-bound on CPU) split into ``pp`` stages,
:func:`pipesplit.passes.measure.profile.profile_jobs` times each job type in the standalone executor
(medians of interleaved runs, see its doc).  Per stage it prints tB (the unsplit backward),
tI (backward_b), tW (backward_w), (tI + tW) / tB, and splits the gap tI + tW - tB into

* **per-job overhead**: the split runs one more job per micro-batch; what one job costs
  without work is the time of an empty job (the one-process send / recv sub-programs are
  empty programs: their median time is the executor's cost of a job), and
* **extra kernels / copies**: the rest, what the split's own ops cost beyond B's (the
  decomposed matmul grads, the values handed from I to W); the op counts of B and of I + W
  are printed beside it.

The times are noisy on a shared machine: each figure is a median over ``repeats`` interleaved
runs; read the ratios, not the milliseconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def measure(hidden: int = 512, layers_per_stage: int = 2, pp: int = 2, m: int = 4,
            micro_batch_size: int = 8, seq_len: int = 64, repeats: int = 7) -> dict:
    os.environ.setdefault("GLOG_minloglevel", "2")
    import paddle
    paddle.enable_static()
    from pipesplit.ir_utils import build_gpt
    from pipesplit.job_list.ir import BACKWARD, BACKWARD_B, BACKWARD_W, COMM_KINDS, job_type
    from pipesplit.passes.measure.profile import profile_jobs, split_programs

    model = build_gpt(pp, layers_per_stage=layers_per_stage, hidden=hidden, heads=max(1, hidden // 64),
                      seq_len=seq_len, batch_size=m * micro_batch_size, optimizer="adam", lr=1e-3)
    profile = profile_jobs(model, pp, 1, m, repeats=repeats)
    t = profile.times
    empty = statistics.median(t[k][s] for k in COMM_KINDS for s in range(pp))
    split = split_programs(model, pp, 1, m, True).programs
    whole = split_programs(model, pp, 1, m, False).programs

    def ops(programs, program_type):
        return len(programs[program_type].global_block().ops)

    rows = []
    for s in range(pp):
        tb, ti, tw = t["backward"][s], t["backward_b"][s], t["backward_w"][s]
        gap = ti + tw - tb
        rows.append({
            "stage": s, "forward_ms": t["forward"][s], "backward_ms": tb, "backward_b_ms": ti,
            "backward_w_ms": tw, "ratio": (ti + tw) / tb if tb > 0 else None, "gap_ms": gap,
            "job_overhead_ms": empty, "extra_work_ms": gap - empty,
            "ops_b": ops(whole, job_type(BACKWARD, s)),
            "ops_i_w": ops(split, job_type(BACKWARD_B, s)) + ops(split, job_type(BACKWARD_W, s)),
        })
    return {"model": f"build_gpt({pp}, layers_per_stage={layers_per_stage}, hidden={hidden}, "
                     f"seq_len={seq_len}, micro_batch_size={micro_batch_size}, adam)",
            "m": m, "repeats": repeats, "empty_job_ms": empty, "rows": rows}


def print_report(result: dict, out=sys.stdout) -> None:
    print(f"{result['model']}, m={result['m']}, medians of {result['repeats']} runs; "
          f"empty job {result['empty_job_ms']:.4f} ms", file=out)
    print(f"{'stage':>5} {'tB ms':>8} {'tI ms':>8} {'tW ms':>8} {'(tI+tW)/tB':>10} {'gap ms':>8} "
          f"{'job ovh':>8} {'extra':>8} {'ops B':>6} {'ops I+W':>7}", file=out)
    for r in result["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"{r['stage']:5d} {r['backward_ms']:8.3f} {r['backward_b_ms']:8.3f} "
              f"{r['backward_w_ms']:8.3f} {ratio:>10} {r['gap_ms']:8.3f} "
              f"{r['job_overhead_ms']:8.4f} {r['extra_work_ms']:8.3f} {r['ops_b']:6d} "
              f"{r['ops_i_w']:7d}", file=out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers-per-stage", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("-m", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    result = measure(args.hidden, args.layers_per_stage, args.pp, args.m, args.micro_batch_size,
                     args.seq_len, args.repeats)
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

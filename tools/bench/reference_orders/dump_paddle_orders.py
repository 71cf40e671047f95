"""Dump Paddle 3.3.1's pipeline-scheduler job lists as compute-only CSV files (PyTorch format).

Run with the Python that has paddlepaddle (no GPU, no program needed)::

    python tools/bench/reference_orders/dump_paddle_orders.py [OUT_DIR]

For every rank, the pass class of ``paddle.distributed.passes.pipeline_scheduler_pass`` is
instantiated, its attributes set (``num_micro_batches``, ``pp_degree``, ``pp_stage``,
``vpp_degree``, ``split_backward``) and ``_create_job_list()`` called -- the same call Paddle's
pass makes before it splits the program.  Job types map to short-form cells: ``forward[k]`` ->
F, ``backward[k]`` -> B, ``backward_b[k]`` -> I, ``backward_w[k]`` -> W of chunk k (no suffix =
chunk 0); send / recv / optimizer jobs are dropped.  VPP uses the looped placement (chunk k of
rank r = stage k*pp + r), ZBVPP the V placement.

ZBVPP: ``PipelineZeroBubbleVirtualPipelinePass._create_job_list`` calls ``self._get_max_memory()``,
which Paddle 3.3.1 does not define (AttributeError); it also asserts m == pp.  Its schedule comes
from ``VScheduleCreator``, so for m == pp we drive ``VScheduleCreator`` exactly as the pass does
(the same 8 fill-option combinations, keeping the one with the earliest end), with the cost model's
times as ``program_runtimes``, memory deltas forward +1 / backward_b -1/2 / backward_w -1/2 and no
memory cap (``max_memory=None``, VScheduleCreator's default).  It is cost-dependent, so one file per
cost model: ``ZBVPP_<cost>_pp.._v.._m...csv``.  Refusals are listed in ``paddle/SKIPPED.txt``.
"""
import csv
import os
import re
import sys

import paddle

paddle.enable_static()
from paddle.distributed.passes.pipeline_scheduler_pass import (  # noqa: E402
    pipeline_1f1b, pipeline_eager_1f1b, pipeline_fthenb, pipeline_vpp, pipeline_zero_bubble)

GRID_PP = (2, 4, 8)
GRID_VPP = (1, 2, 4)
#: (tag, tF, tI, tW, comm) -- the cost models of tools/bench/bench_frameworks.py
COST_MODELS = (("1-2-1-1", 1.0, 1.0, 1.0, 0.0), ("1-1-.5-.5", 1.0, 0.5, 0.5, 0.0),
               ("1-2-1-1-c.1", 1.0, 1.0, 1.0, 0.1))

PASSES = {  # name -> (class, extra attrs, vpp values it takes)
    "FThenB": (pipeline_fthenb.PipelineFThenBPass, {}, (1,)),
    "1F1B": (pipeline_1f1b.Pipeline1F1BPass, {}, (1,)),
    "Eager1F1B": (pipeline_eager_1f1b.PipelineEager1F1BPass, {}, (1,)),
    "VPP": (pipeline_vpp.PipelineVirtualPipelinePass, {}, GRID_VPP),
    "VPP-split": (pipeline_vpp.PipelineVirtualPipelinePass, {"split_backward": True}, GRID_VPP),
    "ZBH1": (pipeline_zero_bubble.PipelineZeroBubblePipelinePass, {}, (1,)),
}
_TYPE = re.compile(r"^(forward|backward_b|backward_w|backward)(\d*)$")
_OP = {"forward": "F", "backward": "B", "backward_b": "I", "backward_w": "W"}


def grid_ms(pp):
    return sorted({pp, pp + 1, 2 * pp, 2 * pp + 2, 4 * pp})


def stage_of(rank, chunk, pp, v_shape):
    if v_shape and chunk % 2 == 1:
        return chunk * pp + pp - 1 - rank
    return chunk * pp + rank


def cells(jobs, rank, pp, v_shape):
    row = []
    for job_type, mb in jobs:
        match = _TYPE.match(job_type)
        if not match:
            continue  # recv_forward / send_backward / optimizer
        chunk = int(match.group(2) or 0)
        row.append(f"{stage_of(rank, chunk, pp, v_shape)}{_OP[match.group(1)]}{mb}")
    return row


def pass_rows(cls, extra, pp, vpp, m):
    rows = []
    for rank in range(pp):
        p = cls()
        for key, value in dict(num_micro_batches=m, pp_degree=pp, pp_stage=rank,
                               vpp_degree=vpp, **extra).items():
            p.set_attr(key, value)
        jobs = [(j.type(), j.micro_batch_id()) for j in p._create_job_list()]
        rows.append(cells(jobs, rank, pp, False))
    return rows


def zbvpp_rows(pp, vpp, m, t_f, t_i, t_w, comm):
    """What PipelineZeroBubbleVirtualPipelinePass._create_job_list computes, minus the missing
    _get_max_memory (no cap)."""
    if m % pp or m > pp:
        raise AssertionError("ZBVPP asserts num_micro_batches % pp_degree == 0 and <= pp_degree")
    usage = {}
    for c in range(vpp):
        usage.update({f"forward{c}": 1.0, f"backward_b{c}": -0.5, f"backward_w{c}": -0.5})
    peak = {k: max(0.0, v) for k, v in usage.items()}
    runtime = {"forward": t_f, "backward_b": t_i, "backward_w": t_w, "loss": 0.0,
               "communication": comm}
    creator = pipeline_zero_bubble.VScheduleCreator(pp, m, vpp, [dict(usage) for _ in range(pp)],
                                                    [dict(peak) for _ in range(pp)], [0.0] * pp,
                                                    runtime, None)
    schedule, end_time = None, None
    for fill_w_before_b in (True, False):
        for fill_w_before_f in (True, False):
            for fill_loss_stage in (True, False):
                new, new_end, _ = creator.create_v_schedule(fill_w_before_b=fill_w_before_b,
                                                            fill_w_before_f=fill_w_before_f,
                                                            fill_loss_stage=fill_loss_stage)
                if schedule is None or max(new_end) < max(end_time):
                    schedule, end_time = new, new_end
    return [cells([(f"{j['type']}{j['chunk']}", j["micro_batch"]) for j in schedule[rank]],
                  rank, pp, True) for rank in range(pp)]


def write(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        for row in rows:
            writer.writerow(row)


def main(out_dir):
    target = os.path.join(out_dir, "paddle")
    os.makedirs(target, exist_ok=True)
    skipped, written = [], 0
    for name, (cls, extra, vpps) in PASSES.items():
        for pp in GRID_PP:
            for vpp in vpps:
                for m in grid_ms(pp):
                    if extra.get("split_backward") and m != pp:
                        continue  # VPP splits the backward only when m == pp; else it is VPP
                    tag = f"{name}_pp{pp}_v{vpp}_m{m}"
                    try:
                        rows = pass_rows(cls, extra, pp, vpp, m)
                    except Exception as exc:  # Paddle's pass refuses it (any type): recorded
                        text = str(exc).strip().splitlines()
                        skipped.append(f"{tag}: {type(exc).__name__}: {text[0] if text else ''}")
                        continue
                    write(os.path.join(target, tag + ".csv"), rows)
                    written += 1
    for cost, t_f, t_i, t_w, comm in COST_MODELS:
        for pp in GRID_PP:
            for vpp in (2, 4):
                for m in grid_ms(pp):
                    tag = f"ZBVPP_{cost}_pp{pp}_v{vpp}_m{m}"
                    try:
                        rows = zbvpp_rows(pp, vpp, m, t_f, t_i, t_w, comm)
                    except Exception as exc:  # Paddle's pass refuses it (any type): recorded
                        text = str(exc).strip().splitlines()
                        skipped.append(f"{tag}: {type(exc).__name__}: {text[0] if text else ''}")
                        continue
                    write(os.path.join(target, tag + ".csv"), rows)
                    written += 1
    with open(os.path.join(target, "SKIPPED.txt"), "w") as f:
        f.write(f"# paddle {paddle.__version__}: configurations the passes refuse\n")
        f.write("# ZBVPP (all): PipelineZeroBubbleVirtualPipelinePass._create_job_list raises "
                "AttributeError (no _get_max_memory) in 3.3.1; m == pp emulated via VScheduleCreator\n")
        for line in skipped:
            f.write(line + "\n")
    print(f"paddle {paddle.__version__}: wrote {written} CSV files, skipped {len(skipped)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))

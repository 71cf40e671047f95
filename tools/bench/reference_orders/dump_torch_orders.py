"""Dump PyTorch's pipelining schedule orders as compute-only CSV files (PyTorch ``_dump_csv``).

Run with a Python that has torch (CPU wheel is enough; no process group, no GPU)::

    python tools/bench/reference_orders/dump_torch_orders.py [OUT_DIR]

Each schedule class of ``torch.distributed.pipelining.schedules`` is instantiated with stub
stage objects (only ``group_size`` / ``group_rank`` / ``stage_index`` / ``num_stages`` /
``submod``), which is all the constructors need to compute ``pipeline_order``.  Idle steps
(``None``) and ``REDUCE_GRAD`` actions are dropped; DualPipeV's ``OVERLAP_F_B`` pairs are
expanded into their sub-actions (F then B).  One file per (schedule, pp, vpp, m):
``torch/<Schedule>_pp<pp>_v<vpp>_m<m>.csv``; constructors that refuse a configuration (or
whose constructor hangs) are listed in ``torch/SKIPPED.txt`` with the reason.
"""
import csv
import os
import signal
import sys

import torch
from torch.distributed.pipelining import schedules as S

GRID_PP = (2, 4, 8)
GRID_VPP = (1, 2, 4)


def grid_ms(pp):
    return sorted({pp, pp + 1, 2 * pp, 2 * pp + 2, 4 * pp})


class StubStage:
    """The attributes the schedule constructors read; nothing runs."""

    def __init__(self, rank, pp, stage_index, num_stages):
        self.group_size = pp
        self.group_rank = rank
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.submod = None
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.stage_index_to_group_rank = {}


# name -> (class, single-stage?, placement)
SCHEDULES = {
    "GPipe": (S.ScheduleGPipe, True, "looped"),
    "1F1B": (S.Schedule1F1B, True, "looped"),
    "LoopedBFS": (S.ScheduleLoopedBFS, False, "looped"),
    "Interleaved1F1B": (S.ScheduleInterleaved1F1B, False, "looped"),
    "InterleavedZeroBubble": (S.ScheduleInterleavedZeroBubble, False, "looped"),
    "ZBVZeroBubble": (S.ScheduleZBVZeroBubble, False, "v"),
    "DualPipeV": (S.ScheduleDualPipeV, False, "v"),
}


def stages_for(rank, pp, vpp, placement):
    num = pp * vpp
    if placement == "v":
        ids = [c * pp + (rank if c % 2 == 0 else pp - 1 - rank) for c in range(vpp)]
    else:
        ids = [c * pp + rank for c in range(vpp)]
    return [StubStage(rank, pp, s, num) for s in ids]


def flatten(actions):
    out = []
    for a in actions:
        if a is None:
            continue
        if a.computation_type == S.OVERLAP_F_B and a.sub_actions:
            out.extend(flatten(a.sub_actions))
            continue
        if not a.is_compute_op:
            continue
        out.append(f"{a.stage_index}{a.computation_type.value}{a.microbatch_index}")
    return out


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def build(cls, single, placement, pp, vpp, m):
    if single:
        if vpp != 1:
            raise ValueError("single-stage schedule: vpp must be 1")
        sched = cls(StubStage(0, pp, 0, pp), m)
        order = sched.pipeline_order
    else:
        sched = cls(stages_for(0, pp, vpp, placement), m)
        order = sched.pipeline_order
    return [flatten(order[r]) for r in range(pp)]


def main(out_dir):
    torch_dir = os.path.join(out_dir, "torch")
    os.makedirs(torch_dir, exist_ok=True)
    signal.signal(signal.SIGALRM, _alarm)
    skipped = []
    written = 0
    for name, (cls, single, placement) in SCHEDULES.items():
        for pp in GRID_PP:
            for vpp in GRID_VPP:
                if (single and vpp != 1) or (placement == "v" and vpp != 2):
                    continue  # the class has a fixed number of stages per rank
                for m in grid_ms(pp):
                    tag = f"{name}_pp{pp}_v{vpp}_m{m}"
                    signal.alarm(20)
                    try:
                        rows = build(cls, single, placement, pp, vpp, m)
                    except Timeout:
                        skipped.append(f"{tag}: constructor did not finish in 20 s (deadlocked order)")
                        continue
                    except Exception as exc:  # the constructor refuses the configuration
                        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                        skipped.append(f"{tag}: {type(exc).__name__}: {msg}")
                        continue
                    finally:
                        signal.alarm(0)
                    with open(os.path.join(torch_dir, tag + ".csv"), "w", newline="") as f:
                        writer = csv.writer(f, lineterminator="\n")
                        for row in rows:
                            writer.writerow(row)
                    written += 1
    with open(os.path.join(torch_dir, "SKIPPED.txt"), "w") as f:
        f.write(f"# torch {torch.__version__}: configurations the schedule classes refuse\n")
        for line in skipped:
            f.write(line + "\n")
    print(f"torch {torch.__version__}: wrote {written} CSV files, skipped {len(skipped)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))

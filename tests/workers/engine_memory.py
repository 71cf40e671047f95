"""Peak bytes through the engine, on 2 processes in ONE launch: ``engine_memory.py OUT_DIR``
trains the GPT example through ``dist.to_static`` (a size whose activations dwarf the rest) and
writes ``OUT_DIR/rank<r>.json``; ``tests/multiprocess/test_memory.py`` checks it.

* **schedules** (FThenB, 1F1B, ZBH1, ZBH2, ZBV): steps 1-3 are profiled with their
  allocations, as the engine's measured step is (:func:`record_jobs_and_memory`,
  :func:`rank_memory`), each figure the median of the three steps'; the
  peak is the smallest allocator peak of the :data:`PEAK_STEPS` steps after it (on CPU the
  executor frees dead tensors on a thread of its own, and each step's peak adds what that
  thread had not freed yet: up to half as much again on this model, in any step; the
  smallest is the program's own peak, the figure the model prices);
* **budgets**: ``auto`` with ``use_memory_budget`` at three budgets set from those peaks (the
  same on both processes): between 1F1B's and ZBH2's, above ZBH2's, and below 1F1B's; each
  records its re-plan (or its refusal) and the peaks of the steps after it.  The measured step
  runs behind the GC thread on this rank's own CPU: its prices are then the program's own, as
  the peaks they are checked against are (with frees lagging under a busy machine, one
  ``.ci/run`` priced rank 0's unit and temporaries so high that the "high" budget held 2.78 forwards
  against its usual 3.74);
* **against Paddle** (issue 58): Paddle's own FThenB and 1F1B passes beside pipesplit's, at
  each m of :data:`PADDLE_MS`, each engine's peak exact to the byte: resident (what it holds
  from before its build to after its first step) + the smallest step peak above the step's
  start (steps until the smallest came twice on every rank: :data:`PEAK_STEPS_CAP`), every
  step run behind the executor's GC thread on this rank's own CPU
  (:func:`~pipesplit.ir_utils.measure.run_behind_gc`), Python's cyclic collector off meanwhile
  (an earlier engine freed midway would move the figures).
"""
import gc
import json
import os
import statistics
import sys
from pathlib import Path

import paddle
import paddle.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import auto_parallel_pipeline as example  # noqa: E402

from pipesplit.ir_utils.measure import (MemoryStats, run_behind_gc,  # noqa: E402
                                        serial_executor)
from pipesplit.passes import strategy as ps_strategy  # noqa: E402
from pipesplit.passes.engine.session import engine_state  # noqa: E402
from pipesplit.passes.measure.memory_budget import MemoryBudgetError, rank_memory  # noqa: E402
from pipesplit.passes.measure.profile import (ops_on_this_thread,  # noqa: E402
                                              record_jobs_and_memory)

SIZES = ["--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "64", "--vocab", "256",
         "--micro-batch-size", "4"]
SCHEDULES = (("FThenB", 1), ("1F1B", 1), ("ZBH1", 1), ("ZBH2", 1), ("ZBV", 2))
PEAK_STEPS = 5
#: issue 58's engines step on after PEAK_STEPS until each rank's smallest came twice, at most
#: so many (a free lagging behind a step, even behind the GC thread, only raises its peak)
PEAK_STEPS_CAP = 10
#: steps profiled with their allocations per schedule; the memory figures are the steps' medians
PROFILED_STEPS = 3
#: issue 58: the passes Paddle's engine serves on CPU, and the micro-batch counts they are
#: compared at
PADDLE_PASSES = ("FThenB", "1F1B")
PADDLE_MS = (4, 8)
MEMORY = MemoryStats()


def build(schedule: str, vpp: int, steps: int, budget=None, m: int = 4):
    args = example.parse_args(["--schedule", schedule, "--vpp", str(vpp), "--steps", str(steps),
                               "--tag", f"{schedule}-{budget}", "-m", str(m)] + SIZES)
    strategy = example.make_strategy(args)
    if budget is not None:
        ps_strategy.use_memory_budget(strategy, budget)
    world = dist.get_world_size()
    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
    model = example.build(args, [meshes[i * world // args.layers] for i in range(args.layers)])
    opt = example.make_optimizer(args, model.parameters())
    data = example.TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
    loader = paddle.io.DataLoader(data, batch_size=args.batch, shuffle=False)
    dist_model = dist.to_static(model, loader, example.lm_loss, opt, strategy)
    dist_model.train()
    return dist_model, list(loader())


def step_peak(dist_model, batch) -> int:
    MEMORY.settled_current()
    MEMORY.reset_peak()
    dist_model(*batch)
    return MEMORY.peak()


def measure_schedule(schedule: str, vpp: int) -> dict:
    before_build = MEMORY.settled_current()
    dist_model, batches = build(schedule, vpp, 1 + PROFILED_STEPS + PEAK_STEPS)
    with ops_on_this_thread():  # (as the engine's measured step: interpreters built so)
        dist_model(*batches[0])
    config = engine_state(dist_model._engine).pipeline_of("train").config
    measured = []
    for batch in batches[1:1 + PROFILED_STEPS]:
        start = MEMORY.settled_current()
        _, _, levels = record_jobs_and_memory(lambda: dist_model(*batch))
        measured.append(rank_memory(levels, start, config.pp_stage, config.placement))
    peaks = [step_peak(dist_model, b) for b in batches[1 + PROFILED_STEPS:]]
    return {"before_build": before_build, "start": measured[0]["start"], "peak": min(peaks),
            "peaks": peaks, "memory": _steady(measured)}


def _steady(measured):
    """One step's :func:`rank_memory` from several: each figure the low median of the steps'
    (a step in which the executor's free thread lagged behind a job, as it may on a loaded
    machine, moves a few of that step's figures; the median of the steps does not move)."""
    first = measured[0]
    return {**first, **{field: {kind: {stage: statistics.median_low(m[field][kind][stage]
                                                                      for m in measured)
                                       for stage in per}
                                for kind, per in first[field].items()}
                        for field in ("delta", "excess")}}


def own_cpu(rank: int) -> int:
    """The CPU this rank's steps run behind the GC thread on (one per rank where there are
    enough: :func:`~pipesplit.ir_utils.measure.run_behind_gc`)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[rank % len(cpus)]


def run_budget(budget: int, cpu: int) -> dict:
    dist_model, batches = build("auto", 1, 3 + PEAK_STEPS, budget)
    dist_model(*batches[0])
    start = MEMORY.settled_current()
    try:  # measured (behind the GC thread), re-planned under the budget
        run_behind_gc(lambda: dist_model(*batches[1]), cpu)
    except MemoryBudgetError as exc:
        return {"budget": budget, "start": start, "refused": str(exc),
                "smallest": exc.smallest, "error_budget": exc.budget}
    dist_model(*batches[2])  # builds the new plan's interpreters
    done = ps_strategy.replanned(dist_model)
    peaks = [step_peak(dist_model, b) for b in batches[3:]]
    return {"budget": budget, "start": start, "peak": min(peaks), "peaks": peaks,
            "memory": done.memory, "after_order": [list(j) for j in done.after.job_order]}


def against_paddle(rank: int) -> dict:
    """``{"<impl>/<schedule>/m<m>": {...}}``: :func:`own_peak` of Paddle's and pipesplit's
    engines of :data:`PADDLE_PASSES` at every m of :data:`PADDLE_MS`."""
    cpu = own_cpu(rank)
    out = {}
    try:
        for m in PADDLE_MS:
            for schedule in PADDLE_PASSES:
                for impl in ("paddle", "pipesplit"):
                    (ps_strategy.disable_strategy if impl == "paddle"
                     else ps_strategy.enable_strategy)()
                    tag = f"{impl}/{schedule}/m{m}"
                    with example.new_process():
                        out[tag] = own_peak(schedule, m, cpu, tag)
    finally:
        ps_strategy.enable_strategy()
    return out


def own_peak(schedule: str, m: int, cpu: int, tag: str) -> dict:
    """One engine's peak bytes, as ``tools/bench/bench_engine.py`` counts them (resident +
    the smallest step's bytes above its start), each step behind the GC thread on ``cpu``;
    :data:`PEAK_STEPS` steps, more (as the benchmark's memory steps) while the smallest has
    not come twice on every rank (the ranks agree through the store under ``tag``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gc.collect()
    gc.disable()
    try:
        before = MEMORY.settled_current()
        with serial_executor():
            dist_model, batches = build(schedule, 1, 1 + PEAK_STEPS_CAP, m=m)
            dist_model(*batches[0])
            resident = MEMORY.settled_current() - before
            above = []
            for step, batch in enumerate(batches[1:], 1):
                start = MEMORY.settled_current()
                MEMORY.reset_peak()
                run_behind_gc(lambda: dist_model(*batch), cpu)
                above.append(MEMORY.peak() - start)
                if step >= PEAK_STEPS and all(example.exchange(
                        rank, world, above.count(min(above)) >= 2, key=f"{tag}/{step}")):
                    break
    finally:
        gc.enable()
    return {"resident": resident, "above_start": above, "peak": resident + min(above)}


def main() -> int:
    out = Path(sys.argv[1])
    ps_strategy.enable_strategy()
    from pipesplit.passes import cpu_support
    cpu_support.enable()
    rank, world = dist.get_rank(), dist.get_world_size()
    record = {"rank": rank, "schedules": {}}
    for schedule, vpp in SCHEDULES:
        with example.new_process():
            record["schedules"][schedule] = measure_schedule(schedule, vpp)
    # each budget in its auto engine's own terms: its resident bytes are every engine's (the
    # same model), on top of what this process holds before building it; one budget for both
    # processes (their re-plans must agree), from both processes' figures
    mine = record["schedules"]
    resident = mine["1F1B"]["start"] - mine["1F1B"]["before_build"]
    above = {s: mine[s]["peak"] - mine[s]["start"] for s in ("1F1B", "ZBH2")}
    record["budgets"] = {}
    for name, over_start, pick in (("middle", (above["1F1B"] + above["ZBH2"]) // 2, max),
                                   ("high", above["ZBH2"] * 5 // 4, max),
                                   ("low", above["1F1B"] // 4, min)):
        here = MEMORY.settled_current() + resident
        budget = pick(example.exchange(rank, world, here + over_start, key=f"budget-{name}"))
        with example.new_process():
            record["budgets"][name] = run_budget(budget, own_cpu(rank))
    record["against_paddle"] = against_paddle(rank)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

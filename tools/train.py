"""Multi-process pipeline training: one process per pipeline rank (pp = world size).

    python -m paddle.distributed.launch --nproc_per_node 2 tools/train.py \\
        --schedule VPP --vpp 2 -m 4 --steps 2 --json out.json

Same model, data and arguments as ``pipesplit demo`` (``--pp`` defaults to the world size and
must equal it).  Every rank builds the same full program and the same startup program (seeded,
so parameters start identical), applies pipesplit's pass with ``pp_stage`` = its rank, and runs
the steps; the rank holding the loss reports the per-micro-batch losses.  With ``--json`` the
last rank writes the demo's record: ``losses`` (pipeline), ``baseline_losses`` (an unsplit run
it computes itself) and ``max_param_diff`` (over every rank's parameters, gathered through the
launcher's TCP store).

On CPU (gloo) every transfer is a broadcast on the world ring in which all ranks take part
(any pp; see :mod:`pipesplit.passes.transport.p2p`); on a GPU build the ranks talk over NCCL send_v2 /
recv_v2.

A hang does not stay silent: gloo collectives time out (about 30 s) and a watchdog thread
(``--watchdog`` seconds per step) reports the rank, the step and the comm job it is stuck in
(send / recv, chunk, micro-batch, peer rank), then ends the process with exit code 3.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import List, Optional, Sequence

if __package__ in (None, ""):  # run as a script by paddle.distributed.launch
    # the script's folder would shadow modules (tools/profile.py the standard library's
    # profile); pipesplit itself is imported from the installation
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

EXIT_HANG = 3
EXIT_ERROR = 2


def make_parser():
    from pipesplit.tools.demo import make_parser as demo_parser

    p = demo_parser()
    p.prog = "tools/train.py"
    p.description = __doc__.splitlines()[0]
    p.set_defaults(pp=None)
    p.add_argument("--watchdog", type=float, default=120.0,
                   help="seconds one step may take before the rank reports where it is stuck "
                        "and exits (default 120; gloo's own timeout is about 30 s)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="p2p flavour: cpu (gloo broadcasts on the world ring), gpu (NCCL), auto: "
                        "from the place")
    p.add_argument("--params-out", metavar="PATH",
                   help="write every rank's final parameters (gathered) to this .npz file")
    p.add_argument("--fail-at", metavar="RANK:STEP[:hang]", default=None,
                   help="testing aid: rank RANK exits abruptly (or, with ':hang', stops "
                        "responding) at the start of step STEP, to check that the other ranks "
                        "report the failure instead of hanging")
    return p


class Watchdog:
    """Names the comm job a rank is stuck in when a step runs longer than ``timeout``."""

    def __init__(self, rank, info, scope, timeout, log=sys.stderr):
        self.rank, self.info, self.scope, self.timeout, self.log = rank, info, scope, timeout, log
        self.step = None
        self.started = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()

    def begin(self, step):
        self.step, self.started = step, time.monotonic()

    def end(self):
        self.step = None

    def where(self) -> str:
        """The comm job the rank is in (from the progress counter the comm programs bump)."""
        return self.info.progress.where(self.scope)

    def report(self, what) -> str:
        return f"pipesplit train: rank {self.rank} {what} in step {self.step}, {self.where()}"

    def _run(self):
        while not self._stop.wait(0.5):
            if self.step is not None and time.monotonic() - self.started > self.timeout:
                print(self.report(f"no progress for {self.timeout:g} s"), file=self.log,
                      flush=True)
                os._exit(EXIT_HANG)


def _store():
    from paddle.base import core

    return core.create_or_get_global_tcp_store()


def _exchange(rank, world, key, payload: dict, gather_to: Optional[int]):
    """Put ``payload`` under ``key/rank`` in the launcher's TCP store; ``gather_to`` gets all."""
    store = _store()
    store.set(f"pipesplit/{key}/{rank}", json.dumps(payload).encode())
    if rank != gather_to:
        return None
    return [json.loads(bytes(store.get(f"pipesplit/{key}/{r}")).decode()) for r in range(world)]


def run(args, rank: int, world: int, log=sys.stderr, tag: str = "result") -> Optional[dict]:
    """Train on this rank; on the last rank return the demo's record plus ``params`` (every
    rank's parameters, gathered) and ``loss_rank``; ``None`` on the other ranks.  ``tag``
    namespaces the TCP-store keys (one per run when a process runs several)."""
    import numpy as np

    import paddle
    from pipesplit.ir_utils import init_scope, read_params, run_unsplit_baseline
    from pipesplit.passes.transport.p2p import PROGRESS_VAR
    from pipesplit.job_list.request import PipelineConfig
    from pipesplit.passes.split.per_rank import build_rank_plan
    from pipesplit.tools.demo import build_model

    paddle.enable_static()
    model = build_model(args)
    attrs = dict(num_micro_batches=args.m, pp_degree=world, vpp_degree=args.vpp,
                 split_backward=args.split_backward, pp_stage=rank)
    config = PipelineConfig.from_attrs(args.schedule, attrs)
    pipeline = build_rank_plan(model.main, model.startup, config, device=args.device)
    info = pipeline.rank_info
    place = _rank_place(info)
    scope = init_scope(model, pipeline.split, place)
    scope.var(PROGRESS_VAR).get_tensor().set(np.zeros([1], np.float32), place)
    print(f"rank {rank}/{world}: {pipeline.schedule.name} vpp={args.vpp} m={args.m} stages "
          f"{sorted(info.stages.values())}, {len(info.param_names)} parameters, "
          f"{len(info.comm_sequence)} comm jobs per step ({info.backend})", file=log, flush=True)
    losses = _train_steps(args, rank, model, pipeline, scope, place, log)

    params = read_params(scope, info.param_names)
    # every run checks itself against the unsplit baseline (cheap for the demo's models)
    baseline = run_unsplit_baseline(model, args.steps, args.m) if rank == world - 1 else None
    payload = {"rank": rank, "losses": losses if info.fetch_names else None,
               "params": {n: np.asarray(v).tolist() for n, v in params.items()}}
    gathered = _exchange(rank, world, tag, payload, gather_to=world - 1)
    record, summary = None, []
    if gathered is not None:
        record = _record(gathered, baseline, world, pipeline.schedule.name)
        summary = _summary(record, args.steps)
        print("\n".join(summary), file=log, flush=True)
    # keep the store (hosted by rank 0) alive until the last rank has read it; the last rank's
    # summary travels with it, since the launcher shows only rank 0's output on the console
    done = _exchange(rank, world, tag + "/done", {"summary": summary},
                     gather_to=0)
    for payload in done or []:
        if payload.get("summary") and rank != world - 1:
            print(f"rank {world - 1} (results):\n" + "\n".join(payload["summary"]), flush=True)
    return record


def _rank_place(info):
    """The rank's place, its transport's; with NCCL once the comm contexts of its rings are
    made, in the same order on every rank."""
    rings = set(info.ring_ids.values())
    if info.reduce_ring_id is not None:  # clipping / tied-weight all-reduces
        rings.add(info.reduce_ring_id)
    return info.transport.rank_place(rings)


def _train_steps(args, rank, model, pipeline, scope, place, log) -> list:
    """``args.steps`` steps through the rank's plan under the watchdog (and ``--fail-at``);
    the per-micro-batch losses of each step where this rank fetches them."""
    from pipesplit.ir_utils import PlanRunner
    from pipesplit.passes.transport.progress import failure_reason
    from pipesplit.tools.demo import schedule_restored

    info = pipeline.rank_info
    fail_rank, fail_step, fail_mode = None, None, "exit"
    if args.fail_at:
        parts = args.fail_at.split(":")
        fail_rank, fail_step = int(parts[0]), int(parts[1])
        fail_mode = parts[2] if len(parts) > 2 else "exit"
    watchdog = Watchdog(rank, info, scope, args.watchdog, log).start()
    runner = PlanRunner(pipeline.plan, scope, place, program=model.main)
    losses = []
    with schedule_restored(model):  # the unsplit baseline starts from the same LR
        try:
            for step in range(args.steps):
                if rank == fail_rank and step == fail_step:
                    print(f"rank {rank}: --fail-at: {fail_mode} at step {step}", file=log, flush=True)
                    if fail_mode == "hang":
                        time.sleep(3600)
                    os._exit(1)
                batch = model.make_batch(step)
                feed = {k: v for k, v in batch.items() if k in info.feed_names}
                info.progress.start_step(scope, place)
                watchdog.begin(step)
                try:
                    out = runner.step(feed)
                except Exception as exc:  # gloo timeout, peer gone ...
                    raise RuntimeError(f"{watchdog.report('failed')}: "
                                       f"{failure_reason(exc)}") from exc
                watchdog.end()
                if model.lr_scheduler is not None:
                    model.lr_scheduler.step()
                if info.fetch_names:
                    losses.append([float(x) for x in out])
        finally:
            watchdog.stop()
    return losses


def _record(gathered, baseline, world: int, schedule_name: str) -> dict:
    """The demo's record from every rank's payload and the unsplit baseline."""
    import numpy as np

    baseline_losses, baseline_params = baseline
    holder = next(g for g in gathered if g["losses"] is not None)
    all_params = {n: np.asarray(v, np.float32) for g in gathered for n, v in g["params"].items()}
    max_diff = max(float(np.max(np.abs(v - baseline_params[n]))) for n, v in all_params.items())
    return {"losses": holder["losses"],
            "baseline_losses": [[float(x) for x in row] for row in baseline_losses],
            "max_param_diff": max_diff, "loss_rank": holder["rank"], "world_size": world,
            "schedule": schedule_name, "params": all_params}


def _summary(record: dict, steps: int) -> List[str]:
    import numpy as np

    lines = [f"{'step':>4}  {'loss (pipeline)':>16}  {'loss (unsplit)':>15}  "
             f"{'max |diff| per mb':>17}"]
    for step, (ours, ref) in enumerate(zip(record["losses"], record["baseline_losses"])):
        diff = max(abs(a - b) for a, b in zip(ours, ref))
        lines.append(f"{step:>4}  {np.mean(ours):>16.7f}  {np.mean(ref):>15.7f}  {diff:>17.2e}")
    lines.append(f"max parameter difference after {steps} steps (all ranks): "
                 f"{record['max_param_diff']:.2e}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    from pipesplit.tools._console import quiet_paddle

    args = make_parser().parse_args(argv)
    quiet_paddle()
    import paddle.distributed as dist

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if world < 2:
        print("tools/train.py: error: run it under `python -m paddle.distributed.launch "
              "--nproc_per_node N` with N >= 2 (pp = world size); for one process use "
              "`pipesplit demo`", file=sys.stderr)
        return EXIT_ERROR
    if args.pp is not None and args.pp != world:
        print(f"tools/train.py: error: --pp {args.pp} != world size {world} (pp is the number "
              "of processes)", file=sys.stderr)
        return EXIT_ERROR
    args.pp = world
    dist.init_parallel_env()  # dynamic mode: gloo on CPU, NCCL on GPU
    rank = dist.get_rank()
    try:
        from pipesplit.tools.demo import _check

        _check(args)
        record = run(args, rank, world)
    except (ValueError, TypeError, RuntimeError) as exc:
        if os.environ.get("PIPESPLIT_DEBUG") == "1":
            traceback.print_exc()
        print(f"tools/train.py: rank {rank}: error: {' '.join(str(exc).split())[:3000]}",
              file=sys.stderr, flush=True)
        os._exit(EXIT_ERROR)  # do not wait on peers in interpreter teardown
    if record is not None:
        params = record.pop("params")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
        if args.params_out:
            import numpy as np

            np.savez(args.params_out, **params)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip Paddle's teardown (the gloo context may block on a gone peer)


if __name__ == "__main__":
    sys.exit(main())

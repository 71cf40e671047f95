"""Several DistModels in one process, and pipesplit switched on or off between them, in ONE
launch: ``engine_several_models.py OUT.json``.

Each case builds ``examples/auto_parallel_pipeline.py``'s model once per entry (with its own
seed), ``dist.to_static`` each as a script does (pipesplit on or off at that moment, as the
entry says), then trains them in turn, one step each, three steps.  Every rank records per
model either its largest loss and parameter difference from the one-process reference, or the
first line of what it raised (and from which call); rank 0 writes
``{case: {rank: [per model]}}``.  Each case runs under fresh names and an empty scope (as in a
new process), so the cases do not meet.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import auto_parallel_pipeline as example  # noqa: E402
from _cases import record_cases  # noqa: E402

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from pipesplit.passes import cpu_support  # noqa: E402
from pipesplit.passes import strategy as pipesplit_strategy  # noqa: E402

STEPS = 3
#: case -> the models, in the order they are built: (schedule, pipesplit on when built, how
#: its names are made: "script" as a script builds it, "fresh" under a new name generator)
CASES = {
    "two_pipesplit_zbv_then_1f1b": [("ZBV", True, "script"), ("1F1B", True, "script")],
    "two_pipesplit_1f1b_then_zbh1": [("1F1B", True, "script"), ("ZBH1", True, "script")],
    "pipesplit_zbv_then_paddle_1f1b": [("ZBV", True, "script"), ("1F1B", False, "script")],
    "paddle_1f1b_then_pipesplit_zbv": [("1F1B", False, "script"), ("ZBV", True, "script")],
    "same_names_again": [("ZBV", True, "script"), ("1F1B", True, "fresh")],
}


def build(schedule, pipesplit_on, names, seed):
    """One DistModel as a script builds it; returns (args, dist_model, loader) or the error."""
    if pipesplit_on:
        pipesplit_strategy.enable_strategy()
    else:
        pipesplit_strategy.disable_strategy()
    argv = ["--schedule", schedule, "-m", "4", "--steps", str(STEPS), "--seed", str(seed)]
    args = example.parse_args(argv + (["--vpp", "2"] if schedule in ("ZBV", "VPP") else []))
    world = dist.get_world_size()
    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
    block_mesh = [meshes[i * world // args.layers] for i in range(args.layers)]
    guard = paddle.utils.unique_name.guard() if names == "fresh" else _nothing()
    with guard:
        model = example.build(args, block_mesh)
        opt = example.make_optimizer(args, model.parameters())
        data = example.TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
        loader = paddle.io.DataLoader(data, batch_size=args.batch, shuffle=False)
        dist_model = dist.to_static(model, loader, example.lm_loss, opt,
                                    example.make_strategy(args))
    return args, dist_model, loader


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _line(where, e):
    return f"{where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def run_case(models):
    built, results = [], []
    for i, (schedule, on, names) in enumerate(models):
        try:
            built.append(build(schedule, on, names, seed=i + 1))
            results.append({"schedule": schedule, "losses": []})
        except Exception as e:  # noqa: BLE001 (the message is the result)
            built.append(None)
            results.append({"schedule": schedule, "error": _line("to_static", e)})
    batches = [None if b is None else list(b[2]()) for b in built]
    for step in range(STEPS):
        for b, got, data in zip(built, results, batches):
            if b is None or "error" in got:
                continue
            try:
                if step == 0:
                    b[1].train()
                loss = b[1](*data[step])
            except Exception as e:  # noqa: BLE001
                got["error"] = _line(f"step {step}", e)
                continue
            if loss is not None:
                got["losses"].append(np.asarray(loss, np.float64).reshape(-1).tolist())
    for b, got in zip(built, results):
        if b is None or "error" in got:
            continue
        args, dist_model, _ = b
        ref, ref_params = example.reference(args)
        params = example.local_parameters(dist_model)
        got["param_diff"] = max(float(np.max(np.abs(v - ref_params[k])))
                                for k, v in params.items() if k in ref_params)
        got["loss_diff"] = max((abs(a - r) for o, t in zip(got.pop("losses"), ref["losses"])
                                for a, r in zip(o, t)), default=None)
    return results


def _with_pipesplit_on_after(models):
    try:
        return run_case(models)
    finally:
        pipesplit_strategy.enable_strategy()


def main() -> int:
    cpu_support.enable()
    pipesplit_strategy.enable_strategy()
    record_cases(CASES, _with_pipesplit_on_after, Path(sys.argv[1]), example.new_process,
                 example.exchange, key="several")
    return 0


if __name__ == "__main__":
    sys.exit(main())

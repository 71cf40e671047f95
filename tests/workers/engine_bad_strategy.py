"""Misconfigured pipelines through the engine, in ONE launch: ``engine_bad_strategy.py OUT.json``.

Each case builds ``examples/auto_parallel_pipeline.py``'s model, spoils one thing (a strategy
field of the wrong type, more stages than processes, a block class the model lacks, the order
of the set-up calls, every layer on one mesh, a loader the pipeline cannot split) and trains
as far as the loader goes.  Every rank records the first line of what it raised
(``"Type: message"``) or ``"trained"``; rank 0 writes ``{case: {rank: line}}``.  Each case must fail the same way on every rank before any
collective, or the ranks would fall out of step.
"""
import contextlib
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import auto_parallel_pipeline as example  # noqa: E402
from _cases import record_cases  # noqa: E402

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from pipesplit.passes import cpu_support  # noqa: E402
from pipesplit.passes import strategy as pipesplit_strategy  # noqa: E402


def _field(name, value):
    def spoil(strategy, args):
        setattr(strategy.pipeline, name, value)
    return spoil


class FloatLabels(paddle.io.Dataset):
    """The example's data with float32 labels (its loss is a hard-label cross entropy)."""

    def __init__(self, data):
        self.data = data

    def __getitem__(self, i):
        x, y = self.data[i]
        return x, y.astype("float32")

    def __len__(self):
        return len(self.data)


#: samples in the dataset, by layout (default: one full batch)
SAMPLES = {"empty_loader": lambda args: 0,
           "short_last_batch": lambda args: args.batch + args.batch // 2,
           "short_last_batch_not_drawn": lambda args: args.batch + args.batch // 2}
#: steps a layout trains before it stops, as a trainer stops at max_steps (default: all)
MAX_STEPS = {"short_last_batch_not_drawn": 1}

CASES = {  # case -> (strategy change, example arguments, model layout)
    "vpp_float": (_field("vpp_degree", 2.5), ["--schedule", "ZBV"], "model"),
    "vpp_str": (_field("vpp_degree", "2"), ["--schedule", "ZBV"], "model"),
    "steps_float": (_field("accumulate_steps", 4.5), ["--schedule", "1F1B"], "model"),
    "pp_3_of_2": (_field("pp_degree", 3), ["--schedule", "1F1B"], "model"),
    "pp_4_of_2": (_field("pp_degree", 4), ["--schedule", "ZBH1"], "model"),
    "seg_method": (_field("vpp_seg_method", "NoSuchBlock"), ["--schedule", "ZBV"], "model"),
    "enable_after_to_static": (None, ["--schedule", "ZBV"], "late"),
    "enable_after_to_static_1f1b": (None, ["--schedule", "1F1B"], "late"),
    # enable_strategy() after to_static AND train(): ZBV stops at train() (Paddle's own engine
    # has no ZBV), 1F1B at its first step (Paddle built its own plan at train())
    "enable_after_train": (None, ["--schedule", "ZBV"], "late_train"),
    "enable_after_train_1f1b": (None, ["--schedule", "1F1B"], "late_train"),
    "one_mesh": (None, ["--schedule", "1F1B"], "one_mesh"),
    "one_mesh_zbv": (None, ["--schedule", "ZBV"], "one_mesh"),
    "gradient_merge": (lambda strategy, args: (setattr(strategy.gradient_merge, "enable", True),
                                               setattr(strategy.gradient_merge, "k_steps", 2)),
                       ["--schedule", "ZBH1"], "model"),
    "cpu_support_after_to_static": (None, ["--schedule", "ZBV"], "cpu_late"),
    "empty_loader": (None, ["--schedule", "ZBV"], "empty_loader"),
    "short_last_batch": (None, ["--schedule", "1F1B"], "short_last_batch"),
    # the trainer's max_steps stops before the short batch: Paddle's own schedules train it
    "short_last_batch_not_drawn": (None, ["--schedule", "ZBV"], "short_last_batch_not_drawn"),
    "float_labels": (None, ["--schedule", "ZBV"], "float_labels"),
    "block_leaves_its_mesh": (None, ["--schedule", "ZBV"], "block_leaves_its_mesh"),
}


def _leave_the_mesh(block, home, away):
    """``block`` computes part of its output on another stage's mesh, inside itself.  (A bound
    method: Paddle 3.0.0's dy2static reads ``forward.__func__`` of a layer it converts, an
    ``AttributeError`` for a plain function set on the instance; later releases take either.)"""
    forward = block.forward

    def forward_partly_elsewhere(self, x):
        y = dist.reshard(forward(x), away, [dist.Replicate()]) * 1.0
        return dist.reshard(y, home, [dist.Replicate()])
    block.forward = types.MethodType(forward_partly_elsewhere, block)


def run_case(change, argv, layout) -> str:
    args = example.parse_args(argv + ["-m", "4", "--steps", "1"])
    world = dist.get_world_size()
    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
    block_mesh = [meshes[0 if layout == "one_mesh" else i * world // args.layers]
                  for i in range(args.layers)]
    if layout in ("late", "late_train"):
        pipesplit_strategy.disable_strategy()
    if layout == "cpu_late":
        cpu_support.disable()
    model = example.build(args, block_mesh)
    if layout == "block_leaves_its_mesh":
        _leave_the_mesh(model.blocks[0], meshes[0], meshes[1])
    opt = example.make_optimizer(args, model.parameters())
    strategy = example.make_strategy(args)
    if change is not None:
        change(strategy, args)
    samples = SAMPLES.get(layout, lambda args: args.batch)(args)
    data = example.TokenData(samples, args.seq, args.vocab, args.seed)
    if layout == "float_labels":
        data = FloatLabels(data)
    loader = paddle.io.DataLoader(data, batch_size=args.batch, shuffle=False)
    try:
        dist_model = dist.to_static(model, loader, example.lm_loss, opt, strategy)
        if layout == "late":
            pipesplit_strategy.enable_strategy()
        if layout == "cpu_late":
            cpu_support.enable()
        dist_model.train()
        if layout == "late_train":
            pipesplit_strategy.enable_strategy()
        for step, (x, y) in enumerate(loader()):
            if step == MAX_STEPS.get(layout):
                break
            dist_model(x, y)
        return "trained"
    except Exception as e:  # noqa: BLE001 (the message is the result)
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        pipesplit_strategy.enable_strategy()
        cpu_support.enable()
        paddle.disable_static()  # a failed to_static may leave the static mode on


@contextlib.contextmanager
def _fresh():
    with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
        yield


def main() -> int:
    dist.init_parallel_env()
    pipesplit_strategy.enable_strategy()
    cpu_support.enable()
    record_cases(CASES, lambda spec: run_case(*spec), Path(sys.argv[1]), _fresh,
                 example.exchange, key="bad")
    return 0


if __name__ == "__main__":
    sys.exit(main())

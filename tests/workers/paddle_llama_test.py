"""Paddle's own auto-parallel Llama pipeline test (``tests/vendor/paddle_llama/``, unchanged)
through pipesplit's schedules, several in ONE launch (starting Paddle costs seconds):

    python -m paddle.distributed.launch --nproc_per_node 8 paddle_llama_test.py train \
        --dp 1 --mp 2 --pp 4 CONFIGS.json OUT_DIR
    python paddle_llama_test.py reference OUT.json       # one process, no meshes

CONFIGS.json is a list of ``{"tag", "schedule", "vpp", "gpu_plan"}``; every rank writes
``OUT_DIR/<tag>.rank<r>.json``: the loss each step returned (or None) and, per forward job of
its plan, the values it sends on (name, dtype, shape), which shows a value relayed past a stage;
with ``gpu_plan``, also the p2p ops of each comm job of the NCCL plan built from the same engine
program (on a CPU build: read, not run).

``train`` is the test's ``run_llama()`` as it is written: the test's strategy (``apply_pass``),
``create_optimizer`` (AdamW, ``ClipGradByGlobalNorm(1.0)``), ``LinearWarmup`` stepped by hand,
``BatchSampler(batch_size=2)`` with ``_acc_steps``, ``dist.shard_dataloader(meshes=[get_mesh(0),
get_mesh(1)], shard_dims="dp")`` (the labels on stage 1's mesh, whatever the pp), no
``dist.init_parallel_env()``.  What changes around it: the strategy's ``schedule_mode`` (and
``vpp_degree``) set per config; the two lines a pipesplit user adds (``enable_strategy()``,
``cpu_support.enable()``); seeded random tokens instead of the test's all-zero data (which would
make any comparison vacuous); the mesh keeps its size-1 dims (the test's ``init_dist_env`` drops
them, which leaves 1-D stage meshes the model's two-entry placements cannot take on Paddle 3.3);
``config.context_parallel_degree = 1`` (the model reads it, the test's ``Config`` lacks it), and
on Paddle 3.0.0, which has no ring attention module, that module's one name the model imports
(see :func:`_without_context_parallel`).
``reference`` is the same model and data in one process, dygraph, the gradients of a step's
micro-batches averaged and clipped (unsplit training's semantics, pipesplit's).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

VENDOR = Path(__file__).resolve().parents[1] / "vendor" / "paddle_llama"
ACC, MICRO, STEPS, SEED = 4, 2, 3, 2024   # the test's acc_step and batch_size; steps run


def tokens(seq_len, vocab, samples):
    """Seeded random token ids and next-token labels (int64)."""
    rng = np.random.default_rng(SEED)
    data = rng.integers(0, vocab, (samples, seq_len + 1), dtype=np.int64)
    return data[:, :-1], data[:, 1:]


def _without_context_parallel():
    """The model imports ``shard_seq_load_balance`` from Paddle's ring attention (context
    parallelism, which it calls only at ``context_parallel_degree > 1``; the worker sets 1).
    Paddle 3.0.0 has no ``paddle.distributed.auto_parallel.ring_attention``: there the module
    is given with that one name, which raises if it is ever called."""
    import importlib.util
    import types

    name = "paddle.distributed.auto_parallel.ring_attention"
    if importlib.util.find_spec(name) is not None:
        return
    import paddle

    def shard_seq_load_balance(*args, **kwargs):
        raise NotImplementedError(f"context parallelism: Paddle {paddle.__version__} has no "
                                  f"{name}")

    module = types.ModuleType(name)
    module.shard_seq_load_balance = shard_seq_load_balance
    sys.modules[name] = module


def _load_test(dp, mp, pp):
    os.environ.update(dp=str(dp), mp=str(mp), pp=str(pp), acc_step=str(ACC))
    _without_context_parallel()
    sys.path.insert(0, str(VENDOR))
    import semi_auto_llama_vpp as test_module  # noqa: E402 (vendor/, unchanged)

    return test_module


def train(args) -> int:
    import paddle
    import paddle.distributed as dist
    from paddle.io import BatchSampler, DataLoader, Dataset

    from pipesplit.passes import cpu_support, strategy as pipesplit_strategy
    from pipesplit.passes.engine.session import engine_state

    pipesplit_strategy.enable_strategy()
    cpu_support.enable()
    T = _load_test(args.dp, args.mp, args.pp)

    class Test(T.TestLlamaAuto):
        def init_dist_env(self):
            shape = [self.dp, self.pp, self.mp]  # every dim kept (see the module's docstring)
            mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape),
                                    ["dp", "pp", "mp"])
            dist.auto_parallel.set_mesh(mesh)
            paddle.seed(1024)
            np.random.seed(1024)
            random.seed(1024)

    class RandomTokens(Dataset):
        def __init__(self, seq_len, vocab):
            self.inputs, self.labels = tokens(seq_len, vocab, STEPS * MICRO * ACC)

        def __getitem__(self, index):
            return self.inputs[index], self.labels[index]

        def __len__(self):
            return len(self.inputs)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for cfg in json.loads(Path(args.configs).read_text()):
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            test = Test()
            test.config.context_parallel_degree = 1
            # --- the test's run_llama(), the schedule swapped in
            strategy = T.apply_pass(use_vpp=cfg["vpp"] > 1)
            strategy.pipeline.schedule_mode = cfg["schedule"]
            strategy.pipeline.pp_degree = test.pp
            if cfg["vpp"] > 1:
                strategy.pipeline.vpp_degree = cfg["vpp"]
            model = T.LlamaForCausalLMAuto(test.config)
            criterion = T.LlamaPretrainingCriterionAuto(test.config)
            lr_scheduler = paddle.optimizer.lr.LinearWarmup(
                learning_rate=0.0001, warmup_steps=2, start_lr=0, end_lr=0.0001)
            optimizer = T.create_optimizer(model, lr_scheduler)
            dataset = RandomTokens(test.config.seq_length, test.config.vocab_size)
            sampler = BatchSampler(dataset, batch_size=MICRO, shuffle=False, drop_last=True)
            sampler._acc_steps = test.gradient_accumulation_steps
            loader = dist.shard_dataloader(
                dataloader=DataLoader(dataset, batch_sampler=sampler, num_workers=0),
                meshes=[T.get_mesh(0), T.get_mesh(1)], shard_dims="dp")
            started = time.monotonic()
            dist_model = dist.to_static(model, loader, criterion, optimizer, strategy=strategy)
            dist_model.train()
            built = time.monotonic()
            losses = []
            for step, (input_ids, labels) in enumerate(loader()):
                if step >= STEPS:
                    break
                loss = dist_model(input_ids, labels)
                lr_scheduler.step()
                losses.append(None if loss is None
                              else np.asarray(loss, np.float64).reshape(-1).tolist())
            state = engine_state(dist_model._engine)
            plan = state.modes["train"].pipeline
            record = {"tag": cfg["tag"], "rank": dist.get_rank(), "losses": losses,
                      "sent_on": _sent_on(plan.split.programs),
                      "build_s": built - started, "steps_s": time.monotonic() - built,
                      "gpu_plan": _nccl_comm(plan, state) if cfg.get("gpu_plan") else None}
            (out / f"{cfg['tag']}.rank{dist.get_rank()}.json").write_text(json.dumps(record))
            del dist_model
    return 0


def _nccl_comm(plan, state) -> dict:
    """The p2p ops (ring, peer, shape) of each comm job of the NCCL plan of this rank, built
    from the engine program the CPU plan was built from."""
    from pipesplit.passes.engine.engine_rank import build_engine_rank_plan
    from pipesplit.passes.transport.devices import transport_for

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
    from _structure import describe  # noqa: E402

    import paddle

    paddle.enable_static()  # (as inside the engine's pass; a step leaves dynamic mode on)
    try:
        nccl = build_engine_rank_plan(plan.source_program, plan.config, transport_for("gpu"),
                                      state.pipe, shared=state.shared_parameters)
    finally:
        paddle.disable_static()
    return {job_type: [op for op in describe(program)
                       if op["op"] in ("pd_op.send_v2", "pd_op.recv_v2")]
            for job_type, program in nccl.split.programs.items()
            if job_type.startswith(("send_", "recv_"))}


def _sent_on(programs) -> dict:
    """Per forward job of the plan: the values it hands to a send job (its p2p outputs)."""
    out = {}
    for job_type, program in programs.items():
        if not job_type.startswith("forward"):
            continue
        out[job_type] = [
            [op.attrs()["output_name"], str(op.operand_source(0).dtype).replace("paddle.", ""),
             [int(d) for d in op.operand_source(0).shape]]
            for op in program.global_block().ops
            if op.name() == "builtin.shadow_output"
            and op.attrs()["output_name"].startswith("pipesplit_p2p_send_forward")]
    return out


class _NoMeshes:
    """``paddle.distributed`` as the model module sees it in the reference: no meshes,
    ``shard_tensor`` / ``reshard`` give the tensor back."""

    def __init__(self, dist):
        self.Replicate, self.Shard = dist.Replicate, dist.Shard
        self.auto_parallel = self

    @staticmethod
    def get_mesh():
        class Mesh:
            dim_names, _shape = ["dp"], [1]
        return Mesh

    @staticmethod
    def shard_tensor(tensor, mesh, placements, **kwargs):
        return tensor

    @staticmethod
    def reshard(tensor, mesh, placements):
        return tensor


def reference(args) -> int:
    import paddle
    import paddle.distributed as dist

    T = _load_test(1, 1, 1)
    sys.modules["semi_auto_parallel_llama_model"].dist = _NoMeshes(dist)
    config = T.Config()
    config.recompute, config.sep_parallel_degree, config.context_parallel_degree = False, 1, 1
    paddle.seed(1024)
    np.random.seed(1024)
    random.seed(1024)
    model = T.LlamaForCausalLMAuto(config)
    criterion = T.LlamaPretrainingCriterionAuto(config)
    lr_scheduler = paddle.optimizer.lr.LinearWarmup(
        learning_rate=0.0001, warmup_steps=2, start_lr=0, end_lr=0.0001)
    optimizer = T.create_optimizer(model, lr_scheduler)
    inputs, labels = tokens(config.seq_length, config.vocab_size, STEPS * MICRO * ACC)
    losses = []
    for step in range(STEPS):
        per_micro_batch = []
        for k in range(ACC):
            rows = slice((step * ACC + k) * MICRO, (step * ACC + k + 1) * MICRO)
            loss = criterion(model(paddle.to_tensor(inputs[rows])), paddle.to_tensor(labels[rows]))
            (loss / ACC).backward()
            per_micro_batch.append(float(loss))
        optimizer.step()
        optimizer.clear_grad()
        lr_scheduler.step()
        losses.append(per_micro_batch)
    Path(args.out).write_text(json.dumps({"losses": losses}))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    for axis in ("dp", "mp", "pp"):
        t.add_argument(f"--{axis}", type=int, required=True)
    t.add_argument("configs")
    t.add_argument("out")
    r = sub.add_parser("reference")
    r.add_argument("out")
    args = parser.parse_args(argv)
    return train(args) if args.command == "train" else reference(args)


if __name__ == "__main__":
    sys.exit(main())

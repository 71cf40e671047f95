"""Train a small GPT-like dygraph model through Paddle's auto-parallel engine with a pipesplit
schedule, beside a one-process dygraph reference with the same micro-batches.

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir /tmp/pipesplit_log \
        examples/auto_parallel_pipeline.py --schedule ZBV --vpp 2 -m 4 --steps 2 --json out.json

The model is written as a Paddle user writes it: ``paddle.nn`` layers, each decoder block's
parameters on the process mesh of its pipeline stage (stages in model order, as Paddle's VPP
documentation places them), activations moved with ``dist.reshard``, and
``strategy.pipeline.vpp_seg_method`` naming the block class.  Only ``schedule_mode`` and
``vpp_degree`` change between schedules: with vpp > 1 the engine (Paddle's round-robin for
looped schedules) or pipesplit (V order for ZBV, ZBVPP, DualPipeV ...) assigns the blocks to
(rank, chunk).  ``--mesh-order schedule`` places them explicitly instead, with
``pipesplit.passes.engine.block_meshes``.  ``--paddle`` runs Paddle's own pass instead (FThenB, 1F1B,
VPP only).  On a CPU build, ``pipesplit.passes.cpu_support.enable()`` lets the engine start.
``--resume-at K`` saves every rank's state after K training steps (parameters, optimizer state,
LR scheduler), builds a fresh model, optimizer and ``dist.to_static`` as a new process would,
loads the state and trains on: the losses must equal the uninterrupted reference's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle import nn


class DecoderBlock(nn.Layer):
    """Pre-norm decoder block: causal self-attention and an MLP, both residual."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiHeadAttention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        seq = x.shape[1]
        causal = paddle.tril(paddle.ones([seq, seq], dtype="bool"))
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyGPT(nn.Layer):
    """Embedding, ``layers`` decoder blocks, final norm and LM head.

    ``block_mesh``: the process mesh of each block, from the schedule's placement
    (``pipesplit.passes.engine.block_meshes``); the embedding goes with the first block, the
    final norm and head with the last.  ``None`` builds the plain one-process model (the
    reference)."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, seq: int,
                 block_mesh=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.LayerList([DecoderBlock(hidden, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)
        self.block_mesh = block_mesh
        if block_mesh is not None:
            self._place(self.embed, block_mesh[0])
            self._place(self.pos, block_mesh[0])
            for block, mesh in zip(self.blocks, block_mesh):
                self._place(block, mesh)
            self._place(self.norm, block_mesh[-1])
            self._place(self.head, block_mesh[-1])

    @staticmethod
    def _place(layer, mesh):
        for name, param in list(layer.named_parameters(include_sublayers=False)):
            setattr(layer, name, dist.shard_tensor(param, mesh, [dist.Replicate()],
                                                   stop_gradient=False))
        for sub in layer.children():
            TinyGPT._place(sub, mesh)

    def forward(self, ids):
        positions = paddle.arange(ids.shape[1], dtype="int64").unsqueeze(0)
        x = self.embed(ids) + self.pos(positions)
        for i, block in enumerate(self.blocks):
            if self.block_mesh is not None and i > 0 and self.block_mesh[i] != self.block_mesh[i - 1]:
                x = dist.reshard(x, self.block_mesh[i], [dist.Replicate()])
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits, labels):
    return F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), labels.reshape([-1, 1]))


def masked_lm_loss(logits, labels):
    """The mean over the tokens that carry a loss, written as PaddleNLP's DeepSeek-V3 criterion
    writes it: a Python ``if`` on a tensor, which ``dist.to_static`` turns into control flow
    in the program (a ``pd_op.if`` and its backward)."""
    token_loss = F.cross_entropy(logits.reshape([-1, logits.shape[-1]]),
                                 labels.reshape([-1, 1]), reduction="none")
    counted = paddle.where(token_loss > 0, paddle.ones_like(token_loss),
                           paddle.zeros_like(token_loss))
    count = paddle.sum(counted)
    if count == 0:
        loss = paddle.sum(token_loss * counted)
    else:
        loss = paddle.sum(token_loss * counted) / count
    return loss


LOSSES = {"mean": lm_loss, "masked": masked_lm_loss}


def control_flow_ops(dist_model) -> int:
    """The control-flow ops (``if``, ``while``) of this rank's training program."""
    program = dist_model.dist_main_program("train")
    return sum(1 for op in program.global_block().ops if op.num_regions() > 0)


class TokenData(paddle.io.Dataset):
    """Random token sequences (seeded) and their next-token labels."""

    def __init__(self, samples: int, seq: int, vocab: int, seed: int):
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, vocab, size=(samples, seq + 1), dtype=np.int64)
        self.inputs, self.labels = tokens[:, :-1], tokens[:, 1:]

    def __getitem__(self, i):
        return self.inputs[i], self.labels[i]

    def __len__(self):
        return len(self.inputs)


def make_optimizer(args, parameters):
    lr = args.lr
    if args.lr_schedule == "step":
        lr = paddle.optimizer.lr.StepDecay(learning_rate=args.lr, step_size=1, gamma=0.5)
    clip = None
    if args.clip_global_norm:
        clip = paddle.nn.ClipGradByGlobalNorm(args.clip_global_norm)
    elif args.clip_by_norm:
        clip = paddle.nn.ClipGradByNorm(args.clip_by_norm)
    elif args.clip_by_value:
        clip = paddle.nn.ClipGradByValue(args.clip_by_value)
    if args.optimizer == "adamw":
        return paddle.optimizer.AdamW(learning_rate=lr, parameters=parameters,
                                      weight_decay=0.01, epsilon=args.adam_epsilon,
                                      grad_clip=clip)
    return paddle.optimizer.SGD(learning_rate=lr, parameters=parameters, grad_clip=clip)


def build(args, block_mesh=None):
    paddle.seed(args.seed)  # identical initial parameters on every rank and in the reference
    return TinyGPT(args.vocab, args.hidden, args.heads, args.layers, args.seq, block_mesh)


def reference(args):
    """The same model run in one process in dygraph with the same micro-batches, phase by phase
    (``--modes``): per-micro-batch losses of the training steps, of evaluation and the
    predicted logits, and the final parameters by structured name."""
    model = build(args)
    opt = make_optimizer(args, model.parameters())
    data = TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
    out = {"losses": [], "eval_losses": [], "predictions": []}
    for mode in args.modes:
        for step in range(args.steps if mode != "predict" else 1):
            sl = slice(step * args.batch, (step + 1) * args.batch)
            x, y = paddle.to_tensor(data.inputs[sl]), paddle.to_tensor(data.labels[sl])
            if mode == "predict":
                model.eval()
                with paddle.no_grad():
                    out["predictions"].append(model(x).numpy())
                continue
            model.train() if mode == "train" else model.eval()
            per_mb = []
            for xm, ym in zip(paddle.split(x, args.m), paddle.split(y, args.m)):
                if mode == "eval":
                    with paddle.no_grad():
                        per_mb.append(float(LOSSES[args.loss](model(xm), ym)))
                    continue
                loss = LOSSES[args.loss](model(xm), ym)
                (loss / args.m).backward()
                per_mb.append(float(loss))
            if mode == "train":
                opt.step()
                opt.clear_grad()
                if isinstance(opt._learning_rate, paddle.optimizer.lr.LRScheduler):
                    opt._learning_rate.step()
            out["losses" if mode == "train" else "eval_losses"].append(per_mb)
    return out, {k: v.numpy() for k, v in model.state_dict().items()}


def run_modes(args, dist_model, dist_loader, opt, resume=None):
    """``--modes`` through the engine: train / eval steps over the data, predict on the first
    batch; returns what this rank got (None where it holds no loss / output), the largest
    parameter change any evaluation or prediction made here (must be 0) and the DistModel
    trained last.  ``resume(dist_model, opt) -> (dist_model, opt)`` replaces them after
    ``--resume-at`` training steps."""
    out = {"losses": [], "eval_losses": [], "predictions": []}
    eval_change = 0.0
    trained = 0
    for mode in args.modes:
        getattr(dist_model, mode)()  # train() / eval() / predict()
        before = {k: v for k, v in local_parameters(dist_model).items()}
        for step, (x, y) in enumerate(dist_loader()):
            if mode == "predict":
                if step == 0:
                    got = dist_model(x)
                    if got is not None:
                        out["predictions"].append(np.concatenate(
                            [np.asarray(g) for g in got]) if isinstance(got, list)
                            else np.asarray(got))
                continue
            loss = dist_model(x, y)
            if loss is not None:
                out["losses" if mode == "train" else "eval_losses"].append(
                    np.asarray(loss, np.float64).reshape(-1).tolist())
            if mode == "train" and isinstance(opt._learning_rate,
                                              paddle.optimizer.lr.LRScheduler):
                opt._learning_rate.step()
            if mode == "train":
                trained += 1
                if resume is not None and trained == args.resume_at:
                    dist_model, opt = resume(dist_model, opt)
        if mode != "train":
            after = local_parameters(dist_model)
            eval_change = max([eval_change] + [float(np.max(np.abs(after[k] - v)))
                                               for k, v in before.items()])
    return out, eval_change, dist_model


def save_checkpoint(dist_model, opt, path, mode="all"):
    """This rank's part of ``dist_model.state_dict(mode)`` ("all": parameters and optimizer
    state; "param": parameters only) and the LR scheduler's state, with ``paddle.save``."""
    state = {name: value._local_value() for name, value in dist_model.state_dict(mode).items()
             if value._local_value()._is_initialized()}  # other ranks' tensors hold no data
    sched = opt._learning_rate
    paddle.save({"state": state, "lr_scheduler": sched.state_dict() if isinstance(
        sched, paddle.optimizer.lr.LRScheduler) else None}, path)


def load_checkpoint(dist_model, opt, path, mode="all"):
    """Loads what ``save_checkpoint`` wrote on this rank into a fresh ``dist_model`` (every
    tensor this rank holds in ``state_dict(mode)``, none left out) and its LR scheduler."""
    dist_model.train()  # builds the train program and initializes it (the startup program)
    saved = paddle.load(path)
    current = dist_model.state_dict(mode)
    held = {name for name, value in current.items() if value._local_value()._is_initialized()}
    if set(saved["state"]) != held:
        raise ValueError(f"{path}: saved {sorted(set(saved['state']) - held)} not held here, "
                         f"{sorted(held - set(saved['state']))} held here not saved")
    for name, value in saved["state"].items():
        paddle.assign(value, current[name]._local_value())
    dist_model.set_state_dict({name: current[name] for name in saved["state"]})
    if saved["lr_scheduler"] is not None:
        opt._learning_rate.set_state_dict(saved["lr_scheduler"])


@contextlib.contextmanager
def new_process():
    """What a new process starts with: unused names and an empty scope (--resume-at finds the
    saved names again).  Dygraph mode keeps the static graph's name generator aside (each
    ``paddle.disable_static()`` enters a fresh one; the engine adds the optimizer's state after
    ``paddle.enable_static()``), so both are renewed."""
    paddle.enable_static()
    try:
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            paddle.disable_static()
            try:
                yield
            finally:
                paddle.enable_static()
    finally:
        paddle.disable_static()


def make_strategy(args):
    strategy = dist.Strategy()
    pipeline = strategy.pipeline
    pipeline.enable = True
    pipeline.schedule_mode = args.schedule
    pipeline.pp_degree = dist.get_world_size()
    pipeline.vpp_degree = args.vpp
    pipeline.vpp_seg_method = "DecoderBlock"
    pipeline.accumulate_steps = args.m
    pipeline.micro_batch_size = args.batch // args.m
    pipeline.split_backward = args.split_backward
    from pipesplit.passes import strategy as pipesplit_strategy
    if args.costs and not args.paddle:  # auto searches with these, and measures nothing
        pipesplit_strategy.use_costs(strategy, args.costs)
    if args.memory_budget and not args.paddle:  # auto stays within it on every rank
        pipesplit_strategy.use_memory_budget(strategy, args.memory_budget)
    return strategy


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--schedule", default="ZBV", help="any pipesplit schedule name or alias")
    p.add_argument("--vpp", type=int, default=None,
                   help="chunks per rank (default: what the schedule needs, else 1)")
    p.add_argument("-m", type=int, default=4, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--layers", type=int, default=4, help="decoder blocks")
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-schedule", choices=("constant", "step"), default="constant")
    clip = p.add_mutually_exclusive_group()
    clip.add_argument("--clip-global-norm", type=float, default=None,
                      help="paddle.nn.ClipGradByGlobalNorm threshold")
    clip.add_argument("--clip-by-norm", type=float, default=None,
                      help="paddle.nn.ClipGradByNorm threshold")
    clip.add_argument("--clip-by-value", type=float, default=None,
                      help="paddle.nn.ClipGradByValue bound")
    p.add_argument("--split-backward", action="store_true")
    p.add_argument("--loss", choices=sorted(LOSSES), default="mean",
                   help="mean: cross entropy; masked: the mean over tokens with a loss, with "
                        "DeepSeek-V3's `if count == 0` (control flow in the program)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--paddle", action="store_true",
                   help="use Paddle's own pipeline pass (FThenB, 1F1B, VPP) instead of pipesplit")
    p.add_argument("--mesh-order", default="model",
                   help="'model': blocks on the stage meshes in model order (the engine and "
                        "pipesplit re-place them by the schedule's placement); 'schedule': "
                        "placed by pipesplit.passes.engine.block_meshes for the schedule; or a "
                        "schedule name: placed for that one (another placement than the "
                        "schedule's shows the mismatch error)")
    p.add_argument("--loader", choices=("plain", "sharded"), default="plain",
                   help="plain: a paddle.io.DataLoader (every rank fed the whole batch); "
                        "sharded: dist.shard_dataloader(meshes=[first, last]) as Paddle's docs")
    p.add_argument("--modes", default="train",
                   help="comma-separated phases, each over the data: train, eval (losses, no "
                        "update), predict (outputs of the first batch); e.g. train,eval,train")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                   help="adamw: paddle.optimizer.AdamW, weight decay 0.01")
    p.add_argument("--adam-epsilon", type=float, default=1e-8,
                   help="AdamW's epsilon.  Attention's key bias has a zero gradient (softmax "
                        "ignores a shift), so its gradient is rounding noise that AdamW "
                        "scales up to a step of about lr where epsilon is small: schedules that "
                        "split B / W round differently from the reference there")
    p.add_argument("--resume-at", type=int, default=None, metavar="K",
                   help="after K training steps save every rank's state, build a fresh model, "
                        "optimizer and DistModel, load the state and train on")
    p.add_argument("--resume-load", choices=("all", "param"), default="all",
                   help="what --resume-at saves and loads: 'all' (parameters and optimizer "
                        "state) or 'param' (parameters only: the optimizer starts afresh)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where each rank writes rank<r>.pdparams for --resume-at (default: a "
                        "temporary directory per rank, removed after loading)")
    p.add_argument("--costs", metavar="FILE",
                   help="measured job costs for the schedule (what `pipesplit profile --json` "
                        "writes); without it auto measures step 1 and re-plans once")
    p.add_argument("--memory-budget", metavar="BYTES",
                   help="auto / autoV: the most allocated bytes per process, e.g. 48MB (step 1 "
                        "measures each rank's bytes; the re-plan searches only plans that fit)")
    p.add_argument("--json", help="write losses, reference_losses and max_param_diff here")
    p.add_argument("--tag", default="run", help="names this run's keys in the launcher's store")
    args = p.parse_args(argv)
    if args.vpp is None:
        from pipesplit.job_list.registry import get_spec
        args.vpp = 2 if get_spec(args.schedule).placement == "v" else 1
    args.batch = args.m * args.micro_batch_size
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = sorted(set(args.modes) - {"train", "eval", "predict"})
    if bad or not args.modes:
        p.error(f"--modes: phases are train, eval and predict, got {args.modes}")
    if args.resume_at is not None and not 0 < args.resume_at < args.steps * args.modes.count(
            "train"):
        p.error(f"--resume-at must lie between 1 and the training steps - 1, got {args.resume_at}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # no dist.init_parallel_env(): as in Paddle's own scripts, dist.to_static creates the group
    rank, world = dist.get_rank(), dist.get_world_size()
    from pipesplit.passes import strategy as pipesplit_strategy
    if args.paddle:
        pipesplit_strategy.disable_strategy()  # (a no-op unless enabled before)
    else:
        pipesplit_strategy.enable_strategy()
    from pipesplit.passes import cpu_support
    cpu_support.enable()  # does nothing on a CUDA build

    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
    from pipesplit.passes.engine import block_meshes  # noqa: F401 (--mesh-order)
    if args.mesh_order == "model":  # stages in model order, as Paddle's VPP documentation
        block_mesh = [meshes[i * world // args.layers] for i in range(args.layers)]
    else:  # already the placement of a schedule
        block_mesh = block_meshes(meshes, args.layers,
                                  args.schedule if args.mesh_order == "schedule"
                                  else args.mesh_order, args.vpp)
    fresh = contextlib.ExitStack()  # --resume-at: each model built as in a new process
    if args.resume_at:
        fresh.enter_context(new_process())
    model = build(args, block_mesh)
    opt = make_optimizer(args, model.parameters())
    data = TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
    loader = paddle.io.DataLoader(data, batch_size=args.batch, shuffle=False)
    if args.loader == "sharded":  # inputs on the first stage's mesh, labels on the last's
        dist_loader = dist.shard_dataloader(loader, meshes=[meshes[0], meshes[-1]])
    else:  # every rank is fed the whole batch; each data op goes with its first reader
        dist_loader = loader
    dist_model = dist.to_static(model, dist_loader, LOSSES[args.loss], opt,
                                make_strategy(args))

    def resume(old_model, old_opt):
        """--resume-at: save this rank's state, then what a new process does: build the model,
        optimizer and DistModel afresh (fresh names and scope) and load the state."""
        ckpt_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="pipesplit_ckpt_")
        os.makedirs(ckpt_dir, exist_ok=True)
        path = os.path.join(ckpt_dir, f"rank{rank}.pdparams")
        try:
            save_checkpoint(old_model, old_opt, path, args.resume_load)
            fresh.enter_context(new_process())
            new_layer = build(args, block_mesh)
            new_opt = make_optimizer(args, new_layer.parameters())
            new_model = dist.to_static(new_layer, dist_loader, LOSSES[args.loss], new_opt,
                                       make_strategy(args))
            load_checkpoint(new_model, new_opt, path, args.resume_load)
        finally:
            if not args.checkpoint_dir:
                shutil.rmtree(ckpt_dir)
        return new_model, new_opt

    with fresh:  # the models' names and scopes
        got, eval_change, dist_model = run_modes(args, dist_model, dist_loader, opt,
                                                 resume if args.resume_at else None)
        params = local_parameters(dist_model)
    ref, ref_params = reference(args)
    diffs = [float(np.max(np.abs(local - ref_params[name])))
             for name, local in params.items()
             if name in ref_params]  # (a scheduler's learning rate is listed too)
    predict_diff = max([float(np.max(np.abs(p - r)))
                        for p, r in zip(got["predictions"], ref["predictions"])], default=None)
    holds_loss = bool(got["losses"] or got["eval_losses"])
    mine = {"rank": rank, "max_param_diff": max(diffs, default=0.0), "num_params": len(diffs),
            "losses": {k: got[k] for k in ("losses", "eval_losses")} if holds_loss else None,
            "eval_param_change": eval_change, "predict_diff": predict_diff,
            "replanned": None if args.paddle else replan_record(dist_model),
            "control_flow_ops": control_flow_ops(dist_model)}
    everyone = exchange(rank, world, mine, key=f"{args.tag}/result")
    holder = next(r for r in everyone if r["losses"] is not None)
    if rank == holder["rank"]:
        ours = holder["losses"]["losses"] + holder["losses"]["eval_losses"]
        theirs = ref["losses"] + ref["eval_losses"]
        predicted = [r["predict_diff"] for r in everyone if r["predict_diff"] is not None]
        record = {"schedule": args.schedule, "pp": world, "vpp": args.vpp, "m": args.m,
                  "modes": args.modes, "optimizer": args.optimizer,
                  "resume_at": args.resume_at, "resume_load": args.resume_load,
                  "losses": holder["losses"]["losses"], "reference_losses": ref["losses"],
                  "eval_losses": holder["losses"]["eval_losses"],
                  "reference_eval_losses": ref["eval_losses"],
                  "predict_max_diff": max(predicted) if predicted else None,
                  "eval_param_change": max(r["eval_param_change"] for r in everyone),
                  "max_param_diff": max(r["max_param_diff"] for r in everyone),
                  "replanned": [r["replanned"] for r in everyone],
                  "params_compared": sum(r["num_params"] for r in everyone),
                  "control_flow_ops": sum(r["control_flow_ops"] for r in everyone),
                  "max_loss_diff": max(abs(a - b) for o, t in zip(ours, theirs)
                                       for a, b in zip(o, t))}
        print(f"{args.schedule} pp={world} vpp={args.vpp} m={args.m}: max |loss - reference| "
              f"{record['max_loss_diff']:.2e}, max |param - reference| "
              f"{record['max_param_diff']:.2e} over {record['params_compared']} parameters",
              flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
    # rank 0 hosts the store: keep it until all are done
    exchange(rank, world, {}, key=f"{args.tag}/done")
    return 0


def replan_record(dist_model):
    """This rank's re-plan (``auto`` re-plans once with the costs it measured), or None."""
    from pipesplit.passes import strategy as pipesplit_strategy

    done = pipesplit_strategy.replanned(dist_model)
    if done is None:
        return None
    return {"step": done.step, "costs": done.costs.to_dict(), "memory": done.memory,
            "before": done.before.schedule.options.get("source", done.before.schedule.name),
            "after": done.after.schedule.options.get("source", done.after.schedule.name),
            "before_order": [list(j) for j in done.before.job_order],
            "after_order": [list(j) for j in done.after.job_order]}


def local_parameters(dist_model):
    """This rank's parameters (structured name -> array); other ranks' hold no data here."""
    out = {}
    for name, value in dist_model.state_dict("param").items():
        local = value._local_value() if value.is_dist() else value
        if local._is_initialized():
            out[name] = local.numpy()
    return out


def exchange(rank, world, payload, key="result"):
    """Every rank's ``payload``, through the launcher's TCP store."""
    store = paddle.base.core.create_or_get_global_tcp_store()
    store.set(f"example/{key}/{rank}", json.dumps(payload).encode())
    return [json.loads(bytes(store.get(f"example/{key}/{r}")).decode()) for r in range(world)]


if __name__ == "__main__":
    sys.exit(main())

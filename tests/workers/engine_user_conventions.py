"""A training script written the way Paddle's own auto-parallel tests and docs write one
(``test/auto_parallel/hybrid_strategy/semi_auto_llama_vpp.py``, ``pir/mlp_demo.py``), run for
several configurations in ONE launch (starting Paddle costs seconds):

    python -m paddle.distributed.launch --nproc_per_node 2 engine_user_conventions.py \
        CONFIGS.json OUT_DIR

CONFIGS.json is a list of dicts (the keys of :data:`DEFAULTS`); every rank writes
``OUT_DIR/<tag>/rank<r>.json``: the losses it got, its one-process reference's and the largest
parameter difference.  :func:`train` is the user's script; what it does is Paddle's convention,
each named in a comment (``convention: ...``).  The only pipesplit lines are the two a user adds:
``enable_strategy()`` and ``cpu_support.enable()``.  Nothing here creates the global group
(no ``dist.init_parallel_env()``, no ``fleet.init``): under the launcher ``dist.to_static``
must do that, as it does for Paddle's tests.
"""
from __future__ import annotations

import json
import math
import sys
from functools import reduce
from pathlib import Path

import numpy as np

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle import nn
from paddle.io import BatchSampler, DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from llama_auto_parallel import reference_slice  # noqa: E402 (the check, not the script)

DEFAULTS = {
    "tag": "run", "schedule": "1F1B", "vpp": 1, "dp": 1, "pp": 2, "mp": 1,
    "layers": 4,                  # decoder layers, placed on the stage meshes in model order
    "layers_per_stage": None,     # e.g. [3, 4]: uneven (Paddle keeps them; None = even)
    "micro": 2, "acc": 4, "steps": 3,
    "loader": "sampler",          # sampler: BatchSampler + _acc_steps + shard_dataloader;
                                  # plain: paddle.io.DataLoader(batch_size=micro * acc)
    "filtered_mesh": False,       # drop size-1 mesh dims, as Paddle's Llama test does
    "pp_degree_unset": False,     # leave strategy.pipeline.pp_degree at its default 1
    "gradient_merge": None,       # strategy.gradient_merge.enable beside the pipeline, with
                                  # k_steps = acc ("acc", mlp_demo) or left alone ("default")
    "toggle_modes": False,        # train() / eval() before the first step and between steps
    "sequence_parallel": False,   # activations cut along the sequence over mp (Llama's sp)
    "expect_error": None,         # a refusal expected before training: its message's start
    "tie": False,                 # the head multiplies by the embedding's weight, resharded
                                  # onto the last stage's mesh (a tied embedding)
    "memory_budget": None,        # auto: use_memory_budget(strategy, this), the one more
                                  # pipesplit line such a user adds
    "labels_stage": None,         # the stage mesh the loader feeds the labels on (None: the
                                  # last; Paddle's Llama test: get_mesh(1), whatever the pp)
    "inputs_stage": 0,            # the stage mesh the loader feeds the inputs on
    "lazy": False,                # the model made under paddle.LazyGuard(), then each
                                  # parameter initialized (PaddleNLP's pretraining script)
    "extra_samples": 0,           # samples past the last full batch: a short last batch that
                                  # the loop, stopping at `steps` (max_steps), never draws
    "strategy": {},               # more strategy fields as a user sets them: {"section.field":
                                  # value} (the knobs of docs/engine.md)
    "hidden": 16, "heads": 2, "vocab": 32, "seq": 8, "lr": 1e-3, "clip": 1.0, "seed": 2024,
}


# -- meshes: one global mesh, stage meshes cut from it (convention) -----------------------

def make_global_mesh(cfg):
    """``ProcessMesh(arange(dp*pp*mp).reshape(dp, pp, mp), ["dp", "pp", "mp"])``; with
    ``filtered_mesh`` the size-1 dims are dropped (Paddle's ``init_dist_env``), so a stage
    mesh is 1-D (``["pp"]`` of one process at pp2, ``["dp"]`` at dp2 x pp2)."""
    dims = [("dp", cfg["dp"]), ("pp", cfg["pp"]), ("mp", cfg["mp"])]
    if cfg["filtered_mesh"]:
        dims = [d for d in dims if d[1] > 1] or [("dp", 1)]
    shape = [n for _, n in dims]
    ids = np.arange(reduce(lambda a, b: a * b, shape, 1)).reshape(shape)
    return dist.ProcessMesh(ids.tolist(), [name for name, _ in dims])


def get_mesh(stage):
    """Stage ``stage``'s mesh: ``global_mesh.get_mesh_with_dim("pp", stage)`` (convention)."""
    mesh = dist.auto_parallel.get_mesh()
    return mesh.get_mesh_with_dim("pp", stage % mesh.get_dim_size("pp"))


def placements(mesh, dp=None, mp=None):
    """One placement per dim of ``mesh``: ``Shard(dp)`` on "dp", ``Shard(mp)`` on "mp",
    ``Replicate()`` elsewhere (so the same code serves 2-D and 1-D stage meshes)."""
    shard = {"dp": dp, "mp": mp}
    return [dist.Shard(shard[n]) if shard.get(n) is not None else dist.Replicate()
            for n in mesh.dim_names]


# -- the model: paddle.nn layers, parameters placed with dist.shard_tensor -----------------

def place(param, stage, mp=None):
    if stage is None:  # the one-process reference
        return param
    mesh = get_mesh(stage)
    return dist.shard_tensor(param, mesh, placements(mesh, mp=mp))


class RMSNorm(nn.Layer):
    def __init__(self, hidden, stage):
        super().__init__()
        self.weight = place(self.create_parameter(
            [hidden], default_initializer=nn.initializer.Constant(1.0)), stage)

    def forward(self, x):
        return paddle.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x * self.weight


class DecoderLayer(nn.Layer):
    """Attention (q, k, v column-parallel, o row-parallel) and a SwiGLU MLP, pre-norm."""

    def __init__(self, cfg, stage):
        super().__init__()
        h = cfg["hidden"]
        self.stage, self.heads = stage, cfg["heads"]
        self.sequence_parallel = cfg["sequence_parallel"] and stage is not None
        self.norm1, self.norm2 = RMSNorm(h, stage), RMSNorm(h, stage)
        for name, shape, mp in (("q", [h, h], 1), ("k", [h, h], 1), ("v", [h, h], 1),
                                ("o", [h, h], 0), ("gate", [h, 2 * h], 1),
                                ("up", [h, 2 * h], 1), ("down", [2 * h, h], 0)):
            setattr(self, name, place(self.create_parameter(shape), stage, mp))

    def forward(self, x, mask):
        b, s, h = x.shape
        d = h // self.heads
        y = self.norm1(x)
        q, k, v = ((y @ w).reshape([b, s, self.heads, d]).transpose([0, 2, 1, 3])
                   for w in (self.q, self.k, self.v))
        probs = F.softmax(q @ k.transpose([0, 1, 3, 2]) / math.sqrt(d) + mask, axis=-1)
        attn = (probs @ v).transpose([0, 2, 1, 3]).reshape([b, s, h]) @ self.o
        if self.sequence_parallel:  # the row-parallel output reduce-scattered along the sequence
            mesh = get_mesh(self.stage)
            attn = dist.reshard(attn, mesh, placements(mesh, dp=0, mp=1))
            attn = dist.reshard(attn, mesh, placements(mesh, dp=0))
        x = x + attn
        y = self.norm2(x)
        return x + (F.silu(y @ self.gate) * (y @ self.up)) @ self.down


def stage_of_layers(cfg):
    """Each decoder layer's stage, in model order; uneven with ``layers_per_stage``."""
    counts = cfg["layers_per_stage"] or [cfg["layers"] // cfg["pp"]] * cfg["pp"]
    return [stage for stage, n in enumerate(counts) for _ in range(n)]


class TinyLlama(nn.Layer):
    def __init__(self, cfg, distributed):
        super().__init__()
        stages = stage_of_layers(cfg)
        first, last = (0, cfg["pp"] - 1) if distributed else (None, None)
        self.distributed = distributed
        self.embed = nn.Embedding(cfg["vocab"], cfg["hidden"])
        # (a tied weight stays whole over mp: Paddle's matmul grad cannot take it transposed
        # and split along the hidden size)
        self.embed.weight = place(self.embed.weight, first, mp=None if cfg["tie"] else 1)
        self.layers = nn.LayerList([DecoderLayer(cfg, s if distributed else None)
                                    for s in stages])
        self.norm = RMSNorm(cfg["hidden"], last)
        self.tie, self.last = cfg["tie"], last
        if not self.tie:
            self.head = place(self.create_parameter([cfg["hidden"], cfg["vocab"]]), last, mp=1)

    def forward(self, ids):
        if self.distributed and ids.is_dist() and ids.process_mesh != get_mesh(0):
            # (ids fed on another stage's mesh: the user moves them to the embedding's)
            ids = dist.reshard(ids, get_mesh(0), placements(get_mesh(0), dp=0))
        x = self.embed(ids)
        s = ids.shape[1]
        mask = paddle.triu(paddle.full([s, s], -1e4, "float32"), diagonal=1)[None, None]
        if self.distributed:
            # convention: the mask is made on the global mesh (pp first) and resharded onto
            # every layer's stage mesh outside the layer; activations resharded between stages
            world = dist.auto_parallel.get_mesh().get_mesh_with_dim("pp")
            mask = dist.shard_tensor(mask, world, [dist.Replicate()] * world.ndim)
            x = dist.reshard(x, get_mesh(0), placements(get_mesh(0), dp=0))
        for i, layer in enumerate(self.layers):
            layer_mask = mask
            if self.distributed:
                mesh = get_mesh(layer.stage)
                layer_mask = dist.reshard(mask, mesh, placements(mesh))
                if i and layer.stage != self.layers[i - 1].stage:
                    x = dist.reshard(x, mesh, placements(mesh, dp=0))
            x = layer(x, layer_mask)
        if not self.tie:
            return self.norm(x) @ self.head
        weight = self.embed.weight
        if self.distributed:  # convention: the other stage's weight resharded onto this mesh
            mesh = get_mesh(self.last)
            weight = dist.reshard(weight, mesh, placements(mesh))
        return paddle.matmul(self.norm(x), weight, transpose_y=True)


class Criterion(nn.Layer):
    """The loss as a separate layer (convention), with its own reshard of logits and labels."""

    def __init__(self, cfg, distributed):
        super().__init__()
        self.cfg, self.distributed = cfg, distributed

    def forward(self, logits, labels):
        if self.distributed:
            mesh = get_mesh(self.cfg["pp"] - 1)
            logits = dist.reshard(logits, mesh, placements(mesh, dp=0))
            if labels.is_dist():  # (a plain DataLoader feeds dense labels to every rank)
                labels = dist.reshard(labels, mesh, placements(mesh, dp=0))
        return F.cross_entropy(logits.reshape([-1, self.cfg["vocab"]]), labels.reshape([-1, 1]))


class RandomTokens(Dataset):
    def __init__(self, cfg, samples):
        rng = np.random.default_rng(cfg["seed"])
        tokens = rng.integers(0, cfg["vocab"], (samples, cfg["seq"] + 1), dtype=np.int64)
        self.inputs, self.labels = tokens[:, :-1], tokens[:, 1:]

    def __getitem__(self, i):
        return self.inputs[i], self.labels[i]

    def __len__(self):
        return len(self.inputs)


def make_optimizer(cfg, model):
    # convention: LinearWarmup stepped by hand after each step, AdamW, global-norm clipping
    lr = paddle.optimizer.lr.LinearWarmup(learning_rate=cfg["lr"], warmup_steps=2,
                                          start_lr=0.0, end_lr=cfg["lr"])
    return lr, paddle.optimizer.AdamW(learning_rate=lr, parameters=model.parameters(),
                                      weight_decay=0.01,
                                      grad_clip=paddle.nn.ClipGradByGlobalNorm(cfg["clip"]))


def make_strategy(cfg):
    strategy = dist.Strategy()
    pipeline = strategy.pipeline
    pipeline.enable = True
    pipeline.schedule_mode = cfg["schedule"]
    if not cfg["pp_degree_unset"]:  # convention (mlp_demo): often left at 1
        pipeline.pp_degree = cfg["pp"]
    pipeline.vpp_degree = cfg["vpp"]
    pipeline.vpp_seg_method = "DecoderLayer"
    pipeline.accumulate_steps = cfg["acc"]
    pipeline.micro_batch_size = cfg["micro"]
    if cfg["gradient_merge"]:  # convention (mlp_demo): the merge beside the pipeline
        strategy.gradient_merge.enable = True
        strategy.gradient_merge.avg = True
        if cfg["gradient_merge"] == "acc":
            strategy.gradient_merge.k_steps = cfg["acc"]
    if cfg["memory_budget"]:
        from pipesplit.passes import strategy as pipesplit_strategy
        pipesplit_strategy.use_memory_budget(strategy, cfg["memory_budget"])
    for path, value in cfg["strategy"].items():
        section, field = path.split(".")
        setattr(getattr(strategy, section), field, value)
    return strategy


def train(cfg):
    """The user's script.  Returns this rank's losses (one list per step, or None where the
    rank holds no loss) and eval losses, and the DistModel."""
    from pipesplit.passes import cpu_support, strategy as pipesplit_strategy

    pipesplit_strategy.enable_strategy()
    cpu_support.enable()
    dist.auto_parallel.set_mesh(make_global_mesh(cfg))
    paddle.seed(cfg["seed"])
    if cfg["lazy"]:
        # convention (PaddleNLP's run_pretrain_auto.py): built under LazyGuard, then each
        # parameter initialized (another stage's keeps its shape and no bytes)
        with paddle.LazyGuard():
            model, criterion = TinyLlama(cfg, True), Criterion(cfg, True)
        for param in model.parameters():
            param.initialize()
        _same_start_as_the_reference(cfg, model)
    else:
        model, criterion = TinyLlama(cfg, True), Criterion(cfg, True)
    lr_scheduler, optimizer = make_optimizer(cfg, model)
    dataset = RandomTokens(cfg, cfg["steps"] * cfg["micro"] * cfg["acc"] + cfg["extra_samples"])
    labels_stage = cfg["pp"] - 1 if cfg["labels_stage"] is None else cfg["labels_stage"]
    if cfg["loader"] == "sampler":
        # convention: a sampler of micro-batches, _acc_steps of them per batch; the loader
        # sharded over dp onto the first and the labels' stage mesh (a mesh without a "dp"
        # dim, filtered at dp 1, has nothing to shard over); the last batch kept whole or not
        # (PaddleNLP's trainer: drop_last False, stopping at max_steps)
        sampler = BatchSampler(dataset, batch_size=cfg["micro"], shuffle=False,
                               drop_last=not cfg["extra_samples"])
        sampler._acc_steps = cfg["acc"]
        has_dp = "dp" in dist.auto_parallel.get_mesh().dim_names
        loader = dist.shard_dataloader(
            DataLoader(dataset, batch_sampler=sampler, num_workers=0),
            meshes=[get_mesh(cfg["inputs_stage"]), get_mesh(labels_stage)],
            shard_dims="dp" if has_dp else None)
    else:  # convention: a plain DataLoader of whole batches, fed to every rank
        loader = DataLoader(dataset, batch_size=cfg["micro"] * cfg["acc"], shuffle=False)
    dist_model = dist.to_static(model, loader, criterion, optimizer,
                                strategy=make_strategy(cfg))
    if cfg["toggle_modes"]:
        dist_model.eval()
    dist_model.train()
    losses, eval_losses = [], []
    for step, (input_ids, labels) in enumerate(loader()):
        if step == cfg["steps"]:  # convention: the trainer's max_steps
            break
        if cfg["toggle_modes"] and step == 1:  # evaluate between two training steps
            dist_model.eval()
            got = dist_model(input_ids, labels)
            eval_losses.append(None if got is None else float(np.average(got)))
            dist_model.train()
        loss = dist_model(input_ids, labels)
        lr_scheduler.step()
        # convention: the loss is read as np.average(loss) where the rank holds it
        losses.append(None if loss is None else
                      [float(np.average(loss))] + np.asarray(loss, np.float64).ravel().tolist())
    return losses, eval_losses, dist_model


def _same_start_as_the_reference(cfg, model):
    """(For the comparison only, as PaddleNLP's peer shim's PNLP_SAME_INIT.)  Lazy
    initialization draws each stage's parameters from an RNG state named after its mesh, so
    the weights differ from the eager reference's: give each rank's parameters the
    reference's starting values; another stage's, with no bytes here, stay as they are."""
    paddle.seed(cfg["seed"])
    start = TinyLlama(cfg, False).state_dict()
    rank = dist.get_rank()
    for name, param in model.state_dict().items():
        local = param._local_value() if param.is_dist() else param
        if local._is_initialized():
            local.set_value(reference_slice(start[name].numpy(), param, rank))


# -- the check: a one-process reference with the same micro-batches ------------------------

def reference(cfg, dp_index):
    """One process, dygraph: per micro-batch ``loss / acc`` backward, clipping the average,
    one update per step.  Micro-batch k of a step is rows [k*micro, (k+1)*micro) of the step's
    batch (a shard_dataloader gives dp rank r the r-th part of each micro-batch; a plain loader
    feeds whole micro-batches).  Returns [mean, per-micro-batch ...] per step as this rank sees
    it, the eval losses before step 1, and the parameters."""
    paddle.seed(cfg["seed"])
    model, criterion = TinyLlama(cfg, False), Criterion(cfg, False)
    lr_scheduler, optimizer = make_optimizer(cfg, model)
    data = RandomTokens(cfg, cfg["steps"] * cfg["micro"] * cfg["acc"] + cfg["extra_samples"])
    dp = cfg["dp"] if cfg["loader"] == "sampler" else 1
    part = cfg["micro"] // dp
    losses, eval_losses = [], []
    for step in range(cfg["steps"]):
        base = step * cfg["micro"] * cfg["acc"]
        if cfg["toggle_modes"] and step == 1:
            with paddle.no_grad():
                mine = [float(criterion(model(paddle.to_tensor(data.inputs[rows])),
                                        paddle.to_tensor(data.labels[rows])))
                        for rows in _micro_rows(cfg, base, dp_index, part)]
            eval_losses.append(float(np.mean(mine)))
        mine = []
        for k in range(cfg["acc"]):
            start = base + k * cfg["micro"]
            parts = [criterion(model(paddle.to_tensor(data.inputs[r:r + part])),
                               paddle.to_tensor(data.labels[r:r + part]))
                     for r in range(start, start + cfg["micro"], part)]
            (paddle.add_n(parts) / (len(parts) * cfg["acc"])).backward()
            mine.append(float(parts[dp_index]))
        optimizer.step()
        optimizer.clear_grad()
        lr_scheduler.step()
        losses.append([float(np.mean(mine))] + mine)
    return losses, eval_losses, {k: v.numpy() for k, v in model.state_dict().items()}


def _micro_rows(cfg, base, dp_index, part):
    return [slice(base + k * cfg["micro"] + dp_index * part,
                  base + k * cfg["micro"] + (dp_index + 1) * part) for k in range(cfg["acc"])]


def dp_index_of(rank, cfg):
    mesh = make_global_mesh(cfg)
    if "dp" not in mesh.dim_names:
        return 0
    coord = np.argwhere(np.asarray(mesh.process_ids).reshape(mesh.shape) == rank)[0]
    return int(coord[mesh.dim_names.index("dp")])


def _replanned_memory(dist_model):
    from pipesplit.passes import strategy as pipesplit_strategy

    done = pipesplit_strategy.replanned(dist_model)
    return None if done is None else done.memory


def pipesplit_notices(dist_model):
    from pipesplit.passes import strategy as pipesplit_strategy

    return pipesplit_strategy.notices(dist_model)


def _plan_costs(dist_model):
    """The training plan's job costs and memory limit, as its config holds them."""
    from pipesplit.passes import strategy as pipesplit_strategy

    plan = pipesplit_strategy.plan_of(dist_model)
    config = plan.config
    costs = None if config.costs is None else {
        k: getattr(config.costs, k) for k in ("forward", "backward_b", "backward_w", "comm")}
    return {"costs": costs, "memory_limit": config.memory_limit}


def run_one(cfg, out_dir: Path):
    rank = dist.get_rank()
    folder = out_dir / cfg["tag"]
    folder.mkdir(parents=True, exist_ok=True)
    if cfg["expect_error"]:  # every rank refuses before any collective: the next config runs
        try:
            train(cfg)
            error = None
        except Exception as exc:  # noqa: BLE001 (the refusal under test)
            error = f"{type(exc).__name__}: {exc}"
        (folder / f"rank{rank}.json").write_text(json.dumps({"config": cfg, "rank": rank,
                                                              "error": error}))
        return
    losses, eval_losses, dist_model = train(cfg)
    ref_losses, ref_eval, ref_params = reference(cfg, dp_index_of(rank, cfg))
    diffs = {}
    for name, value in dist_model.state_dict("param").items():
        local = value._local_value() if value.is_dist() else value
        if name in ref_params and local._is_initialized():
            diffs[name] = float(np.max(np.abs(
                local.numpy() - reference_slice(ref_params[name], value, rank))))
    held = [step for step in losses if step is not None]
    layer_params = {name.split(".")[1] for name in diffs if name.startswith("layers.")}
    record = {
        "config": cfg, "rank": rank, "losses": losses, "reference_losses": ref_losses,
        "max_loss_diff": max((abs(a - b) for ours, ref in zip(held, ref_losses)
                              for a, b in zip(ours, ref)), default=None),
        "eval_losses": eval_losses, "reference_eval_losses": ref_eval,
        "max_eval_diff": max((abs(a - b) for a, b in zip(eval_losses, ref_eval)
                              if a is not None), default=None),
        "max_param_diff": max(diffs.values(), default=0.0), "params_compared": len(diffs),
        "stage": next(s for s in range(cfg["pp"]) if rank in get_mesh(s).process_ids),
        "layers_held": len(layer_params),
        "replanned_memory": _replanned_memory(dist_model),
        "notices": list(pipesplit_notices(dist_model)),
        "plan_costs": _plan_costs(dist_model),
    }
    (folder / f"rank{rank}.json").write_text(json.dumps(record, indent=1))


def main() -> int:
    configs = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    for given in configs:
        cfg = {**DEFAULTS, **given}
        # fresh names and a fresh scope for each model, as in a new process
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            run_one(cfg, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a small Llama-style model through Paddle's auto-parallel engine on a ``(dp, pp, mp)``
mesh with a pipesplit schedule, beside a one-process dygraph reference with the same
micro-batches and the same initial parameters.

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir /tmp/llama_log \
        examples/llama_auto_parallel.py --pp 2 --schedule 1F1B -m 4 --steps 2 --json out.json

The model is written as Paddle's own auto-parallel Llama test writes it: one global
``ProcessMesh`` with the dims ``["dp", "pp", "mp"]``; the parameters of pipeline stage ``i`` on
``global_mesh.get_mesh_with_dim("pp", i)`` (a ``(dp, mp)`` mesh), column-parallel weights
(q, k, v, gate, up, embedding, LM head) ``[Replicate(), Shard(1)]``, row-parallel ones (o, down)
``[Replicate(), Shard(0)]``, norms replicated; the hidden states resharded onto the next stage
with ``[Shard(0), Replicate()]`` (batch split over dp); the causal mask and the position ids
built once on the global mesh and resharded onto every decoder layer's stage mesh, outside the
layers.  Decoder layer ``i`` sits on stage ``i * pp // layers`` (model order); with
``vpp_degree > 1`` the engine (Paddle's round-robin) or pipesplit (V order for ZBV, ...)
re-places the ``LlamaDecoderLayer`` blocks (``strategy.pipeline.vpp_seg_method``).

Batch: ``--micro-batch-size`` is per dp rank; a step's global batch is
``dp * m * micro_batch_size`` samples, which ``dist.shard_dataloader`` splits over dp (rank ``r``
of dp gets the ``r``-th contiguous block of ``m * micro_batch_size`` samples) and the engine
splits into ``m`` micro-batches on every rank.  Micro-batch ``k`` of the reference is the
``k``-th slice of every dp rank's block, so its mean loss is the one the engine computes.

``--style library`` writes the model as the auto-parallel Llama of Paddle's model library
(PaddleNLP / PaddleFormers 0.4.0) writes it: the mask and the position ids made on the global
mesh and cut onto each layer's stage mesh in the model, then resharded on that same mesh to
the batch split over dp *inside* each attention (two steps, a chain of reshards), the rotary
tables built in the attention, and the decoder layers under
``paddle.distributed.fleet.utils.recompute`` (``strategy.recompute`` on).  The schedules that
move layers (VPP, ZBV, ...) re-derive that chain on each moved layer's mesh.

``--parallelize prefix|points`` builds the plain model and sets it up with Paddle's
intermediate API instead of placing every weight: ``dist.parallelize(model, optimizer,
config={"pp_config": {"split_spec": ..., "global_spec": "global_inputs"}, "dp_config": ...,
"mp_config": ...})``, the stages split by the layer-list prefix ``layers`` or by explicit split
points; with ``--tie-embedding`` the head shares the embedding's weight as ``parallelize`` ties
it (a reshard onto the last stage's mesh before the head runs).

``--paddle`` runs Paddle's own pipeline pass (FThenB, 1F1B, VPP) as a control.  On a CPU build,
``pipesplit.passes.cpu_support.enable()`` lets the engine start.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
from paddle import nn
from paddle.distributed.fleet.utils import recompute

from pipesplit.ir_utils.measure import MemoryStats


# -- meshes (as Paddle's test: a global mesh set with set_mesh, stage meshes cut from it) ------

def get_mesh(stage=None):
    """The global mesh, or pipeline stage ``stage``'s ``(dp, mp)`` mesh (``-1``: the last)."""
    mesh = dist.auto_parallel.get_mesh()
    if stage is None:
        return mesh
    return mesh.get_mesh_with_dim("pp", stage % mesh.get_dim_size("pp"))


COLWISE = (dist.Replicate(), dist.Shard(1))   # weight [in, out]: out split over mp
ROWWISE = (dist.Replicate(), dist.Shard(0))   # weight [in, out]: in split over mp
REPLICATED = (dist.Replicate(), dist.Replicate())
ACTIVATION = (dist.Shard(0), dist.Replicate())  # batch split over dp


def place(param, stage, placements):
    """``param`` (built whole from the seed) sharded onto ``stage``'s mesh; ``stage`` None: the
    one-process reference, unchanged."""
    if stage is None:
        return param
    return dist.shard_tensor(param, get_mesh(stage), list(placements))


# -- the model -------------------------------------------------------------------------------

class LlamaRMSNorm(nn.Layer):
    def __init__(self, hidden, eps=1e-6, stage=None):
        super().__init__()
        weight = self.create_parameter([hidden], default_initializer=nn.initializer.Constant(1.0))
        self.weight = place(weight, stage, REPLICATED)
        self.eps = eps

    def forward(self, x):
        variance = x.astype("float32").pow(2).mean(-1, keepdim=True)
        return paddle.rsqrt(variance + self.eps) * x * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def rotary_tables(seq, head_dim, base=10000.0):
    """cos / sin ``[seq, head_dim]`` of the rotary embedding, built from the positions 0..seq-1
    (the model library's attention builds them itself)."""
    inv_freq = 1.0 / (base ** (paddle.arange(0, head_dim, 2, dtype="float32") / head_dim))
    freqs = paddle.arange(seq, dtype="float32").unsqueeze(-1) * inv_freq  # [s, d/2]
    angles = paddle.concat([freqs, freqs], axis=-1)
    return angles.cos(), angles.sin()


def apply_rotary_tables(q, k, position_ids, cos, sin):
    """Rotary embedding of q, k ``[batch, seq, heads, head_dim]`` from the tables, gathered at
    ``position_ids`` ``[batch, seq]``."""
    cos, sin = (F.embedding(position_ids, table).unsqueeze(2) for table in (cos, sin))
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def apply_rotary(q, k, position_ids, base=10000.0):
    """Rotary position embedding of q, k ``[batch, seq, heads, head_dim]`` at ``position_ids``
    ``[batch, seq]``: the angles are computed here from the positions (no cached table)."""
    head_dim = q.shape[-1]
    inv_freq = 1.0 / (base ** (paddle.arange(0, head_dim, 2, dtype="float32") / head_dim))
    freqs = position_ids.astype("float32").unsqueeze(-1) * inv_freq  # [b, s, d/2]
    angles = paddle.concat([freqs, freqs], axis=-1).unsqueeze(2)      # [b, s, 1, d]
    cos, sin = angles.cos(), angles.sin()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaAttention(nn.Layer):
    """``library``: as the model library's attention, the mask and the position ids (cut onto
    this layer's stage mesh by the model) are resharded here on that mesh, the batch split over
    dp, and the rotary tables are built here."""

    def __init__(self, hidden, heads, stage=None, library=False):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.stage, self.library = stage, library
        for name, placements in (("q_proj", COLWISE), ("k_proj", COLWISE), ("v_proj", COLWISE),
                                 ("o_proj", ROWWISE)):
            linear = nn.Linear(hidden, hidden, bias_attr=False)
            linear.weight = place(linear.weight, stage, placements)
            setattr(self, name, linear)

    def forward(self, x, position_ids, attention_mask):
        if self.library and self.stage is not None:
            attention_mask = dist.reshard(attention_mask, get_mesh(self.stage), list(ACTIVATION))
            position_ids = dist.reshard(position_ids, get_mesh(self.stage), list(ACTIVATION))
        shape = [0, 0, self.heads, self.head_dim]
        q = self.q_proj(x).reshape(shape)
        k = self.k_proj(x).reshape(shape)
        v = self.v_proj(x).reshape(shape)
        if self.library:
            cos, sin = rotary_tables(x.shape[1], self.head_dim)
            q, k = apply_rotary_tables(q, k, position_ids, cos, sin)
        else:
            q, k = apply_rotary(q, k, position_ids)
        q, k, v = (t.transpose([0, 2, 1, 3]) for t in (q, k, v))  # [b, heads, s, d]
        scores = paddle.matmul(q / math.sqrt(self.head_dim), k, transpose_y=True)
        probs = F.softmax(scores + attention_mask, axis=-1)
        out = paddle.matmul(probs, v).transpose([0, 2, 1, 3])
        return self.o_proj(out.reshape([0, 0, self.heads * self.head_dim]))


class LlamaMLP(nn.Layer):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden, intermediate, stage=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias_attr=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias_attr=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias_attr=False)
        self.gate_proj.weight = place(self.gate_proj.weight, stage, COLWISE)
        self.up_proj.weight = place(self.up_proj.weight, stage, COLWISE)
        self.down_proj.weight = place(self.down_proj.weight, stage, ROWWISE)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Layer):
    def __init__(self, hidden, heads, intermediate, stage=None, library=False):
        super().__init__()
        self.stage = stage
        self.input_layernorm = LlamaRMSNorm(hidden, stage=stage)
        self.self_attn = LlamaAttention(hidden, heads, stage, library)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, stage=stage)
        self.mlp = LlamaMLP(hidden, intermediate, stage)

    def forward(self, x, position_ids, attention_mask):
        x = x + self.self_attn(self.input_layernorm(x), position_ids, attention_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def causal_mask(batch, seq, dtype="float32"):
    """``[batch, 1, seq, seq]`` additive mask: 0 where a token may attend, the dtype's min
    elsewhere (from an all-ones padding mask and a lower triangle, as Llama builds it)."""
    keep = paddle.ones([batch, seq], dtype="bool")[:, None, None, :].expand([batch, 1, seq, seq])
    keep = keep & paddle.tril(paddle.ones([seq, seq], dtype="bool"))[None, None]
    return paddle.where(keep, paddle.zeros([], dtype), paddle.full([], paddle.finfo(dtype).min,
                                                                   dtype)).astype(dtype)


class GlobalInputs(nn.Layer):
    """The causal mask and the position ids of a batch: the layer ``dist.parallelize``'s
    ``global_spec`` names (its outputs go onto the global mesh; each layer takes them onto its
    own stage's mesh)."""

    def forward(self, input_ids):
        batch, seq = input_ids.shape
        position_ids = paddle.arange(seq, dtype="int64").unsqueeze(0).expand([batch, seq])
        return causal_mask(batch, seq), position_ids


class LlamaLMHead(nn.Layer):
    """The output head: a ``[hidden, vocab]`` weight, or the embedding's ``[vocab, hidden]``
    one when tied (read transposed)."""

    def __init__(self, hidden, vocab, tied_weight=None):
        super().__init__()
        self.tied = tied_weight is not None
        self.weight = tied_weight if self.tied else self.create_parameter([hidden, vocab])

    def forward(self, x):
        return paddle.matmul(x, self.weight, transpose_y=self.tied)


class LlamaForCausalLM(nn.Layer):
    """Embedding, decoder layers, final norm and LM head (a ``[hidden, vocab]`` parameter used
    with matmul).  ``pp`` None builds the plain one-process model (the reference).  ``library``:
    written as the model library's auto-parallel Llama (see the module's docstring)."""

    def __init__(self, vocab, hidden, heads, intermediate, layers, pp=None, library=False,
                 tie_embedding=False, parallelize=False):
        super().__init__()
        self.pp, self.library, self.tie_embedding = pp, library, tie_embedding
        self.parallelize = parallelize
        stage_of = (lambda i: None) if pp is None else (lambda i: i * pp // layers)
        first, last = (None, None) if pp is None else (0, pp - 1)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.embed_tokens.weight = place(self.embed_tokens.weight, first, COLWISE)
        if parallelize:  # (on the first stage, its outputs put on the global mesh)
            self.global_inputs = GlobalInputs()
        self.layers = nn.LayerList([LlamaDecoderLayer(hidden, heads, intermediate, stage_of(i),
                                                      library) for i in range(layers)])
        self.norm = LlamaRMSNorm(hidden, stage=last)
        if parallelize:  # (dist.parallelize places the weights: plain layers here)
            self.lm_head = LlamaLMHead(hidden, vocab, self.embed_tokens.weight
                                       if tie_embedding else None)
        elif not tie_embedding:  # (tied: the head reads the embedding's weight, transposed)
            self.lm_head = place(self.create_parameter([hidden, vocab]), last, COLWISE)

    def forward(self, input_ids):
        if self.parallelize:
            x = self.embed_tokens(input_ids)
            mask, position_ids = self.global_inputs(input_ids)
            for layer in self.layers:
                x = layer(x, position_ids, mask)
            return self.lm_head(self.norm(x))
        batch, seq = input_ids.shape
        x = self.embed_tokens(input_ids)
        mask = causal_mask(batch, seq, x.dtype)
        position_ids = paddle.arange(seq, dtype="int64").unsqueeze(0).expand([batch, seq])
        if self.pp is not None:
            # built on the global mesh (pp first) and cut onto each layer's stage below
            everyone = get_mesh().get_mesh_with_dim("pp")
            mask = dist.shard_tensor(mask, everyone, [dist.Replicate()] * 3)
            position_ids = dist.shard_tensor(position_ids, everyone, [dist.Replicate()] * 3)
            x = dist.reshard(x, get_mesh(0), list(ACTIVATION))
        for i, layer in enumerate(self.layers):
            layer_mask, layer_pos = mask, position_ids
            if self.pp is not None:
                stage_mesh = get_mesh(layer.stage)
                layer_mask = dist.reshard(mask, stage_mesh, list(REPLICATED))
                layer_pos = dist.reshard(position_ids, stage_mesh, list(REPLICATED))
                if i > 0 and layer.stage != self.layers[i - 1].stage:
                    x = dist.reshard(x, stage_mesh, list(ACTIVATION))
            if self.library and self.training:
                x = recompute(layer, x, layer_pos, layer_mask)
            else:
                x = layer(x, layer_pos, layer_mask)
        if not self.tie_embedding:
            return paddle.matmul(self.norm(x), self.lm_head)
        weight = self.embed_tokens.weight
        if self.pp is not None:  # the first stage's parameter, read on the last stage
            weight = dist.reshard(weight, get_mesh(-1), list(REPLICATED))
        return paddle.matmul(self.norm(x), weight, transpose_y=True)


class LlamaCriterion(nn.Layer):
    """Mean next-token cross entropy; in the dist model the logits and labels are first made
    replicated on the last stage's mesh (the vocab dim is split over mp), as Paddle's test."""

    def __init__(self, distributed):
        super().__init__()
        self.distributed = distributed

    def forward(self, logits, labels):
        if self.distributed:
            logits = dist.reshard(logits, get_mesh(-1), list(REPLICATED))
            labels = dist.reshard(labels, get_mesh(-1), list(REPLICATED))
        return F.cross_entropy(logits.astype("float32").reshape([-1, logits.shape[-1]]),
                               labels.reshape([-1, 1]))


# -- data, optimizer, strategy ---------------------------------------------------------------

class TokenData(paddle.io.Dataset):
    """Random token sequences (seeded) and their next-token labels."""

    def __init__(self, samples, seq, vocab, seed):
        tokens = np.random.default_rng(seed).integers(0, vocab, size=(samples, seq + 1),
                                                      dtype=np.int64)
        self.inputs, self.labels = tokens[:, :-1], tokens[:, 1:]

    def __getitem__(self, i):
        return self.inputs[i], self.labels[i]

    def __len__(self):
        return len(self.inputs)


def make_optimizer(args, model):
    lr = paddle.optimizer.lr.LinearWarmup(learning_rate=args.lr, warmup_steps=args.warmup,
                                          start_lr=args.lr * 0.1, end_lr=args.lr)
    clip = paddle.nn.ClipGradByGlobalNorm(args.clip) if args.clip > 0 else None
    if args.optimizer == "sgd":
        return paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters(),
                                    grad_clip=clip)
    # no decay on the norms (by parameter name, as Paddle's test)
    decay = {p.name for n, p in model.named_parameters() if "norm" not in n}
    return paddle.optimizer.AdamW(learning_rate=lr, parameters=model.parameters(),
                                  weight_decay=0.01, apply_decay_param_fun=decay.__contains__,
                                  grad_clip=clip)


def parallelize_config(args):
    """``dist.parallelize``'s config, as Paddle's intermediate-API Llama test writes it."""
    if args.parallelize == "prefix":
        split_spec = "layers"
    else:  # the last layer of each stage but the last ends it
        split_spec = {f"layers.{(i + 1) * args.layers // args.pp - 1}": dist.SplitPoint.END
                      for i in range(args.pp - 1)}
    config = {"pp_config": {"split_spec": split_spec, "global_spec": "global_inputs"}}
    if args.dp > 1:  # (the sharding level: parallelize shards the optimizer itself)
        config["dp_config"] = {"sharding_level": args.sharding}
    if args.mp > 1:
        # (a tied weight stays whole over mp: the head reads it transposed)
        ends = {} if args.tie_embedding else {
            "embed_tokens": dist.ColWiseParallel(gather_output=True),
            "lm_head.weight": dist.ColWiseParallel()}
        config["mp_config"] = {"parallelize_plan": {
            **ends,
            "layers.*.self_attn.q_proj": dist.ColWiseParallel(gather_output=True),
            "layers.*.self_attn.k_proj": dist.ColWiseParallel(gather_output=True),
            "layers.*.self_attn.v_proj": dist.ColWiseParallel(gather_output=True),
            "layers.*.self_attn.o_proj": dist.RowWiseParallel(is_input_parallel=False),
            "layers.*.mlp.gate_proj": dist.ColWiseParallel(),
            "layers.*.mlp.up_proj": dist.ColWiseParallel(),
            "layers.*.mlp.down_proj": dist.RowWiseParallel()}}
    return config


def make_strategy(args):
    # (the library's decoder layers run under recompute: the engine's recompute pass on)
    strategy = dist.Strategy({"recompute": {"enable": args.style == "library"}})
    pipeline = strategy.pipeline
    pipeline.enable = True
    pipeline.schedule_mode = args.schedule
    pipeline.pp_degree = args.pp
    pipeline.vpp_degree = args.vpp
    pipeline.vpp_seg_method = "LlamaDecoderLayer"
    pipeline.accumulate_steps = args.m
    pipeline.micro_batch_size = args.micro_batch_size  # per dp rank
    if args.keep_gathered_weights and not args.paddle:  # (stage 3: Paddle's program as it is)
        from pipesplit.passes import strategy as pipesplit_strategy
        pipesplit_strategy.reshard_after_forward(strategy, False)
    return strategy


def build(args, pp=None):
    paddle.seed(args.seed)  # the same whole parameters on every rank and in the reference
    return LlamaForCausalLM(args.vocab, args.hidden, args.heads, args.intermediate, args.layers,
                            pp, library=args.style == "library",
                            tie_embedding=args.tie_embedding,
                            parallelize=args.parallelize is not None)


def micro_batch_rows(args, step, k):
    """Dataset rows of micro-batch ``k`` of ``step``: the ``k``-th slice of every dp rank's
    block (``shard_dataloader`` gives dp rank ``r`` the ``r``-th block of the global batch)."""
    block, mb = args.m * args.micro_batch_size, args.micro_batch_size
    start = step * args.batch
    return np.concatenate([np.arange(start + r * block + k * mb, start + r * block + (k + 1) * mb)
                           for r in range(args.dp)])


def reference(args):
    """The same model in one process (dygraph, no mesh): per micro-batch ``loss / m`` backward,
    one optimizer step per step, the LR scheduler stepped per step.  Returns the per-micro-batch
    losses and the parameters by structured name."""
    model = build(args)
    criterion = LlamaCriterion(distributed=False)
    opt = make_optimizer(args, model)
    data = TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
    losses = []
    for step in range(args.steps):
        per_mb = []
        for k in range(args.m):
            rows = micro_batch_rows(args, step, k)
            x, y = paddle.to_tensor(data.inputs[rows]), paddle.to_tensor(data.labels[rows])
            loss = criterion(model(x), y)
            (loss / args.m).backward()
            per_mb.append(float(loss))
        opt.step()
        opt.clear_grad()
        opt._learning_rate.step()
        losses.append(per_mb)
    return losses, {k: v.numpy() for k, v in model.state_dict().items()}


# -- the run ---------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--mp", type=int, default=1)
    p.add_argument("--pp", type=int, default=None, help="default: world size // (dp * mp)")
    p.add_argument("--schedule", default="1F1B", help="any pipesplit schedule name or alias")
    p.add_argument("--vpp", type=int, default=None,
                   help="chunks per rank (default: 2 for V-placement schedules, else 1)")
    p.add_argument("-m", type=int, default=4, help="micro-batches per step (accumulate_steps)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--layers", type=int, default=4, help="decoder layers")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 2*hidden)")
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=2, help="per dp rank")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--sharding", type=int, choices=(0, 1, 2, 3), default=0,
                   help="shard over dp: dist.shard_optimizer with ShardingStage1 / "
                        "ShardingStage2 (optimizer states) / ShardingStage3 (parameters too), "
                        "or dist.parallelize's dp_config sharding_level with --parallelize "
                        "(0: none)")
    p.add_argument("--lr", type=float, default=None, help="default: 1e-3 AdamW, 0.1 SGD")
    p.add_argument("--warmup", type=int, default=2, help="LinearWarmup steps (from lr / 10)")
    p.add_argument("--clip", type=float, default=1.0,
                   help="ClipGradByGlobalNorm threshold (0: no clipping).  Paddle's own pass "
                        "(--paddle) clips the SUM of the micro-batch gradients, pipesplit and "
                        "the reference their average: compare --paddle with --clip 0")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--parallelize", choices=("prefix", "points"), default=None,
                   help="set the model up with dist.parallelize (split_spec: the layer list's "
                        "prefix, or explicit split points) instead of placing its weights")
    p.add_argument("--tie-embedding", action="store_true",
                   help="the LM head reads the embedding's weight (resharded from the first "
                        "stage's mesh onto the last's)")
    p.add_argument("--style", choices=("test", "library"), default="test",
                   help="test: as Paddle's auto-parallel Llama test (mask and positions "
                        "resharded in the model); library: as the model library's (resharded "
                        "inside each attention, rotary tables built there, recompute)")
    p.add_argument("--paddle", action="store_true",
                   help="use Paddle's own pipeline pass (FThenB, 1F1B, VPP) instead of pipesplit")
    p.add_argument("--memory", action="store_true",
                   help="record each rank's bytes held between steps (its scope's tensors), its "
                        "peak (those and the most a step after the first adds: the smallest "
                        "such step) and its median step time after the first")
    p.add_argument("--keep-gathered-weights", action="store_true",
                   help="sharding stage 3: keep each gathered weight from a micro-batch's "
                        "forward to its backward (pipesplit's reshard_after_forward off)")
    p.add_argument("--json", help="write losses, reference_losses and the differences here")
    p.add_argument("--tag", default="run", help="names this run's keys in the launcher's store")
    args = p.parse_args(argv)
    if args.vpp is None:
        from pipesplit.job_list.registry import get_spec
        args.vpp = 2 if get_spec(args.schedule).placement == "v" else 1
    if args.lr is None:
        args.lr = 0.1 if args.optimizer == "sgd" else 1e-3
    args.intermediate = args.intermediate or 2 * args.hidden
    return args


def check_degrees(args, world):
    if args.pp is None:
        args.pp = world // (args.dp * args.mp)
    if args.dp * args.pp * args.mp != world:
        raise SystemExit(f"dp * pp * mp = {args.dp} * {args.pp} * {args.mp} = "
                         f"{args.dp * args.pp * args.mp}, but the launch has {world} processes "
                         "(--nproc_per_node)")
    if args.pp < 2:
        raise SystemExit(f"pp = {args.pp}: a pipeline needs at least 2 stages")
    for what, n in (("hidden", args.hidden), ("heads", args.heads),
                    ("intermediate", args.intermediate), ("vocab", args.vocab)):
        if n % args.mp:
            raise SystemExit(f"--{what} {n} is not divisible by mp = {args.mp}")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        raise SystemExit("hidden / heads must be an even head size")
    args.batch = args.dp * args.m * args.micro_batch_size  # global batch of a step


def make_loader(args, data):
    """``dist.shard_dataloader`` over dp, as Paddle's docs write it: the input ids on the first
    stage's mesh, the labels on the last's (pipesplit routes them to the loss's stage, which
    V-placed schedules bring back to the first mesh)."""
    loader = paddle.io.DataLoader(data, batch_size=args.batch, shuffle=False)
    return dist.shard_dataloader(loader, meshes=[get_mesh(0), get_mesh(args.pp - 1)],
                                 shard_dims="dp")


def main(argv=None) -> int:
    args = parse_args(argv)
    # no dist.init_parallel_env(): as in Paddle's own scripts, dist.to_static creates the group
    rank, world = dist.get_rank(), dist.get_world_size()
    check_degrees(args, world)
    from pipesplit.passes import strategy as pipesplit_strategy
    if args.paddle:
        pipesplit_strategy.disable_strategy()  # (a no-op unless enabled before)
    else:
        pipesplit_strategy.enable_strategy()
    from pipesplit.passes import cpu_support
    cpu_support.enable()  # does nothing on a CUDA build

    global_mesh = dist.ProcessMesh(
        np.arange(args.dp * args.pp * args.mp).reshape(args.dp, args.pp, args.mp).tolist(),
        ["dp", "pp", "mp"])
    dist.auto_parallel.set_mesh(global_mesh)

    if args.parallelize:  # the intermediate API places the plain model
        model = build(args)
        model, opt = dist.parallelize(model, make_optimizer(args, model),
                                      config=parallelize_config(args))
    else:
        model = build(args, args.pp)
        opt = make_optimizer(args, model)
    if args.sharding and not args.parallelize:  # sharded over dp (ZeRO stage 1 / 2 / 3)
        stage = {1: dist.ShardingStage1, 2: dist.ShardingStage2,
                 3: dist.ShardingStage3}[args.sharding]
        opt = dist.shard_optimizer(opt, stage("dp", global_mesh))
    data = TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
    dist_loader = make_loader(args, data)
    dist_model = dist.to_static(model, dist_loader, LlamaCriterion(distributed=True), opt,
                                make_strategy(args))
    dist_model.train()

    memory = MemoryStats(paddle.CUDAPlace(dist.ParallelEnv().device_id)
                         if paddle.is_compiled_with_cuda() else paddle.CPUPlace()) \
        if args.memory else None
    losses, grown, seconds = [], [], []
    for x, y in dist_loader():
        if memory:  # what each step adds above what it starts with, and its time
            before_step = memory.settled_current()
            memory.reset_peak()
            started = time.perf_counter()
        loss = dist_model(x, y)
        if memory:
            seconds.append(time.perf_counter() - started)
            grown.append(memory.peak() - before_step)
        if loss is not None:
            losses.append(np.asarray(loss, np.float64).reshape(-1).tolist())
        opt._learning_rate.step()
    held = {}
    if memory:  # (the first step builds the programs: the steps after it count)
        held = {"held_bytes": scope_bytes(paddle.static.global_scope())}
        held["peak_bytes"] = held["held_bytes"] + min(grown[1:] or grown)
        held["step_ms"] = 1000 * float(np.median(seconds[1:] or seconds))

    ref_losses, ref_params = reference(args)
    compared = {name: param for name, param in local_parameters(dist_model).items()
                if name in ref_params}  # (the scheduler's learning rate is listed too)
    diffs = [float(np.max(np.abs(local - reference_slice(ref_params[name], value, rank))))
             for name, (value, local) in compared.items()]
    if memory:  # (the bytes of the parameter slices this rank holds)
        held["parameter_bytes"] = sum(local.nbytes for _, local in compared.values())
    replanned = None if args.paddle else pipesplit_strategy.replanned(dist_model)
    mine = {"rank": rank, "losses": losses or None, "max_param_diff": max(diffs, default=0.0),
            "num_params": len(diffs),  # auto re-plans once with the costs it measured
            "replanned_step": None if replanned is None else replanned.step,
            "order_changed": None if replanned is None
            else replanned.before.job_order != replanned.after.job_order,
            **held,
            **({} if args.paddle else transfers_of(pipesplit_strategy.plan_of(dist_model)))}
    everyone = exchange(rank, world, mine, key=f"{args.tag}/result")
    # as a trainer reads it: from the last pipeline stage, where every schedule returns it
    last_stage = [int(r) for r in get_mesh(-1).process_ids]
    loss_ranks = [r["rank"] for r in everyone if r["losses"] is not None]
    holder = everyone[last_stage[0]]
    if holder["losses"] is None:
        raise RuntimeError(f"the last pipeline stage's rank {last_stage[0]} returned no loss "
                           f"(ranks that did: {loss_ranks})")
    if rank == holder["rank"]:
        record = {"schedule": args.schedule, "paddle": args.paddle, "dp": args.dp,
                  "pp": args.pp, "mp": args.mp, "vpp": args.vpp, "m": args.m,
                  "optimizer": args.optimizer,
                  "losses": holder["losses"], "reference_losses": ref_losses,
                  "max_loss_diff": max(abs(a - b) for ours, ref in zip(holder["losses"],
                                                                       ref_losses)
                                       for a, b in zip(ours, ref)),
                  "max_param_diff": max(r["max_param_diff"] for r in everyone),
                  "params_compared": sum(r["num_params"] for r in everyone),
                  "replanned_step": [r["replanned_step"] for r in everyone],
                  "order_changed": [r["order_changed"] for r in everyone],
                  "loss_ranks": loss_ranks, "last_stage_ranks": last_stage,
                  "step_jobs": [r.get("step_jobs") for r in everyone],
                  "micro_batch_transfers": [r.get("micro_batch_transfers") for r in everyone],
                  "held_bytes": [r.get("held_bytes") for r in everyone],
                  "peak_bytes": [r.get("peak_bytes") for r in everyone],
                  "step_ms": [r.get("step_ms") for r in everyone],
                  "parameter_bytes": [r.get("parameter_bytes") for r in everyone],
                  "style": args.style}
        print(f"llama {args.schedule}{' (paddle)' if args.paddle else ''} dp={args.dp} "
              f"pp={args.pp} mp={args.mp} vpp={args.vpp} m={args.m} {args.optimizer}: "
              f"max |loss - reference| {record['max_loss_diff']:.2e}, max |param - reference| "
              f"{record['max_param_diff']:.2e} over {record['params_compared']} parameters",
              flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
    # rank 0 hosts the store: keep it until all are done
    exchange(rank, world, {}, key=f"{args.tag}/done")
    return 0


#: the comm ops of a transfer and which of their values it carries
_CARRIED = {"pd_op.broadcast_": "result", "pd_op.all_gather": "operand",
            "pd_op.send_v2": "operand", "pd_op.recv_v2": "result"}


def transfers_of(plan):
    """What this rank's training plan sends: the jobs that run once per step beside the
    optimizer (a weight another stage reads goes in ``shared_weights``, its gradient in
    ``shared_grads``), and the shapes the per-micro-batch send / recv jobs carry."""
    step_jobs = [t for t, _ in plan.job_order if t.startswith("shared_")]
    shapes = set()
    for job_type, program in plan.split.programs.items():
        if not job_type.startswith(("send_", "recv_")):
            continue
        for op in program.global_block().ops:
            side = _CARRIED.get(op.name())
            if side is not None:
                value = op.result(0) if side == "result" else op.operand_source(0)
                shapes.add(tuple(value.shape))
    return {"step_jobs": step_jobs, "micro_batch_transfers": sorted(shapes)}


def scope_bytes(scope):
    """The bytes of the tensors a scope holds between steps (parameters, optimizer states,
    gradient-merge buffers): what a rank keeps, exactly."""
    total = 0
    for name in scope.local_var_names():
        var = scope.find_var(name)
        try:
            tensor = var.get_tensor()
        except Exception:  # (not a dense tensor: readers, step counters' holders ...)
            continue
        if tensor._is_initialized():
            total += tensor._numel() * paddle.base.core.size_of_dtype(tensor._dtype())
    return total


def local_parameters(dist_model):
    """This rank's parameters: structured name -> (the dist tensor, its local array); other
    ranks' parameters hold no data here."""
    out = {}
    for name, value in dist_model.state_dict("param").items():
        local = value._local_value() if value.is_dist() else value
        if local._is_initialized():
            out[name] = (value, local.numpy())
    return out


def reference_slice(whole, value, rank):
    """The part of the reference's ``whole`` parameter that ``rank`` holds of ``value``: for a
    ``Shard(d)`` on a mesh dim, this rank's block along ``d`` (Paddle splits evenly; one mesh
    dim per tensor dim here); replicated ones (dp replicas included) compare whole."""
    if not value.is_dist():
        return whole
    mesh = value.process_mesh
    coord = np.argwhere(np.asarray(mesh.process_ids).reshape(mesh.shape) == rank)[0]
    index = [slice(None)] * whole.ndim
    for mesh_dim, placement in enumerate(value.placements):
        if placement.is_shard():
            d = placement.get_dim()
            size = -(-whole.shape[d] // mesh.shape[mesh_dim])
            index[d] = slice(coord[mesh_dim] * size, (coord[mesh_dim] + 1) * size)
    return whole[tuple(index)]


def exchange(rank, world, payload, key="result"):
    """Every rank's ``payload``, through the launcher's TCP store."""
    store = paddle.base.core.create_or_get_global_tcp_store()
    store.set(f"llama/{key}/{rank}", json.dumps(payload).encode())
    return [json.loads(bytes(store.get(f"llama/{key}/{r}")).decode()) for r in range(world)]


if __name__ == "__main__":
    sys.exit(main())

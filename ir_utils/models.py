"""Small real Paddle models built in PIR static mode, tagged with chunk ids per stage.

Each layer's ops are created under ``pir_chunk_id_guard(stage)`` where ``stage`` is the
GLOBAL virtual stage index (``layer // layers_per_stage``).  ``optimizer.minimize`` runs outside
the guards, so grad and optimizer ops carry no chunk / role: ``complete_program`` fills them.
Weights come from a seeded numpy generator, so two builds with the same seed are identical.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

import paddle
from paddle.base.framework import pir_chunk_id_guard

LOSS_NAME = "loss"


@dataclass
class BuiltModel:
    main: "paddle.pir.Program"
    startup: "paddle.pir.Program"
    feed_names: List[str]
    loss_name: str
    param_names: List[str]
    make_batch: Callable[[int], Dict[str, np.ndarray]]
    num_stages: int
    batch_size: int
    # forward-only twin of ``main`` (same parameter names), used for per-micro-batch baselines
    forward_program: Optional["paddle.pir.Program"] = None
    main_loss: object = field(default=None, repr=False)
    forward_loss: object = field(default=None, repr=False)
    # the optimizer's LR scheduler (also ``main.lr_scheduler``); None for a constant LR
    lr_scheduler: object = field(default=None, repr=False)


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
LR_SCHEDULES = ("constant", "step", "cosine", "warmup")
# schedule shapes, in steps: short enough that a 3-step run sees the LR change every step
LR_STEP_GAMMA = 0.5
LR_COSINE_PERIOD = 4
LR_WARMUP_STEPS = 3
ADAMW_WEIGHT_DECAY = 0.01


def _check(num_stages, layers_per_stage, batch_size, optimizer, lr_schedule="constant",
           clip_global_norm=None):
    for name, v in (("num_stages", num_stages), ("layers_per_stage", layers_per_stage),
                    ("batch_size", batch_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}")
    if clip_global_norm is not None and (isinstance(clip_global_norm, bool) or not isinstance(
            clip_global_norm, (int, float)) or not clip_global_norm > 0):
        raise ValueError(f"clip_global_norm must be a number > 0 or None, got "
                         f"{clip_global_norm!r}")


class _Init:
    """Deterministic numpy initialisers -> paddle ParamAttr."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def attr(self, shape, scale=None, value=None):
        if value is not None:
            arr = np.full(shape, value, dtype=np.float32)
        else:
            if scale is None:
                scale = 1.0 / np.sqrt(shape[0])
            arr = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.count += 1
        return paddle.ParamAttr(name=f"ps_param_{self.count - 1}",
                                initializer=paddle.nn.initializer.Assign(arr))


def _linear(init, x, fan_in, fan_out, bias=True, scale=None):
    w = paddle.static.create_parameter([fan_in, fan_out], "float32",
                                       attr=init.attr([fan_in, fan_out], scale=scale))
    y = paddle.matmul(x, w)
    if bias:
        b = paddle.static.create_parameter([fan_out], "float32",
                                           attr=init.attr([fan_out], scale=0.1))
        y = y + b
    return y


def _layer_norm(init, x, hidden):
    g = paddle.static.create_parameter([hidden], "float32", attr=init.attr([hidden], value=1.0))
    b = paddle.static.create_parameter([hidden], "float32", attr=init.attr([hidden], value=0.0))
    return paddle.nn.functional.layer_norm(x, [hidden], weight=g, bias=b, epsilon=1e-5)


def make_lr(lr, lr_schedule):
    """The learning rate for an optimizer: ``lr`` itself or a Paddle LR scheduler from it."""
    if lr_schedule == "constant":
        return lr
    if lr_schedule == "step":
        return paddle.optimizer.lr.StepDecay(lr, step_size=1, gamma=LR_STEP_GAMMA)
    if lr_schedule == "cosine":
        return paddle.optimizer.lr.CosineAnnealingDecay(lr, T_max=LR_COSINE_PERIOD)
    if lr_schedule == "warmup":
        return paddle.optimizer.lr.LinearWarmup(lr, LR_WARMUP_STEPS, lr / LR_WARMUP_STEPS, lr)
    raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}")


def make_optimizer(optimizer, lr, lr_schedule="constant", clip_global_norm=None):
    """A Paddle optimizer by name, with an optional LR schedule and global-norm clipping."""
    learning_rate = make_lr(lr, lr_schedule)
    clip = (paddle.nn.ClipGradByGlobalNorm(float(clip_global_norm))
            if clip_global_norm is not None else None)
    if optimizer == "sgd":
        return paddle.optimizer.SGD(learning_rate=learning_rate, grad_clip=clip)
    if optimizer == "momentum":
        return paddle.optimizer.Momentum(learning_rate=learning_rate, momentum=0.9,
                                         grad_clip=clip)
    if optimizer == "adam":
        return paddle.optimizer.Adam(learning_rate=learning_rate, grad_clip=clip)
    if optimizer == "adamw":
        return paddle.optimizer.AdamW(learning_rate=learning_rate, grad_clip=clip,
                                      weight_decay=ADAMW_WEIGHT_DECAY)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")


def _build(body, feed_specs, make_batch, num_stages, batch_size, optimizer, lr, seed,
           lr_schedule="constant", clip_global_norm=None):
    """Build ``main``/``startup`` (with optimizer) and a forward-only twin with equal names."""
    paddle.enable_static()
    out = {}
    for kind in ("train", "forward"):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
            feeds = [paddle.static.data(n, shape, dtype) for n, shape, dtype in feed_specs]
            loss = body(_Init(seed), *feeds)
            if kind == "train":
                make_optimizer(optimizer, lr, lr_schedule, clip_global_norm).minimize(loss)
            paddle._C_ops.set_persistable_value(loss, LOSS_NAME)
        out[kind] = (main, startup, loss)
    main, startup, loss = out["train"]
    # an LR scheduler's learning rate is a parameter of the program too: not a model weight
    lr_name = getattr(main, "lr_name", None)
    params = sorted((p.name for p in main.global_block().all_parameters() if p.name != lr_name),
                    key=lambda n: int(n.rsplit("_", 1)[1]))
    return BuiltModel(main=main, startup=startup, feed_names=[f[0] for f in feed_specs],
                      loss_name=LOSS_NAME, param_names=params, make_batch=make_batch,
                      num_stages=num_stages, batch_size=batch_size,
                      forward_program=out["forward"][0], main_loss=loss,
                      forward_loss=out["forward"][2],
                      lr_scheduler=getattr(main, "lr_scheduler", None))


def build_mlp(num_stages, layers_per_stage=1, hidden=16, batch_size=8, optimizer="sgd",
              lr=0.1, seed=0, lr_schedule="constant", clip_global_norm=None) -> BuiltModel:
    """``num_stages*layers_per_stage`` tanh(Linear) layers, MSE loss in the last stage.
    ``optimizer`` in :data:`OPTIMIZERS`, ``lr_schedule`` in :data:`LR_SCHEDULES`,
    ``clip_global_norm``: the threshold of ``paddle.nn.ClipGradByGlobalNorm`` (None: no clip)."""
    _check(num_stages, layers_per_stage, batch_size, optimizer, lr_schedule, clip_global_norm)
    num_layers = num_stages * layers_per_stage

    def body(init, x, y):
        h = x
        for layer in range(num_layers):
            with pir_chunk_id_guard(layer // layers_per_stage):
                h = paddle.tanh(_linear(init, h, hidden, hidden))
        with pir_chunk_id_guard(num_stages - 1):
            return paddle.mean(paddle.square(h - y))

    def make_batch(step):
        rng = np.random.default_rng(1000 + seed * 7919 + step)
        return {"x": rng.standard_normal((batch_size, hidden)).astype(np.float32),
                "y": (0.5 * rng.standard_normal((batch_size, hidden))).astype(np.float32)}

    specs = [("x", [-1, hidden], "float32"), ("y", [-1, hidden], "float32")]
    return _build(body, specs, make_batch, num_stages, batch_size, optimizer, lr, seed,
                  lr_schedule, clip_global_norm)


def build_gpt(num_stages, layers_per_stage=1, hidden=16, heads=2, vocab=32, seq_len=8,
              batch_size=8, optimizer="sgd", lr=0.1, seed=0, lr_schedule="constant",
              clip_global_norm=None, tied_embeddings=False) -> BuiltModel:
    """Tiny GPT: token+position embedding (stage 0), pre-LN blocks with causal multi-head
    attention and a GELU MLP spread evenly over stages, final LN + LM head + mean cross entropy
    in the last stage.  ``tied_embeddings``: the LM head multiplies by the token embedding's
    weight (transposed) instead of a weight of its own.  Other options as :func:`build_mlp`."""
    _check(num_stages, layers_per_stage, batch_size, optimizer, lr_schedule, clip_global_norm)
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    num_layers = num_stages * layers_per_stage
    head_dim = hidden // heads
    mask_np = np.triu(np.full((seq_len, seq_len), -1e4, dtype=np.float32), k=1)

    def block(init, h):
        a = _layer_norm(init, h, hidden)
        # no bias on q/k/v: the key bias has a structurally ~0 gradient (softmax shift
        # invariance), which makes Adam's update sign-unstable between equivalent runs.
        q = _linear(init, a, hidden, hidden, bias=False)
        k = _linear(init, a, hidden, hidden, bias=False)
        v = _linear(init, a, hidden, hidden, bias=False)

        def split_heads(t):
            return paddle.transpose(paddle.reshape(t, [0, 0, heads, head_dim]), [0, 2, 1, 3])

        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / np.sqrt(head_dim))
        mask = paddle.assign(mask_np)
        probs = paddle.nn.functional.softmax(scores + mask, axis=-1)
        ctx = paddle.matmul(probs, v)
        ctx = paddle.reshape(paddle.transpose(ctx, [0, 2, 1, 3]), [0, 0, hidden])
        h = h + _linear(init, ctx, hidden, hidden)
        m = _layer_norm(init, h, hidden)
        m = paddle.nn.functional.gelu(_linear(init, m, hidden, 4 * hidden))
        return h + _linear(init, m, 4 * hidden, hidden)

    def body(init, tokens, labels):
        with pir_chunk_id_guard(0):
            wte = paddle.static.create_parameter([vocab, hidden], "float32",
                                                 attr=init.attr([vocab, hidden], scale=0.5))
            wpe = paddle.static.create_parameter([seq_len, hidden], "float32",
                                                 attr=init.attr([seq_len, hidden], scale=0.5))
            h = paddle.nn.functional.embedding(tokens, wte) + wpe
        for layer in range(num_layers):
            with pir_chunk_id_guard(layer // layers_per_stage):
                h = block(init, h)
        with pir_chunk_id_guard(num_stages - 1):
            h = _layer_norm(init, h, hidden)
            if tied_embeddings:
                logits = paddle.matmul(h, wte, transpose_y=True)
            else:
                logits = _linear(init, h, hidden, vocab)
            loss = paddle.nn.functional.cross_entropy(
                paddle.reshape(logits, [-1, vocab]), paddle.reshape(labels, [-1, 1]))
            return paddle.mean(loss)

    def make_batch(step):
        rng = np.random.default_rng(2000 + seed * 7919 + step)
        tok = rng.integers(0, vocab, size=(batch_size, seq_len + 1)).astype(np.int64)
        return {"tokens": tok[:, :-1].copy(), "labels": tok[:, 1:].copy()}

    specs = [("tokens", [-1, seq_len], "int64"), ("labels", [-1, seq_len], "int64")]
    return _build(body, specs, make_batch, num_stages, batch_size, optimizer, lr, seed,
                  lr_schedule, clip_global_norm)

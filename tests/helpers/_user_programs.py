"""Training programs written the way a user writes them (``paddle.nn`` layers, a real optimizer
with clipping / weight decay / an LR scheduler), and the harness that trains one unsplit on the
full batch and split with a pipesplit plan, in one process.

The program builder only adds what pipesplit asks of a user: ``pir_chunk_id_guard(stage)``
around each stage's layers.  Parameters come from Paddle's own initializers; runs start equal
because every scope runs the startup program right after ``paddle.seed(SEED)``.
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence

import numpy as np

import paddle
from paddle.base.framework import pir_chunk_id_guard

SEED = 7
STEPS = 3
MICRO_BATCH_SIZE = 2
VOCAB, HIDDEN, HEADS, SEQ = 24, 16, 2, 6
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
CLIPS = ("none", "global_norm", "by_norm", "by_value")
LR_SCHEDULES = ("constant", "step", "warmup")
# thresholds that do clip in these models (tests/program/test_training_semantics.py checks it)
CLIP_GLOBAL_NORM = 0.05
CLIP_NORM = 0.02
CLIP_VALUE = 0.002
LEARNING_RATE = {"sgd": 0.1, "momentum": 0.1, "adam": 1e-3, "adamw": 1e-3}


@dataclass(frozen=True)
class Case:
    """One training setup: model, optimizer, clipping, LR schedule, embeddings."""

    model: str = "lm"            # "lm" (Embedding / TransformerEncoderLayer / LayerNorm), "mlp"
    #                              or "cf" (the MLP with a while, a nested if and an if in the loss)
    optimizer: str = "sgd"
    clip: str = "none"
    lr_schedule: str = "constant"
    tied: bool = False           # lm: the LM head multiplies by the embedding's weight
    dropout: float = 0.0
    attention_bias: bool = False  # lm: biases in q / k / v / out projections (Paddle's default)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


@dataclass
class UserProgram:
    main: "paddle.pir.Program"
    startup: "paddle.pir.Program"
    loss: object
    param_names: List[str]
    scheduler: object            # the optimizer's LR scheduler or None


def _learning_rate(case: Case):
    lr = LEARNING_RATE[case.optimizer]
    if case.lr_schedule == "constant":
        return lr
    if case.lr_schedule == "step":
        return paddle.optimizer.lr.StepDecay(lr, step_size=1, gamma=0.5)
    if case.lr_schedule == "warmup":
        return paddle.optimizer.lr.LinearWarmup(lr, warmup_steps=3, start_lr=lr / 4, end_lr=lr)
    raise ValueError(case.lr_schedule)


def _optimizer(case: Case):
    clip = {"none": None, "by_value": None,  # by value: see _minimize
            "global_norm": paddle.nn.ClipGradByGlobalNorm(CLIP_GLOBAL_NORM),
            "by_norm": paddle.nn.ClipGradByNorm(CLIP_NORM)}[case.clip]
    lr = _learning_rate(case)
    if case.optimizer == "sgd":
        return paddle.optimizer.SGD(lr, grad_clip=clip)
    if case.optimizer == "momentum":
        return paddle.optimizer.Momentum(lr, momentum=0.9, grad_clip=clip)
    if case.optimizer == "adam":
        return paddle.optimizer.Adam(lr, grad_clip=clip)
    return paddle.optimizer.AdamW(lr, weight_decay=0.01, grad_clip=clip)


def _minimize(case: Case, loss):
    opt = _optimizer(case)
    if case.clip != "by_value":
        opt.minimize(loss)
        return
    # Paddle 3.3.1's ClipGradByValue has no PIR implementation (its _pir_clip raises
    # NotImplementedError), so clip by value as a user then does: backward, clip, apply
    params_grads = opt.backward(loss)
    opt.apply_gradients([(p, paddle.clip(g, -CLIP_VALUE, CLIP_VALUE)) for p, g in params_grads])


def _lm_body(case: Case, num_stages: int, tokens, labels):
    with pir_chunk_id_guard(0):
        embedding = paddle.nn.Embedding(VOCAB, HIDDEN)
        h = embedding(tokens)
    for stage in range(num_stages):
        with pir_chunk_id_guard(stage):
            # no biases in attention: the key bias has a structurally zero gradient, on which
            # Adam's update is sign-noise (see test_adam_difference_is_bounded)
            h = paddle.nn.TransformerEncoderLayer(HIDDEN, HEADS, 2 * HIDDEN,
                                                  dropout=case.dropout,
                                                  bias_attr=None if case.attention_bias
                                                  else [False, None])(h)
    with pir_chunk_id_guard(num_stages - 1):
        h = paddle.nn.LayerNorm(HIDDEN)(h)
        if case.tied:
            logits = paddle.matmul(h, embedding.weight, transpose_y=True)
        else:
            logits = paddle.nn.Linear(HIDDEN, VOCAB)(h)
        return paddle.nn.functional.cross_entropy(
            paddle.reshape(logits, [-1, VOCAB]), paddle.reshape(labels, [-1, 1])).mean()


def _mlp_body(case: Case, num_stages: int, x, y):
    h = x
    for stage in range(num_stages):
        with pir_chunk_id_guard(stage):
            h = h + paddle.tanh(paddle.nn.Linear(HIDDEN, HIDDEN)(h))
            if case.dropout:
                h = paddle.nn.functional.dropout(h, case.dropout)
    with pir_chunk_id_guard(num_stages - 1):
        return paddle.mean(paddle.square(h - y))


def _cf_body(case: Case, num_stages: int, x, y):
    """The MLP with control flow as dy2static lowers it: a ``while`` (with an ``if`` nested in
    its body) in stage 0, an ``if`` on a tensor in the loss (DeepSeek's criterion: ``if count
    == 0``)."""
    h = x
    for stage in range(num_stages):
        with pir_chunk_id_guard(stage):
            linear = paddle.nn.Linear(HIDDEN, HIDDEN)
            h = h + paddle.tanh(linear(h))
            if stage == 0:
                h = _refine(linear, h)
            if case.dropout:
                h = paddle.nn.functional.dropout(h, case.dropout)
    with pir_chunk_id_guard(num_stages - 1):
        # DeepSeek's criterion counts its valid labels and returns 0 for none; here every label
        # counts (a condition on the micro-batch's contents would make the full batch differ)
        err = paddle.mean(paddle.square(h - y))
        count = paddle.sum(paddle.isfinite(y).astype("float32"))
        return paddle.static.nn.cond(count == 0, lambda: err * 0.0, lambda: err * 2.0)


def _refine(linear, h):
    """Two more residual steps of ``linear`` in a ``while``; the first through an ``if``."""
    def body(i, h):
        step = paddle.static.nn.cond(i < 1, lambda: paddle.tanh(linear(h)),
                                     lambda: 0.5 * paddle.tanh(linear(h)))
        return [i + 1, h + step]
    _, h = paddle.static.nn.while_loop(lambda i, h: i < 2, body,
                                       [paddle.full([1], 0, "int64"), h])
    return h


def feed_specs(case: Case):
    if case.model == "lm":
        return [("tokens", [-1, SEQ], "int64"), ("labels", [-1, SEQ], "int64")]
    return [("x", [-1, HIDDEN], "float32"), ("y", [-1, HIDDEN], "float32")]


def build(case: Case, num_stages: int, train: bool = True, name_loss: bool = True
          ) -> UserProgram:
    """The user's program; ``train=False``: the same model without backward (evaluation).
    ``name_loss``: give the loss a persistable name (``set_persistable_value``) so plans can
    fetch it; without, the program is exactly what ``minimize`` leaves."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        feeds = [paddle.static.data(n, s, d) for n, s, d in feed_specs(case)]
        body = {"lm": _lm_body, "mlp": _mlp_body, "cf": _cf_body}[case.model]
        loss = body(case, num_stages, *feeds)
        if train:
            _minimize(case, loss)
        if name_loss:
            paddle._C_ops.set_persistable_value(loss, "loss")
    lr_name = getattr(main, "lr_name", None)  # an LR scheduler's rate is a parameter too
    names = sorted(p.name for p in main.global_block().all_parameters() if p.name != lr_name)
    return UserProgram(main, startup, loss, names, getattr(main, "lr_scheduler", None))


def batch(case: Case, step: int, batch_size: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    if case.model == "lm":
        tok = rng.integers(0, VOCAB, size=(batch_size, SEQ + 1)).astype(np.int64)
        return {"tokens": tok[:, :-1].copy(), "labels": tok[:, 1:].copy()}
    return {"x": rng.standard_normal((batch_size, HIDDEN)).astype(np.float32),
            "y": (0.5 * rng.standard_normal((batch_size, HIDDEN))).astype(np.float32)}


def new_scope(prog: UserProgram, place=None):
    """A scope with the startup program run from the fixed seed (equal parameters every time)."""
    place = place if place is not None else paddle.CPUPlace()
    scope = paddle.static.Scope()
    paddle.seed(SEED)
    with paddle.static.scope_guard(scope):
        paddle.static.Executor(place).run(prog.startup)
    return scope


def unsplit_forward(prog: UserProgram, scope, full: Dict[str, np.ndarray], m: int) -> List[float]:
    """The (evaluation) program run unsplit on each of the ``m`` micro-batches of ``full``."""
    exe = paddle.static.Executor(paddle.CPUPlace())
    out = []
    with paddle.static.scope_guard(scope):
        for j in range(m):
            part = {k: v[j * MICRO_BATCH_SIZE:(j + 1) * MICRO_BATCH_SIZE]
                    for k, v in full.items()}
            out.append(float(exe.run(prog.main, feed=part, fetch_list=[prog.loss])[0]))
    return out


def read(scope, names) -> Dict[str, np.ndarray]:
    return {n: np.array(scope.find_var(n).get_tensor()) for n in names}


def train_unsplit(case: Case, num_stages: int, m: int, steps: int = STEPS):
    """Full-batch training; per-micro-batch losses from the evaluation program before each
    update.  Returns (losses[step][mb], params)."""
    prog = build(case, num_stages)
    evaluation = build(case, num_stages, train=False)
    scope = new_scope(prog)
    exe = paddle.static.Executor(paddle.CPUPlace())
    losses = []
    with paddle.static.scope_guard(scope):
        for step in range(steps):
            full = batch(case, step, m * MICRO_BATCH_SIZE)
            row = []
            for j in range(m):
                part = {k: v[j * MICRO_BATCH_SIZE:(j + 1) * MICRO_BATCH_SIZE]
                        for k, v in full.items()}
                (loss,) = exe.run(evaluation.main, feed=part, fetch_list=[evaluation.loss])
                row.append(float(loss))
            losses.append(row)
            exe.run(prog.main, feed=full, fetch_list=[prog.loss])
            if prog.scheduler is not None:
                prog.scheduler.step()
    return np.array(losses), read(scope, prog.param_names)


def train_split(case: Case, schedule: str, pp: int, vpp: int, m: int, split_backward=False,
                steps: int = STEPS, fixed_batch: bool = False):
    """The same training through a one-process pipesplit plan: (losses, params, pipeline).
    ``fixed_batch``: every step on the first batch (to see the loss go down)."""
    from pipesplit.ir_utils import PlanRunner
    from pipesplit.passes import apply_pipeline

    prog = build(case, pp * vpp)
    pipeline = apply_pipeline(prog.main, prog.startup, schedule,
                              dict(num_micro_batches=m, pp_degree=pp, vpp_degree=vpp,
                                   split_backward=split_backward))
    scope = new_scope(prog)
    pipeline.init_scope(scope)
    runner = PlanRunner(pipeline.plan, scope, program=prog.main)
    losses = []
    for step in range(steps):
        data = batch(case, 0 if fixed_batch else step, m * MICRO_BATCH_SIZE)
        losses.append([float(x) for x in runner.step(data)])
        if prog.scheduler is not None:
            prog.scheduler.step()
    return np.array(losses), read(scope, prog.param_names), pipeline


def max_diffs(losses, params, ref_losses, ref_params):
    loss_diff = float(np.max(np.abs(np.asarray(losses) - np.asarray(ref_losses))))
    param_diff = max(float(np.max(np.abs(params[n] - ref_params[n]))) for n in ref_params)
    return loss_diff, param_diff


def pairwise_rows(factors: Dict[str, Sequence]) -> List[Dict[str, object]]:
    """A covering design of strength 2: rows in which every pair of values of every two
    factors appears at least once (greedy, deterministic), far fewer than the full product."""
    names = list(factors)
    uncovered = {(a, va, b, vb) for a, b in itertools.combinations(names, 2)
                 for va in factors[a] for vb in factors[b]}
    rows = []
    while uncovered:
        a, va, b, vb = min(uncovered, key=lambda p: (names.index(p[0]), names.index(p[2]),
                                                     list(factors[p[0]]).index(p[1]),
                                                     list(factors[p[2]]).index(p[3])))
        row = {a: va, b: vb}
        for f in names:
            if f in row:
                continue
            row[f] = max(factors[f], key=lambda v: sum(
                (g, row[g], f, v) in uncovered or (f, v, g, row[g]) in uncovered
                for g in row))
        rows.append({f: row[f] for f in names})
        for x, y in itertools.combinations(names, 2):
            uncovered.discard((x, row[x], y, row[y]))
    return rows

"""The model library's own Llama under its own trainer, written as a PaddleFormers user writes a
pretraining script: ``LlamaForCausalLM3DAuto`` + ``LlamaPretrainingCriterion3DAuto`` trained by
``AutoTrainer`` (``to_static=True``, ``pipeline_schedule_mode`` set to a pipesplit schedule).
A tiny random config built in code and synthetic tokens: nothing is downloaded.

``paddleformers_llama.py CONFIGS.json OUT_DIR``: under ``paddle.distributed.launch``, each
configuration of the list (``{"tag", "schedule", "dp", "pp", "vpp", ...}``) trains in turn in
this launch and every rank writes ``OUT_DIR/<tag>.rank<N>.json`` (the losses its trainer logged,
its parameters by name); with ``"reference": true`` (one process, no launcher) the same trainer
runs in dygraph with no pipeline over the same batches.  A configuration may also ``"save"`` at
a step and ``"resume"`` from that checkpoint, or ``"eval"`` during training.

The trainer's own limits on Paddle 3.3.1 (for every pipeline pass, Paddle's own included) and
what this script does around them, as a user would:

* its pipeline eval step calls ``model._p2p_helper``, which a ``DistModel`` has none of: the
  evaluation runs ``dist_model.eval()`` + the model on the eval batches (the engine's eval
  program) between training steps, from a callback;
* its resume hands ``dist.load_state_dict`` a nested ``{model, optimizer}`` dict, which Paddle
  refuses: the resumed run loads the saved distributed checkpoint with
  ``dist.load_state_dict(dist_model.state_dict(), path)`` itself, then trains the remaining steps;
* under auto-parallel every process writes the checkpoint's ``trainer_state.json``
  (``should_save`` is true on each), and the processes of one machine share the file: two
  truncate-and-write's can interleave (the last stage's state logs the losses, so it is longer)
  and leave one process's document with the other's tail, which the resumed run cannot parse.
  Each process writes it whole instead (:func:`save_state_whole`).
"""
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

from pipesplit.passes import cpu_support, strategy as pipesplit_strategy

pipesplit_strategy.enable_strategy()  # before the trainer builds anything
cpu_support.enable()

from paddleformers.trainer import AutoTrainingArguments, TrainerCallback  # noqa: E402
from paddleformers.trainer.auto_trainer import AutoTrainer  # noqa: E402
from paddleformers.trainer.trainer_callback import TrainerState  # noqa: E402
from paddleformers.transformers import (LlamaConfig, LlamaForCausalLM3DAuto,  # noqa: E402
                                        LlamaPretrainingCriterion3DAuto)

VOCAB, SEQ, HIDDEN, LAYERS, HEADS = 128, 16, 64, 4, 4
SEED = 2024


@dataclass
class PreTrainingArguments(AutoTrainingArguments):
    """The library's pretraining example adds the schedule to the trainer's arguments (its
    ``TrainingArguments.__post_init__`` reads ``pipeline_schedule_mode``)."""

    pipeline_schedule_mode: str = field(default="1F1B", metadata={"help": "FThenB, 1F1B, VPP, ..."})


def load_flattened(state_dict: dict, path: str) -> None:
    """``dist.load_state_dict`` of the trainer's nested ``{model, optimizer}`` dict: Paddle
    3.3.1 refuses a nested dict there, while its ``dist.save_state_dict`` wrote the same dict
    flattened to ``"model.<name>"`` / ``"optimizer.<name>"`` keys; the tensors are loaded in
    place."""
    dist.load_state_dict({f"{part}.{name}": value for part, values in state_dict.items()
                          for name, value in values.items()}, path)


def save_state_whole(self, json_path: str) -> None:
    """``TrainerState.save_to_json``, the file replaced whole (a process's own temporary file,
    then ``os.replace``): a reader sees one process's document, never two interleaved."""
    text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
    partial = f"{json_path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, json_path)


TrainerState.save_to_json = save_state_whole


class PretrainingTrainer(AutoTrainer):
    """The trainer, resuming the way a user makes it resume on Paddle 3.3.1 (for every
    pipeline pass, Paddle's own included): see :func:`load_flattened`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._load_ckpt_func = load_flattened

    def prediction_pipeline_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # the trainer's pipeline eval step drives a dygraph pipeline model (_p2p_helper,
        # eval_batch), which a DistModel has none of: evaluate with the DistModel's own eval
        # program instead (the loss on the last stage's ranks; the others log its broadcast)
        labels = inputs["labels"]
        model.eval()
        loss = model(inputs["input_ids"], labels)
        model.train()
        # (one loss per micro-batch, as in training, where the trainer sums them / acc)
        loss = paddle.to_tensor(0.0 if loss is None else np.mean(loss), dtype="float32")
        return loss, None, None

    def _get_train_sampler(self):
        # pretraining data comes shuffled already (the library's pretraining example reads it
        # in order too); a shuffled sampler would also draw its order from the global RNG after
        # a resume's checkpoint load set the engine up, so resumed and uninterrupted runs would
        # see different batches
        return paddle.io.BatchSampler(
            dataset=self.train_dataset, shuffle=False, drop_last=self.args.dataloader_drop_last,
            batch_size=self.args.per_device_train_batch_size * self.args.dataset_world_size
            * self.args.gradient_accumulation_steps)


class SyntheticTokens(paddle.io.Dataset):
    """Seeded random token sequences; the labels are the inputs shifted by one."""

    def __init__(self, samples: int, seed: int = 7, skip: int = 0):
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(0, VOCAB, size=(samples, SEQ + 1)).astype("int64")[skip:]

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i, :-1], "labels": self.tokens[i, 1:]}

    def __len__(self):
        return len(self.tokens)


class RecordLosses(TrainerCallback):
    def __init__(self):
        self.losses, self.eval_losses = [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if logs and "eval_loss" in logs:
            self.eval_losses.append(float(logs["eval_loss"]))


def training_arguments(cfg: dict, out_dir: Path) -> PreTrainingArguments:
    dp, pp, micro, acc = cfg.get("dp", 1), cfg.get("pp", 1), cfg.get("micro", 1), cfg.get("acc", 4)
    reference = cfg.get("reference", False)
    args = PreTrainingArguments(
        output_dir=str(out_dir / f"ckpt_{cfg['tag']}"),
        enable_auto_parallel=True,
        to_static=not reference,
        pipeline_parallel_degree=1 if reference else pp,
        pipeline_schedule_mode=cfg.get("schedule", "1F1B"),
        # the reference sees each step's whole batch in one process
        per_device_train_batch_size=micro * dp if reference else micro,
        gradient_accumulation_steps=acc,
        max_steps=cfg.get("steps", 4),
        learning_rate=1e-3,
        warmup_steps=2,
        lr_scheduler_type="constant_with_warmup",
        max_grad_norm=1.0,
        weight_decay=0.01,
        logging_steps=1,
        save_strategy="steps" if cfg.get("save") else "no",
        save_steps=cfg.get("save") or 500,
        do_eval=bool(cfg.get("eval")),
        evaluation_strategy="steps" if cfg.get("eval") else "no",
        eval_steps=cfg.get("eval") or 500,
        per_device_eval_batch_size=micro * acc * (dp if reference else 1),
        # resuming, the trainer would skip its data by micro-batches where each of its batches
        # is a whole step here (pipeline + to_static): the resumed run is given the data from
        # the samples the checkpoint consumed on instead (see run)
        ignore_data_skip=bool(cfg.get("resume")),
        seed=SEED,
        recompute=cfg.get("recompute", False),
        # the optimizer states sharded over dp ("stage1" / "stage2"; the reference has no dp)
        sharding="" if reference else cfg.get("sharding", ""),
        dataloader_drop_last=True,
        report_to=[],
        disable_tqdm=True,
    )
    if not reference and cfg.get("vpp", 1) > 1:  # the trainer has no argument for these
        args.strategy.pipeline.vpp_degree = cfg["vpp"]
        args.strategy.pipeline.vpp_seg_method = "LlamaDecoderLayerAuto"
    return args


def llama_config(args: PreTrainingArguments, cfg: dict) -> LlamaConfig:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         max_position_embeddings=SEQ, seq_length=SEQ, rms_norm_eps=1e-6,
                         use_flash_attention=False, fuse_attention_qkv=False,
                         fuse_attention_ffn=False, recompute=cfg.get("recompute", False))
    config.tensor_parallel_degree = args.tensor_parallel_degree
    config.sequence_parallel = False
    return config


def parameters(model) -> tuple:
    """(name -> the whole parameter, flattened, for those this rank holds whole; name -> its
    block of a parameter sharded over ranks (``sharding="stage3"``): where it starts in the
    whole, its shape, its values)."""
    whole, shards = {}, {}
    state = model.state_dict("param") if isinstance(model, dist.DistModel) else model.state_dict()
    for name, value in state.items():
        if not isinstance(value, paddle.Tensor):
            continue
        local = value._local_value() if value.is_dist() else value
        if not local._is_initialized() or local.numel() == 0:
            continue
        values = local.numpy().astype("float64")
        if list(values.shape) == list(value.shape):
            whole[name] = values.ravel().tolist()
        else:
            shards[name] = {"shape": list(value.shape), "start": block_start(value),
                            "block": list(values.shape), "values": values.ravel().tolist()}
    return whole, shards


def block_start(value) -> list:
    """Where this rank's block of a dist tensor starts in the whole (a Shard(d) per mesh
    axis, Paddle's even split)."""
    mesh = value.process_mesh
    ids = np.asarray(mesh.process_ids).reshape(mesh.shape)
    coord = np.argwhere(ids == dist.get_rank())[0]
    start = [0] * len(value.shape)
    for axis, placement in enumerate(value.placements):
        if placement.is_shard():
            d = placement.get_dim()
            start[d] += int(coord[axis]) * -(-int(value.shape[d]) // int(mesh.shape[axis]))
    return start


def run(cfg: dict, out_dir: Path) -> None:
    args = training_arguments(cfg, out_dir)
    paddle.seed(SEED)
    model = LlamaForCausalLM3DAuto(llama_config(args, cfg))
    criterion = LlamaPretrainingCriterion3DAuto(model.config)
    losses = RecordLosses()
    step_samples = cfg.get("micro", 1) * cfg.get("dp", 1) * cfg.get("acc", 4)
    samples = 2 * step_samples * cfg.get("steps", 4)
    consumed = step_samples * cfg.get("resume_step", 0)
    trainer = PretrainingTrainer(model=model, criterion=criterion, args=args,
                                 train_dataset=SyntheticTokens(samples, skip=consumed),
                                 eval_dataset=SyntheticTokens(step_samples, seed=11) if cfg.get("eval") else None,
                                 callbacks=[losses])
    trainer.train(resume_from_checkpoint=cfg.get("resume") and str(out_dir / cfg["resume"]))
    rank = dist.get_rank() if not cfg.get("reference") else 0
    trained = trainer.model_wrapped if args.to_static else model  # (the DistModel's own)
    names = set(model.state_dict())
    whole, shards = parameters(trained)
    record = {"losses": losses.losses, "eval_losses": losses.eval_losses,
              "parameters": {k: v for k, v in whole.items() if k in names},
              "shards": {k: v for k, v in shards.items() if k in names}}
    (out_dir / f"{cfg['tag']}.rank{rank}.json").write_text(json.dumps(record))


def main() -> int:
    configs = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    for cfg in configs:
        # fresh names and a fresh scope for each model, as in a new process
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            run(cfg, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The data a pipeline is trained on, checked before Paddle's engine sees it.

The engine splits every batch into ``strategy.pipeline.accumulate_steps`` micro-batches of one
static size.  A loader that breaks that fails deep inside Paddle, and on one rank only (the
others then wait for it): an empty loader with ``IndexError: index 0 is out of bounds``, a
last batch smaller than the others with a ``ReshapeOp`` error on the first stage and a bare
``std::exception`` on the next.  These checks read only the loader's sampler (no data is
drawn), so every rank reaches the same verdict before any collective.  A loader whose length
is unknown (an ``IterableDataset``) is not checked.  A last batch smaller than the others is
not refused there: a trainer that stops at ``max_steps`` never draws it (Paddle's own
schedules train such a loader); each batch a step is given is checked instead
(:func:`check_batch`: the same size as the first), on the global shapes every rank sees
alike.  Labels of the wrong type
for the loss are found in the engine's whole traced program (every rank holds it), before it
is split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class BatchSize:
    """What one batch of a sampler holds: Paddle's ``BatchSampler`` and
    ``DistributedBatchSampler`` yield ``batch_size * _acc_steps`` samples per batch (Paddle's
    auto-parallel tests set ``sampler._acc_steps = accumulate_steps`` on a sampler of
    ``batch_size = micro-batch size``; ``dist.shard_dataloader`` carries it over)."""

    batch_size: int
    acc_steps: int = 1

    @property
    def samples(self) -> int:
        return self.batch_size * self.acc_steps

    def __str__(self) -> str:
        if self.acc_steps == 1:
            return f"batch_size={self.batch_size}"
        return (f"batch_size={self.batch_size} x the sampler's _acc_steps={self.acc_steps} = "
                f"{self.samples}")


def check_loader(loader, accumulate_steps: int) -> None:
    """``ValueError`` naming the ``DataLoader`` argument and what to change when ``loader``
    (a ``paddle.io.DataLoader`` or a ``dist.shard_dataloader``) yields no batch, or batches
    that ``accumulate_steps`` does not divide: what no step could train.  A short last batch
    is left to the step that draws it (:func:`check_batch`).  A batch is
    what the sampler yields: ``batch_size`` samples, times its ``_acc_steps`` (Paddle's
    micro-batch sampler convention, :class:`BatchSize`), per rank for a
    ``DistributedBatchSampler``."""
    sizes = _batch_sizes(loader)
    if sizes is None:
        return
    batches, batch_size, _last = sizes
    if batches == 0:
        raise ValueError(
            "the DataLoader given to dist.to_static yields no batch (its dataset is empty, or "
            "smaller than a batch with drop_last=True); give it at least one batch of "
            f"{batch_size} samples")
    if batch_size.samples % accumulate_steps:
        raise ValueError(
            f"the DataLoader's batches hold {batch_size} samples (on this rank), not a "
            f"multiple of strategy.pipeline.accumulate_steps={accumulate_steps} (every batch "
            "is split into that many micro-batches of one size); change either")


def leading_dims(tensors) -> tuple:
    """The first dimension of each tensor a step is given (its global shape: every rank sees
    it alike, a rank outside a feed's mesh too); None where it has none."""
    return tuple(int(t.shape[0]) if getattr(t, "shape", None) else None for t in tensors)


def check_batch(dims: tuple, first: tuple, names, step: int, mode: str) -> None:
    """``ValueError`` before ``mode`` step ``step`` runs when the batch it is given
    (:func:`leading_dims`, in feed order ``names``) holds another number of samples than the
    mode's first step had (the sizes the program was traced with: the engine traces it from
    the loader's first batch): a loader's short last batch, refused by every rank at the same
    step, before any collective."""
    for now, then, name in zip(dims, first, list(names) + [None] * len(dims)):
        if now is not None and then is not None and now != then:
            raise ValueError(
                f"{mode} step {step} is given a batch of {now} samples in "
                f"{name or 'a feed'!r}, but the pipeline's program was built for batches of "
                f"{then} (every batch is cut into strategy.pipeline.accumulate_steps "
                "micro-batches of one size): a DataLoader's short last batch; pass "
                "drop_last=True to the BatchSampler / paddle.io.DataLoader, or stop before "
                "that batch (pipesplit checks each batch a step is given, not the loader's "
                "last)")


def _batch_sizes(loader) -> Optional[Tuple[int, BatchSize, int]]:
    """(number of batches, what a batch holds, samples of the last batch) from the loader's
    batch sampler, or None when they cannot be known without drawing data."""
    sampler = getattr(loader, "batch_sampler", None)
    if sampler is None:  # dist.shard_dataloader keeps the user's loader inside
        inner = getattr(loader, "_dataloader", None)
        sampler = getattr(inner, "batch_sampler", None)
    batch_size = getattr(sampler, "batch_size", None)
    acc_steps = getattr(sampler, "_acc_steps", 1)
    if not all(isinstance(n, int) and n > 0 for n in (batch_size, acc_steps)):
        return None
    size = BatchSize(batch_size, acc_steps)
    samples = _samples_of(sampler)
    if samples is None:
        return None
    full, rest = divmod(samples, size.samples)
    if getattr(sampler, "drop_last", False) or rest == 0:
        return full, size, size.samples
    return full + 1, size, rest


def _samples_of(sampler) -> Optional[int]:
    """How many samples one epoch of ``sampler`` draws (on this rank)."""
    num_samples = getattr(sampler, "num_samples", None)  # DistributedBatchSampler: per rank
    if isinstance(num_samples, int):
        return num_samples
    inner = getattr(sampler, "sampler", None)
    try:
        return len(inner) if inner is not None else None
    except TypeError:  # a sampler over an IterableDataset has no length
        return None


#: Paddle's hard-label cross entropy and the position of its label operand
_HARD_LABEL_LOSSES = {"pd_op.cross_entropy_with_softmax": 1}


def check_labels_are_class_ids(program) -> None:
    """``ValueError`` when the loss reads float labels as class indices (``cross_entropy`` with
    ``soft_label=False``): Paddle traces it, then the loss's rank fails at run time while the
    others wait for it (a gloo timeout)."""
    for op in program.global_block().ops:
        index = _HARD_LABEL_LOSSES.get(op.name())
        if index is None or op.attrs().get("soft_label", False):
            continue
        dtype = str(op.operand_source(index).dtype).replace("paddle.", "")
        if dtype.startswith(("float", "bfloat", "complex")):
            raise ValueError(
                f"the loss's cross_entropy (soft_label=False) reads the labels as class indices, "
                f"but they are {dtype}: the DataLoader must yield integer labels (int64), or the "
                "loss must say soft_label=True for class probabilities")

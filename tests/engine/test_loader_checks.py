"""The loader checks made before the engine (``passes.loader_checks``) on real
``paddle.io.DataLoader`` objects: what Paddle would fail on deep inside, on one rank, is
refused with the DataLoader argument to change; good loaders pass, and so does a loader whose
short last batch a trainer stopping at ``max_steps`` never draws (that batch is refused by the
step given it: ``check_batch``)."""
import numpy as np
import paddle
import pytest

from pipesplit.passes.engine.loader_checks import check_loader


class Samples(paddle.io.Dataset):
    def __init__(self, n):
        self.x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)

    def __getitem__(self, i):
        return self.x[i], np.int64(i % 2)

    def __len__(self):
        return len(self.x)


class Stream(paddle.io.IterableDataset):
    def __iter__(self):
        yield np.zeros(3, np.float32), np.int64(0)


def _loader(n, batch_size, drop_last=False):
    return paddle.io.DataLoader(Samples(n), batch_size=batch_size, drop_last=drop_last)


@pytest.mark.parametrize("n,batch_size,drop_last", [(8, 4, False), (10, 4, True), (4, 4, False)])
def test_full_batches_pass(n, batch_size, drop_last):
    check_loader(_loader(n, batch_size, drop_last), accumulate_steps=2)


def test_an_iterable_dataset_is_not_checked():
    check_loader(paddle.io.DataLoader(Stream(), batch_size=4), accumulate_steps=4)


def test_a_distributed_batch_sampler_counts_this_ranks_samples():
    sampler = paddle.io.DistributedBatchSampler(Samples(16), batch_size=4, num_replicas=2, rank=0)
    check_loader(paddle.io.DataLoader(Samples(16), batch_sampler=sampler), accumulate_steps=4)
    sampler = paddle.io.DistributedBatchSampler(Samples(12), batch_size=4, num_replicas=2, rank=0)
    check_loader(paddle.io.DataLoader(Samples(12), batch_sampler=sampler), accumulate_steps=4)


def _micro_batch_loader(n, micro, acc_steps, drop_last=True):
    """Paddle's auto-parallel tests: a sampler of micro-batches, ``_acc_steps`` per batch."""
    sampler = paddle.io.BatchSampler(Samples(n), batch_size=micro, drop_last=drop_last)
    sampler._acc_steps = acc_steps
    return paddle.io.DataLoader(Samples(n), batch_sampler=sampler)


def test_a_micro_batch_sampler_counts_batch_size_times_acc_steps():
    loader = _micro_batch_loader(16, micro=2, acc_steps=4)
    assert [len(batch) for batch in loader.batch_sampler] == [8, 8]  # what Paddle yields
    check_loader(loader, accumulate_steps=4)
    with pytest.raises(ValueError, match=r"batches hold batch_size=2 x the sampler's "
                                         r"_acc_steps=3 = 6 samples \(on this rank\), not a "
                                         r"multiple of strategy.pipeline.accumulate_steps=4"):
        check_loader(_micro_batch_loader(18, micro=2, acc_steps=3), accumulate_steps=4)
    # a short last batch (2 of 8) is the step's business, not the loader's
    check_loader(_micro_batch_loader(10, micro=2, acc_steps=4, drop_last=False),
                 accumulate_steps=4)


def test_shard_dataloader_keeps_the_acc_steps_per_rank():
    """``dist.shard_dataloader(..., shard_dims="dp")`` makes a DistributedBatchSampler of
    batch_size / dp per rank and carries ``_acc_steps`` over: this rank (0 of dp 2) draws
    batch_size / 2 x _acc_steps samples per batch."""
    import paddle.distributed as dist

    paddle.disable_static()
    mesh = dist.ProcessMesh([0, 1], dim_names=["dp"])
    sharded = dist.shard_dataloader(_micro_batch_loader(32, micro=2, acc_steps=4),
                                    meshes=[mesh], shard_dims="dp")
    sampler = sharded._dataloader.batch_sampler
    assert isinstance(sampler, paddle.io.DistributedBatchSampler)
    assert (sampler.batch_size, sampler._acc_steps) == (1, 4)
    check_loader(sharded, accumulate_steps=4)
    with pytest.raises(ValueError, match=r"batch_size=1 x the sampler's _acc_steps=4 = 4 "
                                         r"samples \(on this rank\), not a multiple of "
                                         r"strategy.pipeline.accumulate_steps=3"):
        check_loader(sharded, accumulate_steps=3)


@pytest.mark.parametrize("loader,steps,message", [
    (lambda: _loader(0, 4), 2, "yields no batch"),
    (lambda: _loader(3, 4, drop_last=True), 2, "yields no batch"),
    (lambda: _loader(12, 6), 4, r"batches hold batch_size=6 samples \(on this rank\), not a multiple of "
                                r"strategy.pipeline.accumulate_steps=4"),
])
def test_a_loader_the_pipeline_cannot_split_is_refused(loader, steps, message):
    with pytest.raises(ValueError, match=message):
        check_loader(loader(), accumulate_steps=steps)


@pytest.mark.parametrize("n,drop_last", [(10, False), (18, False), (10, True)])
def test_a_short_last_batch_is_not_refused_before_a_step_draws_it(n, drop_last):
    """PaddleNLP's pretraining loader: 223 samples in batches of 8, training stops at
    max_steps; Paddle's own schedules train it, so the loader check must too."""
    check_loader(_loader(n, 4, drop_last), accumulate_steps=2)


def test_the_batch_a_step_is_given_is_checked_against_the_first():
    from pipesplit.passes.engine.loader_checks import check_batch, leading_dims

    first = leading_dims([paddle.zeros([8, 3]), paddle.zeros([8], "int64")])
    assert first == (8, 8)
    check_batch(first, first, ["input0", "label0"], step=1, mode="train")
    short = leading_dims([paddle.zeros([7, 3]), paddle.zeros([7], "int64")])
    with pytest.raises(ValueError, match=r"^train step 3 is given a batch of 7 samples in "
                                         r"'input0', but the pipeline's program was built for "
                                         r"batches of 8 .*pass drop_last=True"):
        check_batch(short, first, ["input0", "label0"], step=3, mode="train")


def _loss_program(label_dtype, soft_label=False):
    from paddle import _C_ops

    main = paddle.static.Program()
    with paddle.static.program_guard(main, paddle.static.Program()):
        logits = paddle.static.data("logits", [4, 10], "float32")
        labels = paddle.static.data("labels", [4, 1], label_dtype)
        _C_ops.cross_entropy_with_softmax(logits, labels, soft_label, True, True, -100, -1)
    return main


def test_float_labels_for_a_hard_label_loss_are_refused(static_mode):
    from pipesplit.passes.engine.loader_checks import check_labels_are_class_ids

    check_labels_are_class_ids(_loss_program("int64"))
    with pytest.raises(ValueError, match="reads the labels as class indices, but they are "
                                         "float32: the DataLoader must yield integer labels"):
        check_labels_are_class_ids(_loss_program("float32"))

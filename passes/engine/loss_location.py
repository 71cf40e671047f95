"""The loss where Paddle's own schedules leave it and trainers read it: on the ranks of the
last pipeline stage's mesh.

A looped placement computes the loss on the last stage's ranks already.  A V placement (ZBV,
DualPipeV, autoV ...) brings the last virtual stage back to pipeline rank 0, so the loss is
computed on the first stage's mesh: each process there hands its value to the process at the
same mesh coordinate on the last stage, once per step after the last micro-batch (one small
array through the launcher's store), and returns None as Paddle's non-last stages do.
"""
from __future__ import annotations

import io

import numpy as np

from pipesplit.job_list.placement import Placement
from pipesplit.job_list.pipe import Pipe
from pipesplit.passes.transport.launch_store import launch_store, round_key

#: the modes whose step returns a loss (prediction returns the outputs where Paddle puts them)
LOSS_MODES = ("train", "eval")


def loss_rank(placement: Placement) -> int:
    """The pipeline rank that computes the loss: the one holding the last virtual stage."""
    return placement.rank_of(placement.num_stages - 1)


def hand_the_loss_on(logs: dict, pipe: Pipe, placement: Placement, process: int,
                     return_numpy: bool = True, store=None) -> dict:
    """The engine's ``logs`` of one step on ``process``, with the loss moved from the rank that
    computes it to the last stage's rank at the same coordinate (the others keep theirs)."""
    giver, taker = loss_rank(placement), placement.pp - 1
    if giver == taker:
        return logs
    me = pipe.rank_of(process)
    if me not in (giver, taker):
        return logs
    store = store if store is not None else launch_store()
    # (the giver and the taker count the same steps: one key for each step's loss)
    key = f"{round_key('loss', process, store)}/{pipe.process_of(taker)}"
    if me == giver:
        if logs.get("loss") is None:
            raise RuntimeError(f"pipesplit: pipeline rank {giver} computes the loss "
                               f"({placement.kind} placement) but the step fetched none")
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(logs["loss"]), allow_pickle=False)
        store.set(key, buffer.getvalue())
        return {**logs, "loss": None, "outputs": None}
    value = np.load(io.BytesIO(bytes(store.get(key))), allow_pickle=False)
    if not return_numpy:
        from paddle.base import core

        tensor = core.DenseTensor()
        tensor.set(value, core.CPUPlace())
        value = tensor
    return {**logs, "loss": value, "outputs": value}

"""The loss where Paddle's own schedules leave it and trainers read it: on the ranks of the
last pipeline stage's mesh.

A looped placement computes the loss on the last stage's ranks already.  A V placement (ZBV,
DualPipeV, autoV ...) brings the last virtual stage back to pipeline rank 0, so the loss is
computed on the first stage's mesh: each process there hands its value to the process at the
same mesh coordinate on the last stage, once per step after the last micro-batch, and returns
None as Paddle's non-last stages do.

What carries it between the two processes is the engine's transport's choice
(:meth:`~pipesplit.passes.transport.base.Transport.loss_carrier`, the carriers in
:mod:`pipesplit.passes.transport.loss_carriers`): a world gather on CPU, the launcher's TCP store
with NCCL.
"""
from __future__ import annotations

import numpy as np

from pipesplit.job_list.placement import Placement
from pipesplit.job_list.pipe import Pipe

#: the modes whose step returns a loss (prediction returns the outputs where Paddle puts them)
LOSS_MODES = ("train", "eval")


def loss_rank(placement: Placement) -> int:
    """The pipeline rank that computes the loss: the one holding the last virtual stage."""
    return placement.rank_of(placement.num_stages - 1)


def hand_the_loss_on(logs: dict, pipe: Pipe, placement: Placement, process: int,
                     return_numpy: bool = True, *, carrier) -> dict:
    """The engine's ``logs`` of one step on ``process``, with the loss moved from the rank that
    computes it to the last stage's rank at the same coordinate (the others keep theirs).
    ``carrier``: the engine's transport's carrier
    (:mod:`~pipesplit.passes.transport.loss_carriers`; a gathered loss needs every process to
    call this)."""
    giver, taker = loss_rank(placement), placement.pp - 1
    if giver == taker:
        return logs
    me = pipe.rank_of(process)
    if me == giver:
        if logs.get("loss") is None:
            raise RuntimeError(f"pipesplit: pipeline rank {giver} computes the loss "
                               f"({placement.kind} placement) but the step fetched none")
        carrier.give(np.asarray(logs["loss"]), process, pipe.process_of(taker))
        return {**logs, "loss": None, "outputs": None}
    if me != taker:
        carrier.stand_by(process)
        return logs
    value = carrier.take(process, pipe.process_of(giver))
    if not return_numpy:
        from paddle.base import core

        tensor = core.DenseTensor()
        tensor.set(value, core.CPUPlace())
        value = tensor
    return {**logs, "loss": value, "outputs": value}

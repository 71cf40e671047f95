"""Paddle strategies for the single-process strategy tests."""
from __future__ import annotations

import paddle

PP, VPP, M = 2, 2, 4


def pipeline_section(mode: str, pp: int = PP, vpp: int = VPP, m: int = M,
                     split_backward: bool = False):
    """A ``dist.Strategy().pipeline`` section with the pipeline on and these fields."""
    s = paddle.distributed.Strategy()
    s.pipeline.enable = True
    s.pipeline.schedule_mode = mode
    s.pipeline.pp_degree = pp
    s.pipeline.vpp_degree = vpp
    s.pipeline.accumulate_steps = m
    s.pipeline.split_backward = split_backward
    return s.pipeline

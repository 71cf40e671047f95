"""ir_utils.clip: clip ops fed with a SUM over k micro-batches act on the average."""
from __future__ import annotations

import numpy as np
import pytest

import paddle

from pipesplit.ir_utils.clip import clip_the_average

K = 4


def _run(build, clip_the_sum: bool, x: np.ndarray):
    """``build(s)`` returns the clipped value of the gradient sum ``s``; the program then scales
    it by 1/K as the gradient-merge optimizer does."""
    paddle.enable_static()
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            s = paddle.static.data("s", list(x.shape), "float32")
            out = paddle.scale(build(s), 1.0 / K)
        if clip_the_sum:
            rewritten = clip_the_average(main, K)
            assert rewritten == 1
        exe = paddle.static.Executor(paddle.CPUPlace())
        return exe.run(main, feed={"s": x}, fetch_list=[out])[0]
    finally:
        paddle.disable_static()


def _global_norm(s, c=0.5):
    norm = paddle.sqrt(paddle.sum(paddle.square(s)))
    bound = paddle.full([], c, "float32")
    return s * paddle.divide(paddle.full([], c, "float32"), paddle.maximum(norm, bound))


CASES = {
    "global_norm": _global_norm,
    "clip_by_norm": lambda s: paddle._C_ops.clip_by_norm(s, 0.5),
    "clip_by_value": lambda s: paddle.clip(s, -0.2, 0.2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_clip_of_the_sum_becomes_clip_of_the_average(name):
    rng = np.random.default_rng(0)
    total = rng.normal(size=(8,)).astype("float32") * 2  # a sum of K gradients that clips
    got = _run(CASES[name], True, total)
    want = _run(lambda s: CASES[name](paddle.scale(s, 1.0 / K)) * K, False, total)
    plain = _run(CASES[name], False, total)
    assert np.max(np.abs(got - want)) <= 1e-6
    assert np.max(np.abs(plain - want)) > 1e-3  # the threshold really bites

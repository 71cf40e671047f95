"""Several DistModels in one process and pipesplit switched on or off between them, through
the engine on two processes, all cases in ONE launch (``tests/workers/engine_several_models.py``):

* two pipesplit DistModels (ZBV then 1F1B, 1F1B then ZBH1), trained in turn, each equal to its
  one-process reference (``dist.to_static`` no longer leaves the next model Paddle's first
  names: the two would share their parameters in the scope);
* pipesplit's ZBV, then ``disable_strategy()``, then Paddle's own 1F1B: both train right
  (the ZBV engine keeps its pipesplit routing while it lives);
* Paddle's own 1F1B, then ``enable_strategy()``: that engine is stopped at its next call with
  a ``ValueError`` saying ``enable_strategy()`` comes before ``dist.to_static``; a pipesplit
  ZBV built after trains right;
* a second model built under a fresh name generator (its parameters named as the first's):
  refused at ``dist.to_static`` with a ``RuntimeError`` naming the first engine and the way
  out, on every rank; the first still trains right.
"""
from __future__ import annotations

import pytest

from _paths import WORKERS

SCRIPT = WORKERS / "engine_several_models.py"
TOL = 1e-5
TRAINED = "trained"
BUILT_BEFORE = ("step 0: ValueError: this engine was built before "
                "pipesplit.passes.strategy.enable_strategy() was called: call "
                "enable_strategy() (and cpu_support.enable() on a CPU build) before "
                "dist.to_static")
SAME_NAMES = ("to_static: RuntimeError: dist.to_static: this model's parameters "
              "['embedding_0.w_0.dist', 'embedding_1.w_0.dist', 'layer_norm_0.b_0.dist'] ... "
              "have the names of the parameters of a DistModel built earlier in this process "
              "(schedule 'ZBV', still alive)")
EXPECTED = {  # case -> per model (in build order): TRAINED or the start of its error line
    "two_pipesplit_zbv_then_1f1b": [TRAINED, TRAINED],
    "two_pipesplit_1f1b_then_zbh1": [TRAINED, TRAINED],
    "pipesplit_zbv_then_paddle_1f1b": [TRAINED, TRAINED],
    "paddle_1f1b_then_pipesplit_zbv": [BUILT_BEFORE, TRAINED],
    "same_names_again": [TRAINED, SAME_NAMES],
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from _launch import launch_for_json

    return launch_for_json(tmp_path_factory.mktemp("several_models"), SCRIPT)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_each_model_trains_as_alone_or_is_stopped_with_its_cause(results, case):
    by_rank = results[case]
    assert set(by_rank) == {"0", "1"}
    losses_compared = [0] * len(EXPECTED[case])
    for rank, models in by_rank.items():
        assert len(models) == len(EXPECTED[case]), (case, rank)
        for i, (got, expected) in enumerate(zip(models, EXPECTED[case])):
            where = (case, rank, got["schedule"])
            if expected != TRAINED:
                assert got.get("error", "").startswith(expected), (where, got)
                continue
            assert "error" not in got, (where, got)
            assert got["param_diff"] <= TOL, where
            if got["loss_diff"] is not None:  # (the ranks of the last stage hold the loss)
                assert got["loss_diff"] <= TOL, where
                losses_compared[i] += 1
    assert all(n == 1 for n, e in zip(losses_compared, EXPECTED[case]) if e == TRAINED), \
        (case, losses_compared)

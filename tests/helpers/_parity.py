"""Shared machinery of the parity tests: build each model once, compute each unsplit baseline
once, and compare a pipesplit plan's losses and parameters with it."""
from __future__ import annotations

import functools

import numpy as np

from pipesplit.ir_utils import (PlanRunner, build_gpt, build_mlp, init_scope, read_params,
                                run_unsplit_baseline)
from pipesplit.passes import apply_pipeline

STEPS = 3
TOL = 1e-6
MICRO_BATCH_SIZE = 2
LEARNING_RATE = {"sgd": 0.1, "adam": 1e-3}


@functools.lru_cache(maxsize=None)
def model(kind: str, optimizer: str, num_stages: int, batch_size: int):
    build = build_gpt if kind == "gpt" else build_mlp
    return build(num_stages, batch_size=batch_size, optimizer=optimizer,
                 lr=LEARNING_RATE[optimizer], seed=1)


@functools.lru_cache(maxsize=None)
def baseline(kind: str, optimizer: str, num_stages: int, m: int, place=None):
    built = model(kind, optimizer, num_stages, m * MICRO_BATCH_SIZE)
    return run_unsplit_baseline(built, STEPS, m, place=place)


def run_pipeline(kind, optimizer, schedule, pp, vpp, m, split_backward=False, place=None,
                 **attrs):
    """Train ``STEPS`` steps with the plan; return (losses[step][mb], params, PipelinePlan).
    ``attrs``: further pass attrs (e.g. ``costs`` for auto)."""
    built = model(kind, optimizer, pp * vpp, m * MICRO_BATCH_SIZE)
    pipeline = apply_pipeline(built.main, built.startup, schedule,
                              dict(num_micro_batches=m, pp_degree=pp, vpp_degree=vpp,
                                   split_backward=split_backward, **attrs))
    scope = init_scope(built, pipeline.split, place=place)
    runner = PlanRunner(pipeline.plan, scope, place=place)
    losses = [runner.step(built.make_batch(step)) for step in range(STEPS)]
    return np.array(losses, dtype=np.float64), read_params(scope, built.param_names), pipeline


def assert_matches_unsplit(kind, optimizer, schedule, pp, vpp, m, split_backward=False,
                           place=None, **attrs):
    losses, params, pipeline = run_pipeline(kind, optimizer, schedule, pp, vpp, m, split_backward,
                                            place, **attrs)
    ref_losses, ref_params = baseline(kind, optimizer, pp * vpp, m, place)
    loss_diff = float(np.max(np.abs(losses - np.array(ref_losses, dtype=np.float64))))
    param_diff = max(float(np.max(np.abs(params[n] - ref_params[n]))) for n in ref_params)
    where = f"{schedule} pp={pp} vpp={vpp} m={m} split_backward={split_backward} {kind}/{optimizer}"
    assert losses.shape == (STEPS, m), where
    assert loss_diff <= TOL, f"{where}: per-micro-batch loss differs by {loss_diff:.3g}"
    assert param_diff <= TOL, f"{where}: parameters differ by {param_diff:.3g}"
    return pipeline

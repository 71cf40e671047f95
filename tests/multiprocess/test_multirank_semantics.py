"""Per-rank programs (``pp_stage=r``) with global-norm clipping, tied weights, weight decay and
LR schedulers: the squared norm and a tied weight's gradient are all-reduced over the pipeline
ranks in the optimizer programs (``passes.split.per_rank.filter_optimizer``).

Fast tests check the per-rank programs in one process (gloo and the NCCL variant, built on
CPU).  The ``slow`` ones run two gloo processes: one launch trains a covering design of
1F1B / ZBH1 / ZBV / VPP x optimizer x clipping x LR schedule x tied embeddings x B / W split on programs
written with ``paddle.nn`` layers (the worker: ``workers/multirank_semantics.py``) and compares each with
the unsplit full-batch run; another runs ``tools/train.py`` with the issue's flags.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import _user_programs as U
from _multirank import TRAIN, launch_script
from _paths import WORKERS
from _semantics import GRID, LAYOUTS, M

TOL = 1e-6


def _rank_plans(case, schedule, vpp, device="cpu"):
    from pipesplit.job_list.request import PipelineConfig
    from pipesplit.passes.split.per_rank import build_rank_plan

    prog = U.build(case, 2 * vpp)
    plans = [build_rank_plan(prog.main, prog.startup, PipelineConfig.from_attrs(
        schedule, dict(num_micro_batches=M, pp_degree=2, vpp_degree=vpp, pp_stage=r)),
        device=device) for r in range(2)]
    return prog, plans


def _all_reduces(plan):
    return [op for op in plan.plan.ir_program("optimizer").global_block().ops
            if op.name() == "pd_op.all_reduce"]


# --------------------------------------------------------------------------- fast (1 process)

@pytest.mark.parametrize("clip,tied,expected", [("none", False, 0), ("global_norm", False, 1),
                                                ("none", True, 1), ("global_norm", True, 2),
                                                ("by_norm", True, 1)])
def test_rank_optimizers_all_reduce_what_spans_ranks(clip, tied, expected):
    prog, plans = _rank_plans(U.Case(optimizer="momentum", clip=clip, tied=tied), "VPP", 2)
    held = [set(p.rank_info.param_names) for p in plans]
    shared = held[0] & held[1]
    assert shared == ({"embedding_0.w_0"} if tied else set())
    assert held[0] | held[1] == set(prog.param_names)
    for p in plans:
        ops = _all_reduces(p)
        assert p.rank_info.num_all_reduces == len(ops) == expected
        assert all(int(op.attrs()["ring_id"]) == 0 for op in ops)  # gloo: ring 0
        updated = {op.operand_source(0).get_defining_op().attrs()["parameter_name"]
                   for op in p.plan.ir_program("optimizer").global_block().ops
                   if op.name() == "pd_op.momentum_"}
        assert updated == set(p.rank_info.param_names)
    # both ranks meet the same all-reduces in the same order (shapes match pairwise)
    shapes = [[tuple(op.result(0).shape) for op in _all_reduces(p)] for p in plans]
    assert shapes[0] == shapes[1]


def test_v_placement_keeps_a_tied_weight_on_one_rank():
    """ZBV puts the first and the last stage on rank 0: nothing to all-reduce."""
    _, plans = _rank_plans(U.Case(tied=True), "ZBV", 2)
    assert "embedding_0.w_0" in plans[0].rank_info.param_names
    assert "embedding_0.w_0" not in plans[1].rank_info.param_names
    assert [p.rank_info.num_all_reduces for p in plans] == [0, 0]


def test_squared_norm_of_a_tied_weight_is_counted_once():
    _, plans = _rank_plans(U.Case(clip="global_norm", tied=True), "1F1B", 1)
    counts = [sum(op.name() == "pd_op.squared_l2_norm"
                  for op in p.plan.ir_program("optimizer").global_block().ops) for p in plans]
    held = [len(p.rank_info.param_names) for p in plans]
    # rank 0 counts the shared embedding, rank 1 does not (it still updates it)
    assert counts == [held[0], held[1] - 1]


def test_nccl_variant_all_reduces_on_a_ring_of_every_rank():
    from paddle.distributed.auto_parallel.static.process_group import get_process_group
    from pipesplit.passes.transport.nccl import NcclTransport

    _, plans = _rank_plans(U.Case(clip="global_norm", tied=True), "VPP", 2, device="gpu")
    for p in plans:
        info = p.rank_info
        assert isinstance(info.transport, NcclTransport) and info.reduce_ring_id is not None
        assert sorted(get_process_group(info.reduce_ring_id).ranks) == [0, 1]
        ops = _all_reduces(p)
        assert len(ops) == info.num_all_reduces == 2
        assert {int(op.attrs()["ring_id"]) for op in ops} == {info.reduce_ring_id}


def test_optimizer_op_mixing_ranks_otherwise_is_refused():
    """A cross-rank combination that is not a sum of terms (here: the product of every rank's
    gradient norm) raises instead of computing something else."""
    import paddle
    from paddle.base.framework import pir_chunk_id_guard

    from pipesplit.passes import apply_pipeline

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 8], "float32")
        h = x
        for stage in range(2):
            with pir_chunk_id_guard(stage):
                h = paddle.nn.Linear(8, 8)(h)
        with pir_chunk_id_guard(1):
            loss = paddle.mean(h * h)
        opt = paddle.optimizer.SGD(0.1)
        params_grads = opt.backward(loss)
        scale = paddle.prod(paddle.stack([paddle.sum(g * g) for _, g in params_grads]))
        opt.apply_gradients([(p, g / (1 + scale)) for p, g in params_grads])
        paddle._C_ops.set_persistable_value(loss, "loss")
    with pytest.raises(ValueError, match="combines values held by different pipeline ranks"):
        apply_pipeline(main, startup, "1F1B", dict(num_micro_batches=2, pp_degree=2,
                                                   pp_stage=0))


# --------------------------------------------------------------------------- slow (2 processes)

@pytest.mark.slow
def test_two_ranks_match_unsplit_grid(tmp_path):
    out = tmp_path / "results.json"
    proc, logs = launch_script([WORKERS / "multirank_semantics.py", out], tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + logs[0][-3000:] + logs[1][-3000:]
    results = json.loads(out.read_text())
    assert len(results) == len(GRID)
    evaluations = [e for r in (0, 1) for e in json.loads(open(f"{out}.eval{r}").read())]
    assert sorted(e["schedule"] for e in evaluations) == sorted(LAYOUTS)
    for e in evaluations:  # evaluation programs: forward-only plans, unsplit outputs
        assert all(t.rstrip("0123456789") in ("forward", "send_forward", "recv_forward")
                   for t in e["job_types"]), e
        assert e["diff"] <= TOL, e
    for res in results:
        where = " ".join(f"{k}={v}" for k, v in res["row"].items())
        assert res["loss_diff"] <= TOL, f"{where}: losses differ by {res['loss_diff']:.3g}"
        assert res["param_diff"] <= TOL, f"{where}: parameters differ by {res['param_diff']:.3g}"
        assert res["shared_equal"], f"{where}: the tied weight differs between the ranks"


@pytest.mark.slow
def test_train_with_clipping_tied_embeddings_and_lr_schedule(tmp_path):
    """The issue's check: ZBH1, m=4, 3 steps, --clip-global-norm 0.5 --tied-embeddings
    --lr-schedule step: max_param_diff <= 1e-6 and the losses of ``pipesplit demo``."""
    from pipesplit.tools import demo

    flags = ["--schedule", "ZBH1", "--vpp", "1", "-m", "4", "--steps", "3",
             "--clip-global-norm", "0.5", "--tied-embeddings", "--lr-schedule", "step"]
    out = tmp_path / "out.json"
    proc, logs = launch_script([TRAIN] + flags + ["--json", out], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + logs[0][-3000:] + logs[1][-3000:]
    rec = json.loads(out.read_text())
    assert rec["max_param_diff"] <= TOL
    ref = tmp_path / "demo.json"
    assert demo.main(flags + ["--pp", "2", "--json", str(ref)]) == 0
    ref = json.loads(ref.read_text())
    assert np.max(np.abs(np.array(rec["losses"]) - np.array(ref["losses"]))) <= TOL
    assert rec["baseline_losses"] == ref["baseline_losses"]
    assert ref["max_param_diff"] <= TOL

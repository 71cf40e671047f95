"""Evaluation programs (no backward) give forward-only plans; programs with dropout split and
train.  Programs written with ``paddle.nn`` layers (``tests/helpers/_user_programs.py``)."""
from __future__ import annotations

import numpy as np
import pytest

import paddle

import _user_programs as U
from pipesplit.job_list import FORWARD, build_schedule
from pipesplit.job_list.registry import schedule_names
from pipesplit.job_list.validate import ScheduleError, validate

M = 4


def _vpp(name: str) -> int:
    return 1 if name in ("FThenB", "1F1B", "Eager1F1B", "ZBH1", "ZBH2", "auto") else 2


@pytest.mark.parametrize("name", schedule_names())
def test_eval_program_gives_forward_only_plan(name):
    from pipesplit.ir_utils import PlanRunner
    from pipesplit.passes import apply_pipeline

    case, vpp = U.Case(tied=True), _vpp(name)
    prog = U.build(case, 2 * vpp, train=False)
    pipeline = apply_pipeline(prog.main, prog.startup, name,
                              dict(num_micro_batches=M, pp_degree=2, vpp_degree=vpp))
    kinds = {t.rstrip("0123456789") for t, _ in pipeline.job_order}
    assert kinds <= {"forward", "send_forward", "recv_forward"}, kinds
    # each rank's forwards run in the schedule's own forward order
    full_schedule = build_schedule(name, 2, vpp, M)
    placement = pipeline.schedule.placement
    for rank in range(2):
        want = [(placement.stage(rank, j.chunk), j.micro_batch)
                for j in full_schedule.ranks[rank] if j.kind == FORWARD]
        got = [(int(t[len("forward"):]), mb) for t, mb in pipeline.job_order
               if t.startswith("forward") and placement.rank_of(int(t[len("forward"):])) == rank]
        assert got == want
    scope = U.new_scope(prog)
    full = U.batch(case, 0, M * U.MICRO_BATCH_SIZE)
    out = PlanRunner(pipeline.plan, scope).step(full)
    assert np.max(np.abs(np.array(out) - U.unsplit_forward(prog, scope, full, M))) <= 1e-6


def test_forward_only_schedule_checks():
    s = build_schedule("1F1B", 2, 1, 3)
    evaluation = s.forward_only()
    validate(evaluation)
    assert evaluation.is_forward_only and not s.is_forward_only
    assert all(j.kind == FORWARD for jobs in evaluation.ranks for j in jobs)
    with pytest.raises(ScheduleError, match="missing forward 1F2"):
        validate(evaluation.with_ranks([evaluation.ranks[0], evaluation.ranks[1][:-1]]))
    with pytest.raises(ScheduleError, match="no backward or optimizer jobs"):
        validate(s.with_ranks(s.ranks, options={"forward_only": True}))
    with pytest.raises(ValueError, match="compute schedule"):
        from pipesplit.job_list.lower import lower_comm

        lower_comm(s).forward_only()


@pytest.mark.parametrize("model", ["mlp", "lm"])
def test_dropout_program_splits_and_trains(model):
    """Dropout draws its masks from Paddle's generator in the order the ops run, which a
    schedule changes: the run trains (loss goes down) but is not bit-equal to unsplit."""
    case = U.Case(model=model, optimizer="momentum", dropout=0.1)
    prog = U.build(case, 4)
    assert any(op.name() == "pd_op.dropout" for op in prog.main.global_block().ops)
    steps = 12
    losses, _, _ = U.train_split(case, "ZBH1", 4, 1, M, steps=steps, fixed_batch=True)
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    # one process, same seed: the same plan draws the same masks again
    again, _, _ = U.train_split(case, "ZBH1", 4, 1, M, steps=steps, fixed_batch=True)
    assert np.array_equal(losses, again)
    # with p = 0 the same layers are deterministic and match the unsplit run
    exact = U.Case(model=model, optimizer="momentum", dropout=0.0)
    ref = U.train_unsplit(exact, 4, M)
    got = U.train_split(exact, "ZBH1", 4, 1, M)
    assert U.max_diffs(got[0], got[1], *ref) <= (1e-6, 1e-6)

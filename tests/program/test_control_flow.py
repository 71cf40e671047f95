"""Control flow in the program (``pd_op.while``, an ``if`` nested in its body, an ``if`` on a
tensor in the loss, and their backward ops), split by every schedule in one process and
trained equal to the unsplit program (``tests/helpers/_user_programs.py``'s "cf" model).

A control-flow op is one op: its regions run where it runs, its captured outer values are its
inputs.  A ``while``'s backward reads the forward's stack as a stack (``cf.has_elements``)
and through its outlet; Paddle's executor cannot hand one variable over under two types, so
the backward job runs the forward ``while`` again onto a stack of its own
(``ir_utils/extract.py``, ``replayed_stacks``): the checks below include that replay.
"""
from __future__ import annotations

import pytest

import _user_programs as U

from pipesplit.ir_utils import regions
from pipesplit.ir_utils.complete import complete_program
from pipesplit.ir_utils.extract import split_program
from pipesplit.ir_utils.roles import ROLE_BACKWARD, ROLE_FORWARD

TOL = 1e-6
M = 4
LAYOUTS = {"FThenB": (2, 1), "1F1B": (2, 1), "Eager1F1B": (2, 1), "VPP": (2, 2),
           "LoopedBFS": (2, 2), "ZBH1": (2, 1), "ZBH2": (2, 1), "InterleavedZB": (2, 2),
           "ZBV": (2, 2), "ZBVPP": (2, 2), "DualPipeV": (2, 2), "auto": (2, 1),
           "autoV": (2, 2)}
CASES = [U.Case(model="cf", optimizer="adamw", clip="global_norm", lr_schedule="warmup"),
         U.Case(model="cf", optimizer="sgd")]


@pytest.fixture(scope="module")
def references():
    return {(case, stages): U.train_unsplit(case, stages, M)
            for case in CASES for stages in sorted({p * v for p, v in LAYOUTS.values()})}


@pytest.mark.parametrize("split_backward", [False, True], ids=["whole_b", "split_b"])
@pytest.mark.parametrize("schedule", list(LAYOUTS))
def test_every_schedule_trains_a_program_with_control_flow(references, schedule,
                                                            split_backward):
    pp, vpp = LAYOUTS[schedule]
    case = CASES[list(LAYOUTS).index(schedule) % 2]
    losses, params, _ = U.train_split(case, schedule, pp, vpp, M, split_backward)
    loss_diff, param_diff = U.max_diffs(losses, params, *references[(case, pp * vpp)])
    where = f"{schedule} pp={pp} vpp={vpp} split={split_backward} {case.describe()}"
    assert loss_diff <= TOL, f"{where}: losses differ by {loss_diff:.3g}"
    assert param_diff <= TOL, f"{where}: parameters differ by {param_diff:.3g}"


def _top_level(program, name):
    return [op for op in program.global_block().ops if op.name() == name]


def test_a_control_flow_op_is_one_op_with_its_captured_values_as_inputs():
    prog = U.build(CASES[1], 2)
    work = complete_program(prog.main.clone())
    ifs, whiles = _top_level(work, "pd_op.if"), _top_level(work, "pd_op.while")
    assert len(ifs) == 2 and len(whiles) == 2  # forward and backward of each
    forward_if, backward_if = ifs
    # the loss's `if` reads the error only inside its branches: a captured input
    captured = regions.captured_values(forward_if)
    assert captured and all(v.get_defining_op().get_parent_block().parent_op is None or
                            v.get_defining_op().get_parent_block() is work.global_block()
                            for v in captured)
    assert forward_if.op_role == ROLE_FORWARD and forward_if.chunk_id == 1
    assert backward_if.op_role == ROLE_BACKWARD and backward_if.chunk_id == 1
    assert regions.reads_a_stack(backward_if) and not regions.reads_a_stack(forward_if)
    index = {op: i for i, op in enumerate(work.global_block().ops)}
    assert regions.pushing_op(backward_if, index) is forward_if
    forward_while, backward_while = whiles
    assert (forward_while.op_role, forward_while.chunk_id) == (ROLE_FORWARD, 0)
    assert (backward_while.op_role, backward_while.chunk_id) == (ROLE_BACKWARD, 0)


def test_the_backward_while_replays_its_forward_on_a_stack_of_its_own():
    prog = U.build(CASES[1], 2)
    split = split_program(prog.main, 2, split_backward=False, num_micro_batches=M)
    forward0 = split.programs["forward0"]
    backward0 = split.programs["backward0"]
    assert len(_top_level(forward0, "pd_op.while")) == 1
    assert len(_top_level(backward0, "pd_op.while")) == 2  # the replay, then the backward
    # the forward's own run pushes nothing (nobody pops its stack) ...
    forward_while = _top_level(forward0, "pd_op.while")[0]
    assert not any(op.name() == "cf.tuple_push" for op in regions.inner_ops(forward_while))
    # ... and none of the while's stacks crosses: backward0's are its own
    assert not [kw for kw in backward0.global_block().kwargs().values()
                if str(kw.type()).startswith("cf.")]
    # the loss's `if` hands its stacks' outlets from forward1 to backward1 (popped there)
    kinds = sorted(str(kw.type()) for kw in split.programs["backward1"].global_block()
                   .kwargs().values() if str(kw.type()).startswith("cf."))
    assert kinds == ["cf.outlet", "cf.outlet"]  # one per branch

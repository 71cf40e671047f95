"""What a rank says when its step fails (:mod:`pipesplit.passes.transport.progress`): the root
cause of a real Paddle error, however long its message, and where the rank was, in words that
do not suggest a communication fault when it was not in one."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from pipesplit.passes.transport.progress import CommProgress, failure_reason, root_cause

CAUSE = "InvalidArgumentError: The 'shape' in ReshapeOp is invalid."


def _paddle_error(depth: int) -> Exception:
    """A real executor error: a reshape to a wrong shape, traced ``depth`` calls deep (Paddle
    quotes the user's call stack first, its cause last)."""
    def traced(x, level):
        return paddle.reshape(x, [3, 5]) if level == 0 else traced(x, level - 1)

    main = paddle.static.Program()
    with paddle.static.program_guard(main, paddle.static.Program()):
        x = paddle.static.data("x", [-1, 4], "float32")
        y = traced(x, depth)
    try:
        paddle.static.Executor(paddle.CPUPlace()).run(
            main, feed={"x": np.zeros([2, 4], np.float32)}, fetch_list=[y])
    except Exception as exc:  # noqa: BLE001 (the error under test)
        return exc
    raise AssertionError("the reshape did not fail")


def test_a_long_paddle_error_is_reported_by_its_root_cause(static_mode):
    exc = _paddle_error(depth=40)
    assert len(str(exc)) > 4000 and CAUSE in str(exc)[-1500:]  # the cause sits at the end
    assert root_cause(str(exc)).startswith(CAUSE)
    reason = failure_reason(exc)
    assert reason.startswith(CAUSE)
    assert "(the root cause; Paddle's message begins: In user code:" in reason


def test_a_short_error_is_quoted_whole():
    message = "(InvalidArgument) The variable x should exist.\n  [Hint: ...]"
    assert failure_reason(ValueError(message)) == " ".join(message.split())


@pytest.mark.parametrize("message", ["", "std::exception"])
def test_a_bare_cpp_error_says_what_it_means(message):
    assert failure_reason(RuntimeError(message)).startswith(
        "the connection to its peer broke or timed out without an error message")


def test_where_says_plainly_when_the_rank_was_not_in_a_comm_job():
    scope = paddle.static.Scope()
    progress = CommProgress(sequence=[("send_forward0", 0, 1), ("recv_backward0", 0, 1)])
    assert progress.where(scope) == "not in a communication job"
    assert CommProgress().where(scope) == "not in a communication job"
    progress.start_step(scope, paddle.CPUPlace())
    assert progress.where(scope) == ("waiting in send_forward0 micro-batch 0 with rank 1 (comm "
                                     "job 1 of 2 in the step)")
    scope.var("pipesplit_comm_progress").get_tensor().set(np.full([1], 2, np.float32),
                                                          paddle.CPUPlace())
    assert progress.where(scope).startswith("not in a communication job (after its last one")

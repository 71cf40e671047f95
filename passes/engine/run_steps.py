"""One ``Engine.run`` of an engine pipesplit serves (one step of the mode that runs), as a list:
:data:`RUN_STEPS`, each step a function of the one :class:`Run` they share, run in order by
:func:`run_steps` (:meth:`~.session.EngineSession.run`):

1. :func:`count_the_step` - the mode's step counted, its comm progress started (a failure in
   any later step names the rank, the step, the comm job, micro-batch and peer);
2. :func:`start_the_measured_step` - a training step counted; those before the measured step
   record their ops on this thread, the measured one starts Paddle's profiler after every
   process met (:class:`~.replanning.Measurement`);
3. :func:`paddle_runs` - Paddle's own run, shown ``schedule_mode == "VPP"`` (its loss fetch
   from ``forward{vpp-1}``) and nothing else;
4. :func:`replan_from_the_measured_step` - after the measured step: every process's
   measurement shared, the plan built again from it;
5. :func:`loss_to_the_last_stage` - the loss handed to the last stage's ranks.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from pipesplit.passes.engine.loss_location import LOSS_MODES, hand_the_loss_on
from pipesplit.passes.engine.replanning import Measurement
from pipesplit.passes.measure.memory_budget import MemoryBudgetError
from pipesplit.passes.transport.progress import failure_reason

#: what Paddle 3.3.1's engine tests ``schedule_mode`` against (``== "VPP"``) to complete the
#: chunk ids, check them and fetch the loss from ``forward{vpp-1}``, all of which a pipesplit
#: schedule needs (docs/engine.md, "Why the engine is shown VPP")
PADDLE_VPP = "VPP"


@contextlib.contextmanager
def paddle_sees_vpp(pipeline_strategy):
    """``schedule_mode`` reads ``"VPP"`` inside, the user's name again after (also after an
    exception).  The one place pipesplit writes that field, and only around the engine
    functions that test it; pipesplit itself reads the schedule from the engine's session."""
    name = pipeline_strategy.schedule_mode
    pipeline_strategy.schedule_mode = PADDLE_VPP
    try:
        yield
    finally:
        pipeline_strategy.schedule_mode = name


@dataclass
class Run:
    """One ``Engine.run``: what its steps share.  ``paddle_run()`` is Paddle's ``Engine.run``
    with the caller's arguments; ``kwargs`` are those arguments by name (the mode)."""

    session: object               # the engine's EngineSession
    engine: object
    paddle_run: Callable[[], object]
    kwargs: dict
    mode: str = ""
    step: Optional[int] = None    # the mode's step (step 1); None: a mode without a plan
    started: Optional[float] = None  # when its comm progress started (failures are named)
    around_paddle: List[object] = field(default_factory=list)  # context managers (step 3)
    measurement: Optional[Measurement] = None
    logs: object = None


def count_the_step(run: Run) -> None:
    """Step 1: the mode's step counted; its comm progress (where the plan counts it) started,
    so that a failed step can say where it stopped."""
    planned = run.session.modes.get(run.mode)
    if planned is None:
        return
    run.step = planned.steps
    planned.steps += 1
    if planned.progress is not None:
        import paddle

        planned.progress.start_step(paddle.static.global_scope(), run.engine._place)
        run.started = time.monotonic()


def start_the_measured_step(run: Run) -> None:
    """Step 2: a training step counted (:func:`~.user_options.measured_step` names the one
    measured).  The steps before it build their interpreters with their ops on this thread,
    and so does the measured one, which runs under Paddle's profiler after every process met
    (:meth:`~.replanning.Measurement.start`).  A whole-model program, every rank emulated in
    one process, is not re-planned."""
    from pipesplit.passes.measure.profile import ops_on_this_thread

    session = run.session
    if run.mode != "train":
        return
    step = session.train_steps
    session.train_steps += 1
    if session.measure_step is None or step > session.measure_step:
        return
    before = session.pipeline_of("train")
    if step == session.measure_step and getattr(before, "source_program", None) is not None:
        run.measurement = Measurement(run.engine, session, before, step)
        run.measurement.start()
    if step < session.measure_step or run.measurement is not None:
        run.around_paddle.append(ops_on_this_thread())


def paddle_runs(run: Run) -> None:
    """Step 3: Paddle's ``Engine.run``, shown ``"VPP"`` around its body only (Paddle tests the
    name inside it: the loss fetch)."""
    with contextlib.ExitStack() as around:
        for context in run.around_paddle:
            around.enter_context(context)
        with paddle_sees_vpp(run.engine._strategy.pipeline):
            run.logs = run.paddle_run()


def replan_from_the_measured_step(run: Run) -> None:
    """Step 4: after the measured step, the plan built again from what every process measured
    (:meth:`~.replanning.Measurement.replan`), once."""
    if run.measurement is not None:
        run.measurement.replan()


def loss_to_the_last_stage(run: Run) -> None:
    """Step 5: a train or eval step returns its loss on the last pipeline stage's ranks,
    whatever the schedule's placement (:mod:`.loss_location`)."""
    session, engine = run.session, run.engine
    mode = run.kwargs.get("mode") or engine._mode  # (as the run left it)
    if mode not in LOSS_MODES or session.pipe is None or session.modes.get(mode) is None:
        return
    import paddle.distributed as dist

    if dist.get_world_size() == 1:  # (every rank emulated in one process)
        return
    if session.loss_carrier is None:
        session.loss_carrier = session.transport.loss_carrier(
            dist.get_world_size(), session.config.num_micro_batches)
    run.logs = hand_the_loss_on(run.logs, session.pipe, session.request.schedule.placement,
                                dist.get_rank(), session.return_numpy,
                                carrier=session.loss_carrier)


#: the steps of one ``Engine.run``, in order (module docstring)
RUN_STEPS = (count_the_step, start_the_measured_step, paddle_runs,
             replan_from_the_measured_step, loss_to_the_last_stage)


def run_steps(run: Run):
    """Every step of :data:`RUN_STEPS` on ``run``, in order; returns what the run returns.  A
    step that fails (a peer's process ended, a gloo timeout) says which process, which step of
    which mode, and which comm job, micro-batch and peer it was in; Paddle says only
    ``std::exception``.  A memory budget refused at the re-plan is the user's, not a failure."""
    run.mode = run.kwargs.get("mode") or run.engine._mode
    try:
        for step in RUN_STEPS:
            step(run)
    except MemoryBudgetError:
        raise
    except Exception as exc:
        if run.started is None:
            raise
        import paddle

        progress = run.session.modes[run.mode].progress
        raise RuntimeError(
            f"pipesplit: rank {paddle.distributed.get_rank()} failed in {run.mode} step "
            f"{run.step} after {time.monotonic() - run.started:.1f} s, "
            f"{progress.where(paddle.static.global_scope())}: {failure_reason(exc)}") from exc
    finally:
        if run.measurement is not None:
            run.measurement.stop()
    return run.logs

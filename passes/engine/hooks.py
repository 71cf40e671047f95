"""The trampolines pipesplit installs in place of Paddle's engine functions, and the hooks that
serve no engine in particular.  Each ``hook(original)`` returns the function installed in place
of Paddle's ``original``; which Paddle name each one replaces, and the replacing itself, is
:mod:`pipesplit.passes.engine.paddle_patches`.  A trampoline finds the engine's session ONCE
(:func:`~.session.session_of_engine`, :func:`served_session`,
:func:`~.session.session_of`) and calls the session's method for that moment
(:class:`~.session.EngineSession`); an engine without a session is Paddle's own and gets
Paddle's function.  Why each name is wrapped: ``docs/engine.md``."""
from __future__ import annotations

import functools
import os
from typing import Optional

from pipesplit.passes.engine.chunk_fill import fill_chunk_ids
from pipesplit.passes.transport.devices import needs_cpu_support
from pipesplit.passes.engine.door import DOOR
from pipesplit.passes.engine.engine_rank import is_engine_program
from pipesplit.passes.engine.knobs import refuse_what_cannot_work
from pipesplit.passes.engine.loader_checks import check_loader
from pipesplit.passes.engine.open_state import opening_of
from pipesplit.passes.engine.run_steps import paddle_sees_vpp
from pipesplit.passes.engine.session import EngineSession, session_of, session_of_engine
from pipesplit.passes.engine.strategy_checks import check_fields
from pipesplit.passes.engine.section import held_request
from pipesplit.passes.last_built import record
from pipesplit.passes.split.pipeline import split_and_schedule


def _single(x, what):
    if isinstance(x, (list, tuple)):
        if len(x) != 1:
            raise ValueError(f"{what}: expected one program, got {len(x)}")
        return x[0]
    return x


def pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy):
    """Drop-in for Paddle's ``pir_pass.pipeline_pass``: returns the ``core.Plan`` of what the
    section's handle holds (:func:`~.section.held_request`): an engine's session takes the
    engine's per-rank program (it carries Paddle's send_v2 / recv_v2) or a whole-model
    program; a section outside an engine a whole-model program (chunk id = global stage), and
    refuses the engine's per-rank program (its engine was built before
    :func:`~pipesplit.passes.strategy.enable_strategy`)."""
    main = _single(dense_main_program, "dense_main_program")
    startup = _single(dense_startup_program, "dense_startup_program")
    held = held_request(pipeline_strategy)
    if is_engine_program(main) and not held.serves_an_engine:
        raise built_before_enable()
    return record(held.pipeline_pass(main, startup)).plan


def route_the_pipeline_pass(original):
    """``pipeline_pass`` (pir_pass's and the engine module's name): pipesplit's
    pass (:func:`pipeline_pass`) for an engine with a session, and for any program while
    pipesplit is switched on; Paddle's own otherwise (an engine built while it was off)."""
    def routed(dense_main_program, dense_startup_program, pipeline_strategy):
        if session_of(pipeline_strategy) is None and not pipesplit_is_on():
            return original(dense_main_program, dense_startup_program, pipeline_strategy)
        return pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy)
    return routed


#: the schedule names Paddle 3.3.1's own engine serves (its ``pipeline_pass`` asserts them)
PADDLE_ENGINE_SCHEDULES = ("FThenB", "1F1B", "VPP")


def _is_pipesplit_schedule(name) -> bool:
    from pipesplit.job_list.registry import get_spec

    try:
        return isinstance(name, str) and get_spec(name) is not None
    except ValueError:
        return False


def name_a_schedule_paddle_lacks(original):
    """``pipeline_pass`` (pir_pass's and the engine module's name), from the import of
    :mod:`pipesplit.passes.strategy` on (group ``"schedule_names"``, innermost): Paddle's own
    engine asked for a schedule only pipesplit has (ZBV, ZBH1, auto ...) was built before
    :func:`~pipesplit.passes.strategy.enable_strategy` (or after ``disable_strategy()``).  Its
    ``train()`` (or first step) then stops with a ``ValueError`` saying to call
    ``enable_strategy()`` before ``dist.to_static``, where Paddle asserts ``pipeline scheduler
    only support FThenB, 1F1B and VPP now``; an ``enable_strategy()`` after that ``train()``
    would come too late for any hook of its own.  Every other call is Paddle's, unchanged."""
    def pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy):
        name = getattr(pipeline_strategy, "schedule_mode", None)
        if name not in PADDLE_ENGINE_SCHEDULES and session_of(pipeline_strategy) is None \
                and _is_pipesplit_schedule(name):
            raise built_before_enable(name)
        return original(dense_main_program, dense_startup_program, pipeline_strategy)
    return pipeline_pass


def pipesplit_is_on() -> bool:
    """Whether new engines are pipesplit's (:func:`~pipesplit.passes.strategy.enable_strategy`
    and not disabled since)."""
    return DOOR.is_enabled("engine")


def built_before_enable(paddle_lacks: Optional[str] = None) -> ValueError:
    """``paddle_lacks``: the schedule name Paddle's own engine was asked for and has not."""
    which = "" if paddle_lacks is None else \
        f" (or after disable_strategy()), so it is Paddle's own, and Paddle's engine has no " \
        f"schedule strategy.pipeline.schedule_mode={paddle_lacks!r} (only " \
        f"{', '.join(PADDLE_ENGINE_SCHEDULES)})"
    return ValueError(
        "this engine was built before pipesplit.passes.strategy.enable_strategy() was "
        f"called{which}: call enable_strategy() (and cpu_support.enable() on a CPU build) "
        "before dist.to_static, so the engine's strategy is checked and its stage meshes seen")


def served_session(engine) -> Optional[EngineSession]:
    """The session of an engine pipesplit serves; None for Paddle's own engine (built while
    pipesplit was off), which Paddle serves.  A pipeline engine without a session while
    pipesplit is on was built before :func:`~pipesplit.passes.strategy.enable_strategy`
    (Paddle's engine would then meet pipesplit's pass halfway): refused."""
    session = session_of_engine(engine)
    if session is None and engine._strategy.pipeline.enable and pipesplit_is_on():
        raise built_before_enable()
    return session


def engine_init(original):
    """``Engine.__init__``: after Paddle's, a pipeline engine gets its session
    (:meth:`~.session.EngineSession.open`).  The user's own strategy object is not touched
    (``DistModel`` hands the engine a deep copy)."""
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        pipeline = self._strategy.pipeline
        if pipeline.enable and session_of(pipeline) is None:
            EngineSession.open(self)
    return __init__


def shown_vpp(original):
    """``Engine._parallel_pir`` (its chunk completion and chunk check): Paddle's own code runs
    with ``schedule_mode == "VPP"`` (:func:`~.run_steps.paddle_sees_vpp`) for an engine
    pipesplit serves, so those steps serve every pipesplit schedule; every other reader of the
    engine's strategy (a trainer, a later hook, the user) sees the schedule the user named.
    (``Engine.run``'s loss fetch is shown it by step 3 of
    :meth:`~.session.EngineSession.run`.)"""
    def shown(self, *args, **kwargs):
        if session_of_engine(self) is None:
            return original(self, *args, **kwargs)
        with paddle_sees_vpp(self._strategy.pipeline):
            return original(self, *args, **kwargs)
    return shown


def keep_the_name_generator(original):
    """``DistModel.__init__`` / ``train`` / ``eval`` / ``predict``: each ends in
    ``paddle.disable_static()``, which enters a fresh name generator, so the layers of a model
    built after it are named as the first model's (``linear_0.w_0`` again).  Paddle's engines
    keep parameters in one scope BY NAME: two such DistModels would share their parameters and
    both train wrong, silently.  The generator of the caller is kept on instead, as if the call
    had not switched modes (a script's own ``unique_name.guard`` is left as it is).  A call
    that raises (a refused setup) leaves dygraph mode on as it found it: Paddle would leave
    the static mode on, and the next model the script builds would crash the process."""
    @functools.wraps(original)
    def kept(*args, **kwargs):
        import paddle
        from paddle.base import unique_name

        before = unique_name.generator, unique_name.dygraph_parameter_name_checker
        dygraph = paddle.in_dynamic_mode()
        try:
            return original(*args, **kwargs)
        except Exception:
            if dygraph and not paddle.in_dynamic_mode():
                paddle.disable_static()
            raise
        finally:
            unique_name.switch(*before)
    return kept


def checks_before_the_engine(original):
    """``DistModel.__init__`` (group ``"engine"``): before Paddle's, in this order, the loader
    (:func:`_check_the_loader`) and whether ``cpu_support`` came first
    (:func:`_check_cpu_support_came_first`)."""
    def __init__(self, layer, loader, *args, **kwargs):
        _check_the_loader(loader, args, kwargs)
        _check_cpu_support_came_first()
        _refuse_knobs_that_cannot_work(args, kwargs)
        original(self, layer, loader, *args, **kwargs)
    return __init__


def _refuse_knobs_that_cannot_work(args, kwargs) -> None:
    """A strategy field that cannot work beside the pipeline (:mod:`.knobs`) is refused
    before Paddle's ``DistModel`` starts (tensor fusion stops inside it on a CPU build); a
    field of the wrong type is left to the strategy check, which names it."""
    strategy = kwargs.get("strategy", args[2] if len(args) > 2 else None)
    pipeline = getattr(strategy, "pipeline", None)
    if not getattr(pipeline, "enable", False):
        return
    try:
        check_fields(pipeline)
    except (TypeError, ValueError):
        return  # (the engine's opening names it)
    refuse_what_cannot_work(opening_of(strategy, needs_cpu_support()))


def _check_the_loader(loader, args, kwargs) -> None:
    """The loader is checked (:mod:`pipesplit.passes.engine.loader_checks`) before the engine
    draws from it, on every rank alike; a strategy field of the wrong type is left to the
    strategy check, which names it."""
    strategy = kwargs.get("strategy", args[2] if len(args) > 2 else None)
    pipeline = getattr(strategy, "pipeline", None)
    steps = getattr(pipeline, "accumulate_steps", None)
    if getattr(pipeline, "enable", False) and type(steps) is int and steps > 0:
        check_loader(loader, steps)


def _check_cpu_support_came_first() -> None:
    """Under the launcher (``POD_NAME``) ``DistModel.__init__`` runs ``fleet.init``, whose gloo
    groups fail on a CPU build (``Connection refused``) unless ``cpu_support`` skips it.  The
    cpu group's wrapper of this name is outside this one and takes ``POD_NAME`` away, so
    ``POD_NAME`` seen here on a CPU build means ``cpu_support.enable()`` came too late."""
    if os.getenv("POD_NAME") and needs_cpu_support():
        raise RuntimeError(
            "on a CPU build of Paddle call pipesplit.passes.cpu_support.enable() before "
            "dist.to_static (DistModel's fleet.init fails on CPU without it)")


def check_each_batch(original):
    """``DistModel.__call__``: the step's batch checked by the session before the step
    (:meth:`~.session.EngineSession.check_batch`)."""
    def __call__(self, *args):
        session = served_session(self._engine)
        if session is not None:
            session.check_batch(self._engine, self._mode, args)
        return original(self, *args)
    return __call__


def note_a_sharded_loader(original):
    """``Engine._prepare_data_spec_from_dataloader``
    (:meth:`~.session.EngineSession.note_a_sharded_loader`)."""
    def _prepare_data_spec_from_dataloader(self, *args, **kwargs):
        session = session_of_engine(self)
        if session is not None:
            session.note_a_sharded_loader()
        return original(self, *args, **kwargs)
    return _prepare_data_spec_from_dataloader


def keep_plan_per_mode(original):
    """``Engine._prepare_program(mode)``: each mode's plan kept
    (:meth:`~.session.EngineSession.prepare_program`)."""
    def _prepare_program(self, mode, *args, **kwargs):
        session = served_session(self)
        if session is None:
            return original(self, mode, *args, **kwargs)
        return session.prepare_program(self, mode,
                                       lambda: original(self, mode, *args, **kwargs))
    return _prepare_program


def run_one_step(original):
    """``Engine.run``, its one wrapper: the session's ordered step list
    (:meth:`~.session.EngineSession.run`: failure naming, measure-and-replan, Paddle's run
    shown ``"VPP"``, the loss handed to the last stage)."""
    def run(self, *args, **kwargs):
        session = served_session(self)
        if session is None:
            return original(self, *args, **kwargs)
        return session.run(self, lambda: original(self, *args, **kwargs), kwargs)
    return run


def whole_batch_spec(original):
    """``Engine.prepare``: a prediction's spec given back whole
    (:meth:`~.session.EngineSession.prepare`)."""
    def prepare(self, inputs_spec=None, *args, mode=None, **kwargs):
        session = session_of_engine(self)
        if session is None:
            return original(self, inputs_spec, *args, mode=mode, **kwargs)
        return session.prepare(self, inputs_spec, mode,
                               lambda spec: original(self, spec, *args, mode=mode, **kwargs))
    return prepare


def name_the_prediction(original):
    """``Engine._build``: a prediction fetches the model's first output
    (:meth:`~.session.EngineSession.program_built`)."""
    def _build(self, mode):
        result = original(self, mode)
        session = session_of_engine(self)
        if session is not None:
            session.program_built(self, mode)
        return result
    return _build


def switch_to_the_mode_plan(original):
    """``Engine.to_mode``: the mode's plan and data specs
    (:meth:`~.session.EngineSession.switch_to`)."""
    def to_mode(self, mode):
        session = served_session(self)
        original(self, mode)
        if session is not None:
            session.switch_to(self, mode)
    return to_mode


def one_ring_per_group(original):
    """``Engine._init_comm``: one ring id per group of ranks on every process
    (:meth:`~.session.EngineSession.init_comm`)."""
    def _init_comm(self):
        session = served_session(self)
        if session is None:
            return original(self)
        return session.init_comm(self, lambda: original(self))
    return _init_comm


def complete_chunk_id(original):
    """``engine.complete_chunk_id`` (:meth:`~.session.EngineSession.complete_chunks`); Paddle's
    own VPP engine gets Paddle's."""
    def complete_chunk_id(dist_program, startup_program, pipeline_strategy):
        session = session_of(pipeline_strategy)
        if session is None:  # Paddle's own VPP
            return original(dist_program, startup_program, pipeline_strategy)
        return session.complete_chunks(dist_program, startup_program)
    return complete_chunk_id


def check_chunk_id(original):
    """Paddle's chunk check needs chunk ids, which the engine sets only for vpp > 1; with one
    chunk per rank (no op has a chunk id) pipesplit gives every op chunk 0 itself
    (:func:`pipesplit.passes.engine.engine_rank.localize_chunks`).  Where Paddle's rule finds
    no chunk (a sharded gradient's reshard before the gradient merge), the op's data names it
    (:func:`~pipesplit.passes.engine.chunk_fill.fill_chunk_ids`)."""
    def check_chunk_id(dist_program):
        if not any(op.dist_attr is not None and op.dist_attr.chunk_id >= 0
                   for op in dist_program.global_block().ops):
            return None
        fill_chunk_ids(dist_program)
        return original(dist_program)
    return check_chunk_id

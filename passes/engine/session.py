"""One engine's session: pipesplit's side of one Paddle engine, and the moments Paddle gives it.

An :class:`EngineSession` is the engine's :class:`~.state.EngineState` (what pipesplit keeps
for it, opened once) with each moment of the engine's life as a method that takes what it
needs as arguments.  The patch table (:mod:`.paddle_patches`) installs thin trampolines
(:mod:`.hooks`) that find the session ONCE (:func:`session_of`, :func:`session_of_engine`)
and call it:

============================  =========================================================
Paddle's moment               the session's method
============================  =========================================================
``Engine.__init__``           :meth:`EngineSession.open` (the strategy read, checked, its
                              request resolved once; the session attached at the handle)
``engine.complete_chunk_id``  :meth:`EngineSession.complete_chunks`
``pipeline_pass``             :meth:`EngineSession.pipeline_pass`
``Engine._prepare_program``   :meth:`EngineSession.prepare_program`
``Engine.to_mode``            :meth:`EngineSession.switch_to`
``Engine.prepare``            :meth:`EngineSession.prepare`
``Engine._build``             :meth:`EngineSession.program_built`
``Engine._prepare_data_spec_  :meth:`EngineSession.note_a_sharded_loader`
from_dataloader``
``Engine._init_comm``         :meth:`EngineSession.init_comm`
``DistModel.__call__``        :meth:`EngineSession.check_batch`
``Engine.run``                :meth:`EngineSession.run`: ONE step list, in order
                              (:data:`~.run_steps.RUN_STEPS`)
============================  =========================================================

Inside the session nothing reads the strategy's fields again: the request, pp, vpp, this
process's pipeline and rank come from the session (the pure translations of
:mod:`.strategy_config`, called with the request's values).
"""
from __future__ import annotations

import copy
from typing import Optional

from pipesplit.passes.engine.block_placement import (assign_placement, check_blocks_on_one_mesh,
                                                     parameters_read_elsewhere)
from pipesplit.passes.engine.chunk_completion import complete_chunk_ids
from pipesplit.passes.engine.door import DOOR
from pipesplit.passes.engine.engine_rank import is_engine_program
from pipesplit.passes.engine.knobs import micro_batch_notice, say
from pipesplit.passes.engine.loader_checks import (check_batch, check_labels_are_class_ids,
                                                   leading_dims)
from pipesplit.passes.engine.open_state import open_engine_state
from pipesplit.passes.engine.relay import relay_far_values
from pipesplit.passes.engine.replanning import engine_rank_plan
from pipesplit.passes.engine.run_steps import Run, paddle_sees_vpp, run_steps
from pipesplit.passes.engine.sequence_parallel import check_sequence_parallel
from pipesplit.passes.engine.state import HANDLE, EngineState, ModePlan
from pipesplit.passes.engine.strategy_config import pipeline_rank, stage_pipe
from pipesplit.passes.engine.surgery import name_an_output, restore_user_placements
from pipesplit.passes.split.core import PipelinePlan
from pipesplit.passes.split.pipeline import split_and_schedule

#: what the engine keeps ONE copy of for all modes (a prediction's specs have no labels, its
#: fetched value another name)
_SHARED_BY_MODES = ("_outside_dataloader", "_inputs_spec", "_labels_spec", "_inputs", "_labels",
                    "_orig_main_prog", "_orig_startup_prog", "_loss_names", "_losses")


def session_of(pipeline_strategy) -> Optional["EngineSession"]:
    """The session of the engine owning ``pipeline_strategy`` (its copy of the section), or
    None (a user's section, Paddle's own engine)."""
    handle = getattr(pipeline_strategy, HANDLE, None)
    return handle if isinstance(handle, EngineSession) else None


def session_of_engine(engine) -> Optional["EngineSession"]:
    """The session of ``engine`` (a Paddle ``Engine``), or None (Paddle's own)."""
    strategy = getattr(engine, "_strategy", None)
    return session_of(getattr(strategy, "pipeline", None))


def engine_state(engine) -> Optional[EngineState]:
    """What pipesplit keeps for ``engine`` (its session), or None (Paddle's own engine)."""
    return session_of_engine(engine)


class EngineSession(EngineState):
    """pipesplit's side of one engine: its state, and its moments (module docstring)."""

    #: what a reader of a section asks (:mod:`.section`): this one is an engine's
    serves_an_engine = True

    # ------------------------------------------------------------ the engine's construction
    @classmethod
    def open(cls, engine) -> "EngineSession":
        """``Engine.__init__`` (after Paddle's): check the pipeline strategy, fill in the
        fields Paddle derives (``pp_degree`` from the stage meshes, the gradient merge's
        ``k_steps``: :func:`~.open_state.fill_in_what_paddle_derives`), resolve the request
        once (:func:`~.open_state.open_engine_state`), refuse a model named as a live
        engine's (:meth:`check_names_apart`) and attach the session at the handle of the
        engine's copy of the section, holding the ``"engine_routes"`` group while it lives.
        ``schedule_mode`` keeps the user's name (Paddle is shown ``"VPP"`` only while it
        tests for it: :func:`paddle_sees_vpp`)."""
        pipeline = engine._strategy.pipeline
        session = open_engine_state(engine, make=cls)
        session.check_names_apart()
        engine._acc_steps = pipeline.accumulate_steps  # (Paddle's __init__ read k_steps)
        setattr(pipeline, HANDLE, session)
        DOOR.hold("engine_routes", session)  # served while it lives
        return session

    def check_names_apart(self) -> None:
        """Refuse a model whose parameters have the names of a live pipesplit engine's built
        in the same scope (Paddle's engines keep parameters in the scope by name): the two
        would share them and both train wrong.  (A model built after ``to_static`` under the
        same name generator cannot meet this: :func:`~.hooks.keep_the_name_generator`.)"""
        for other in DOOR.holders("engine_routes"):
            shared = sorted(self.parameter_names & other.parameter_names)
            if shared and other is not self and other.scope is self.scope:
                raise RuntimeError(
                    f"dist.to_static: this model's parameters {shared[:3]}"
                    f"{' ...' if len(shared) > 3 else ''} have the names of the parameters of "
                    f"a DistModel built earlier in this process (schedule {other.requested!r}, "
                    "still alive); Paddle's engines keep parameters in one scope by name, so "
                    "both models would train wrong.  Delete the earlier DistModel first (del "
                    "it), or build this model under its own names: with "
                    "paddle.utils.unique_name.guard('model2_'): ... (layers, optimizer and "
                    "dist.to_static)")

    # ------------------------------------------------------------------- chunk completion
    def complete_chunks(self, dist_program, startup_program) -> None:
        """``engine.complete_chunk_id`` (the engine calls it while shown ``"VPP"``): this
        process's pipeline from the stage meshes, the labels and sequence-parallel checks;
        for vpp >= 2 blocks on stage meshes in model order are first given the meshes of the
        schedule's placement (:func:`assign_placement`, looped or V; meshes that already
        follow it are kept), then every op its chunk from the request's placement and
        ``vpp_seg_method`` (:func:`~.chunk_completion.complete_chunk_ids`); a value handed
        past a stage is relayed, and the parameters read on another stage's rank are kept."""
        self.pipe = stage_pipe(dist_program, self.request.pp)
        check_labels_are_class_ids(dist_program)
        check_sequence_parallel(dist_program, self.request.vpp, cpu_build=self.transport.needs_cpu_support)
        from paddle.distributed.auto_parallel.static.utils import get_sub_process_mesh_by_program

        meshes = get_sub_process_mesh_by_program(dist_program)
        if self.request.vpp >= 2:
            assign_placement(dist_program, self)
            check_blocks_on_one_mesh(dist_program, self.request.seg_method, self)
            complete_chunk_ids(dist_program, startup_program, self.request.seg_method,
                               self.request.placement, meshes)
        relay_far_values(dist_program, meshes, self.request.placement, self.requested)
        self.shared_parameters = parameters_read_elsewhere(dist_program, meshes, self)

    # ---------------------------------------------------------------- the pipeline pass
    def pp_stage(self) -> Optional[int]:
        """This process's pipeline rank (None: every rank emulated in one process)."""
        return pipeline_rank(self.request.pp, self.pipe)

    def config_on(self, pp_stage: Optional[int]):
        """The request's config on pipeline rank ``pp_stage``."""
        return self.request.config_on(pp_stage)

    def pipeline_pass(self, main, startup) -> PipelinePlan:
        """``pipeline_pass`` of this engine: its per-rank program (it carries Paddle's
        send_v2 / recv_v2) to the engine's builder
        (:func:`~.replanning.engine_rank_plan`), a whole-model program (chunk id = global
        stage) to :func:`~pipesplit.passes.split.pipeline.split_and_schedule`; both take the
        schedule the opening built.  The plan is kept as the one built last."""
        config = self.config_on(self.pp_stage())
        if is_engine_program(main):
            if config.pp_stage is None:
                raise ValueError("the engine's per-rank program needs pp_degree > 1 processes")
            built = engine_rank_plan(main, config, self, requested=self.request.resolved)
        else:
            built = split_and_schedule(main, startup, config, requested=self.request.resolved)
        self.built = built
        return built

    # --------------------------------------------------------- the modes: train, eval, predict
    def note_a_sharded_loader(self) -> None:
        """``Engine._prepare_data_spec_from_dataloader``: called for a
        ``dist.shard_dataloader`` only, whose feeds reach only the meshes it names (a plain
        loader feeds every rank)."""
        self.sharded_loader = True

    def prepare_program(self, engine, mode: str, paddle_prepare):
        """``Engine._prepare_program(mode)``: the engine keeps ONE pipeline plan (the last
        mode prepared) and hands its executor a plan only when it initialises the
        parameters, so ``eval()`` after ``train()`` ran the training plan with the evaluation
        program's fetch.  Each mode's plan is kept here (see :meth:`switch_to`);
        ``paddle_prepare()`` is Paddle's preparation of ``mode``."""
        if self.modes:  # another mode ran first: trace this one as written
            restore_user_placements(engine, self.user_placements)
        specs = _as_list(engine._inputs_spec) + _as_list(engine._labels_spec)
        self.fed_meshes = ({spec.name: spec.mesh for spec in specs  # a shard_dataloader's
                            if getattr(spec, "mesh", None)}     # feeds and their meshes
                           if self.sharded_loader else {})
        self.built = None
        result = paddle_prepare()
        if engine._job_plan is not None and self.built is not None:
            self.modes[mode] = ModePlan(self.built, {key: getattr(engine, key)
                                                     for key in _SHARED_BY_MODES})
        return result

    def switch_to(self, engine, mode: str) -> None:
        """``Engine.to_mode`` (``DistModel.train()`` / ``eval()`` / ``predict()``), after
        Paddle's: the executor, the loss fetch and the feed names use the plan and the data
        specs of the mode that runs, whichever mode was prepared last.  (The engine's own
        fields and its executor's plan, set through Paddle's setter: this engine's objects,
        not Paddle names, so not the patch table's to undo.)"""
        planned = self.modes.get(mode)
        if planned is None:
            return
        for key, value in planned.engine_fields.items():
            setattr(engine, key, value)
        plan = planned.plan
        engine._job_plan = plan
        if engine._executor is not None and engine._executor.plan is not plan:
            engine._executor._set_plan(plan)

    def prepare(self, engine, inputs_spec, mode, paddle_prepare):
        """``Engine.prepare`` for ``DistModel.predict()``: it hands the engine the inputs
        spec the engine already cut to micro-batches for training, which would be cut again
        (``Requires batch_size[2] to be divisible by k_steps[4]``): given back whole.
        ``paddle_prepare(inputs_spec)`` is Paddle's, with the caller's other arguments."""
        steps = getattr(engine, "_acc_steps", 1)
        if mode == "predict" and steps > 1 and inputs_spec is not None \
                and _same_specs(inputs_spec, engine._inputs_spec):
            inputs_spec = copy.deepcopy(inputs_spec)
            for spec in inputs_spec if isinstance(inputs_spec, (list, tuple)) else [inputs_spec]:
                spec.shape = [spec.shape[0] * steps] + list(spec.shape[1:])
        outside = engine._outside_dataloader
        result = paddle_prepare(inputs_spec)
        if mode == "predict" and engine._in_pir_mode and "predict" in self.modes:
            # a spec (not a loader) marks the data "outside", which sends every later run to
            # the legacy reader set-up, absent in PIR mode (KeyError 'predict')
            engine._outside_dataloader = outside
            self.modes["predict"].engine_fields["_outside_dataloader"] = outside
        return result

    def program_built(self, engine, mode: str) -> None:
        """``Engine._build(mode)``, after Paddle's: in PIR mode the engine fetches its "loss"
        by a name the traced program gives it, which a prediction program (no loss) lacks
        (``IndexError`` in ``Engine.run``): the model's first output gets a name and is
        fetched instead, as ``DistModel.predict()`` documents (the outputs of the model)."""
        if mode == "predict" and engine._in_pir_mode and not engine._loss_names \
                and engine.program_helper.output_vars:
            engine._loss_names = [name_an_output(engine.program_helper.main_program,
                                                 engine.program_helper.output_vars[0])]

    def init_comm(self, engine, paddle_init_comm):
        """``Engine._init_comm``: before the engine makes its communicators, every process
        agrees on the ring id of every group it shares and renumbers its own groups and
        programs (:mod:`pipesplit.passes.transport.rings`: the stages of a pipeline make
        their groups in different orders, and communicators meet by ring id); then the
        communicators are made in ring-id order on every process, and Paddle's own loop
        (``paddle_init_comm()``) finds them made."""
        if engine._nranks < 2:
            return paddle_init_comm()
        from pipesplit.passes.transport.rings import agree_on_rings, instantiate_in_order

        agree_on_rings(self._programs(engine), self.transport.share)
        instantiate_in_order()
        return paddle_init_comm()

    def _programs(self, engine) -> list:
        """Every program the engine holds (its modes' dense, dist and startup programs, and
        the jobs' programs of every plan): where a ring id can be."""
        programs = [program for table in (engine._pir_dense_main_progs,
                                          engine._pir_dist_main_progs,
                                          engine._pir_dist_startup_progs)
                    for program in table.values()]
        plans = [engine._job_plan] + [planned.plan for planned in self.modes.values()]
        for plan in plans:
            if plan is not None:
                programs += [plan.ir_program(t) for t in plan.job_types()]
        unique = {id(p): p for p in programs}
        return list(unique.values())

    def check_batch(self, engine, mode: str, args) -> None:
        """``DistModel.__call__``, before the step: the batch a step is given holds as many
        samples as the mode's first (:func:`~.loader_checks.check_batch`), checked on every
        rank alike: a loader's short last batch is refused at the step that draws it, not at
        ``to_static`` (a trainer stopping at ``max_steps`` never draws it)."""
        planned = self.modes.get(mode)
        if planned is None:
            return
        dims = leading_dims([t for a in args
                             for t in (a if isinstance(a, (list, tuple)) else [a])])
        if planned.batch_dims is None:
            planned.batch_dims = dims
            if mode == "train" and dims and dims[0] is not None:
                self._say_the_micro_batch(dims[0])
        names = [spec.name for spec in _as_list(engine._inputs_spec)
                 + _as_list(engine._labels_spec)]
        check_batch(dims, planned.batch_dims, names, planned.steps, mode)

    def _say_the_micro_batch(self, batch: int) -> None:
        """The first training step's line when the batch cuts into micro-batches of another
        size than ``micro_batch_size`` asked (:func:`~.knobs.micro_batch_notice`)."""
        line = micro_batch_notice(self.asked_micro_batch_size, batch, self.request.config.
                                  num_micro_batches)
        if line is not None and line not in self.notices:
            self.notices = self.notices + (line,)
            say([line])

    # --------------------------------------------------------------------- each run
    def run(self, engine, paddle_run, kwargs):
        """``Engine.run``: one step of the mode that runs, as the list of
        :data:`~.run_steps.RUN_STEPS` (count, measure, Paddle's run, re-plan, the loss to the
        last stage).  ``paddle_run()`` is Paddle's ``Engine.run`` with the caller's arguments;
        ``kwargs`` are those arguments by name (the mode)."""
        return run_steps(Run(session=self, engine=engine, paddle_run=paddle_run, kwargs=kwargs))


def _as_list(specs) -> list:
    if specs is None:
        return []
    return list(specs) if isinstance(specs, (list, tuple)) else [specs]


def _same_specs(a, b) -> bool:
    a, b = _as_list(a), _as_list(b)
    return len(a) == len(b) and all(x.name == y.name and list(x.shape) == list(y.shape)
                                    for x, y in zip(a, b))

"""One world for every pipeline section: what a reader of ``strategy.pipeline`` asks is the one
object at the section's handle (:func:`held_request`).

* An engine's section (``engine._strategy.pipeline``) holds its :class:`~.session.EngineSession`,
  opened once with the engine.
* Any other section (the pass applied without an engine: ``pipeline_pass([program],
  [program], strategy.pipeline)``, a user's check) gets a :class:`SectionRequest`: its request
  resolved once, checked and its schedule built (:func:`~.strategy_checks.checked_request`),
  kept at the same handle, resolved again only when the fields it was resolved from changed.

Both answer the same questions (:attr:`serves_an_engine`, ``config``, ``config_on``,
``pp_stage``, ``pipe``, ``requested``, ``notices``, ``pipeline_pass``); the readers in
:mod:`pipesplit.passes.strategy` and the pass itself (:func:`~.hooks.pipeline_pass`) ask
without asking which it is.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

from pipesplit.passes.engine.state import (HANDLE, EngineState, Request, UserOptions, handle_of,
                                           options_of)
from pipesplit.passes.engine.strategy_config import pipeline_rank

#: the fields of a section its request is resolved from (another value resolves it again)
RESOLVED_FROM = ("schedule_mode", "pp_degree", "vpp_degree", "accumulate_steps",
                 "split_backward", "vpp_seg_method", "program_runtimes", "memory_limit_times")


@dataclass(eq=False)
class SectionRequest:
    """A pipeline section outside an engine, resolved once at its handle (module docstring)."""

    options: UserOptions
    request: Request             # resolved once, its schedule built
    resolved_from: tuple         # the fields, the user's options and the blocks it came from
    built: Optional[object] = None  # the PipelinePlan its pass built last

    serves_an_engine = False
    pipe = None                  # no stage meshes seen: one process per stage
    notices = ()

    def __deepcopy__(self, memo):
        # DistModel copies the user's strategy for its engine: the engine starts from the
        # user's options and resolves its own request at its opening
        return copy.deepcopy(self.options, memo)

    @property
    def config(self):
        return self.request.config

    @property
    def requested(self) -> str:
        return self.request.name

    def pp_stage(self) -> Optional[int]:
        """This process's pipeline rank (Paddle's rule outside an engine; None: one process)."""
        return pipeline_rank(self.request.pp, None)

    def config_on(self, pp_stage: Optional[int]):
        return self.request.config_on(pp_stage)

    def pipeline_pass(self, main, startup):
        """The pass on a whole-model program (chunk id = global stage), with the schedule
        built when the request was checked; the plan kept as the one built last."""
        from pipesplit.passes.split.pipeline import split_and_schedule

        self.built = split_and_schedule(main, startup, self.config_on(self.pp_stage()),
                                        requested=self.request.resolved)
        return self.built


def held_request(pipeline_strategy, blocks: Optional[list] = None):
    """The one object every reader of ``pipeline_strategy`` asks: its engine's session, else
    its :class:`SectionRequest` (made now, or again when the fields, the user's options or
    ``blocks`` it was resolved from changed).  ``blocks``: the stage meshes' block counts of a
    section outside an engine (:func:`~pipesplit.job_list.request.sized_costs`)."""
    from pipesplit.passes.engine.strategy_checks import checked_request

    handle = handle_of(pipeline_strategy)
    if isinstance(handle, EngineState):
        return handle
    resolved_from = (tuple(_frozen(getattr(pipeline_strategy, name)) for name in RESOLVED_FROM),
                     options_of(pipeline_strategy),
                     None if blocks is None else tuple(blocks))
    if isinstance(handle, SectionRequest) and handle.resolved_from == resolved_from:
        return handle
    held = SectionRequest(options_of(pipeline_strategy), checked_request(pipeline_strategy, blocks),
                          resolved_from)
    setattr(pipeline_strategy, HANDLE, held)
    return held


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value

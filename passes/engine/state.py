"""What pipesplit keeps for one engine: the data of its session, at ONE handle.

Paddle's engine hands its hooks the engine (``Engine.run``, ``to_mode`` ...) or only its copy
of ``strategy.pipeline`` (``pipeline_pass``, ``complete_chunk_id``).  Everything pipesplit
knows about an engine is therefore one :class:`EngineState`, the data of the engine's
:class:`~.session.EngineSession` (which adds the moments Paddle gives it as methods), kept at
:data:`HANDLE` on the engine's copy of the pipeline section (which the engine alone owns:
``DistModel`` hands it a deep copy of the user's strategy) and reached from the engine as
``engine._strategy.pipeline`` (:func:`~.session.session_of_engine`):

* made once, at the engine's opening (:func:`~.open_state.open_engine_state`): the strategy
  checked, the fields Paddle derives filled in, the request resolved ONCE into a
  :class:`Request` (the name, its schedule's spec, pp, vpp, placement, whether it searches,
  the config on every rank, the schedule built) beside the measured step; every later
  reader takes them from here, never from the strategy's fields again;
* then filled in as the engine goes: this process's pipeline (:attr:`EngineState.pipe`, from
  the stage meshes at chunk completion), the loader's meshes, one :class:`ModePlan` per mode,
  the training steps run and the last re-plan.

Before ``dist.to_static`` the same handle on the USER's strategy holds the user's
:class:`UserOptions` (:mod:`.user_options`: ``use_costs`` / ``measure_costs`` /
``use_memory_budget``), which the deep copy carries to the engine's copy and
:func:`~.open_state.open_engine_state` takes over.  An engine whose pipeline section has
no session is Paddle's own: every hook leaves it alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Optional, Union

from pipesplit.job_list import Schedule
from pipesplit.job_list.costs import Costs
from pipesplit.job_list.pipe import Pipe
from pipesplit.job_list.placement import Placement
from pipesplit.job_list.registry import ScheduleSpec
from pipesplit.job_list.request import PipelineConfig, RequestedSchedule

#: the one attribute pipesplit sets on a Paddle object (a strategy's pipeline section)
HANDLE = "_pipesplit"
#: :attr:`UserOptions.measure_step` when the user did not call ``measure_costs``
DEFAULT_MEASURE = "default"


@dataclass(frozen=True)
class Request:
    """What ``strategy.pipeline`` asks of pipesplit, resolved once
    (:func:`~.strategy_config.resolve_request`, in one call to job_list): an engine's at its
    opening, kept in its :class:`EngineState`; a section's outside an engine at its handle."""

    name: str                      # schedule_mode as the user wrote it ("auto-v")
    resolved: RequestedSchedule    # job_list's answer: the config, on each rank, the schedule
    seg_method: str = ""           # vpp_seg_method: the class of the model's repeated blocks

    @property
    def config(self) -> PipelineConfig:
        """The sizes and options, checked (pp_stage None: no rank)."""
        return self.resolved.config

    @property
    def schedule(self) -> Schedule:
        """The compute schedule, built once when the request was resolved (the plan takes it)."""
        return self.resolved.schedule

    @property
    def spec(self) -> ScheduleSpec:
        """The schedule the name resolved to (``spec.name``: the canonical name)."""
        return self.config.spec

    @property
    def placement(self) -> Placement:
        """Where the schedule puts each chunk (looped or V) on pp x vpp."""
        return self.config.placement

    @property
    def searches(self) -> bool:
        """The schedule searches (``ScheduleSpec.searches``: auto / autoV)."""
        return self.config.spec.searches

    @property
    def pp(self) -> int:
        return self.config.pp_degree

    @property
    def vpp(self) -> int:
        return self.config.vpp_degree

    def config_on(self, pp_stage: Optional[int]) -> PipelineConfig:
        """The config on pipeline rank ``pp_stage`` (None: every rank, emulated in one
        process), made when the request was resolved; another value is refused by
        :meth:`~pipesplit.job_list.request.PipelineConfig.on_rank`, naming it."""
        if pp_stage is None:
            return self.config
        if type(pp_stage) is int and 0 <= pp_stage < len(self.resolved.ranks):
            return self.resolved.ranks[pp_stage]
        return self.config.on_rank(pp_stage)  # (raises: pp_stage out of [0, pp))


@dataclass(frozen=True)
class UserOptions:
    """What the user asked of pipesplit beside ``strategy.pipeline``, before ``to_static``."""

    costs: Optional[Costs] = None                          # use_costs
    measure_step: Union[int, None, str] = DEFAULT_MEASURE  # measure_costs
    memory_budget: Optional[int] = None                    # use_memory_budget (bytes)
    reshard_after_forward: bool = True                     # reshard_after_forward


@dataclass
class ModePlan:
    """One mode's (train / eval / predict) plan, as the engine prepared it."""

    pipeline: object             # pipesplit.passes.split.core.PipelinePlan
    #: the engine fields it keeps ONE copy of for all modes, as this mode set them
    engine_fields: Dict[str, object]
    steps: int = 0               # steps run in this mode
    batch_dims: Optional[tuple] = None  # the first step's batch sizes (loader_checks)

    @property
    def plan(self):
        return self.pipeline.plan

    @property
    def progress(self):
        return self.pipeline.comm_progress


@dataclass(eq=False)  # one per engine: equal to itself only (and hashable, for the door)
class EngineState:
    """Everything pipesplit keeps for one engine (see the module docstring)."""

    request: Request              # the strategy's request, resolved once (schedule built)
    options: UserOptions
    measure_step: Optional[int]   # the training step measured for a re-plan (None: none)
    user_placements: dict         # the user's (mesh, placements) per distributed parameter
    parameter_names: frozenset    # the names of the model's parameters (its scope variables)
    scope: object = None          # the scope the engine was built in (Paddle's global scope)
    pipe: Optional[Pipe] = None   # this process's pipeline, from the stage meshes
    sharded_loader: bool = False  # the data come from a dist.shard_dataloader
    fed_meshes: Dict[str, object] = field(default_factory=dict)  # feed name -> its mesh
    built: Optional[object] = None  # the PipelinePlan the pass built last
    modes: Dict[str, ModePlan] = field(default_factory=dict)
    train_steps: int = 0          # training steps run (the measured step counts them)
    replanned: Optional[object] = None  # pipesplit.passes.engine.replanning.Replanned
    # parameters read on another stage's rank (pipesplit.passes.engine.shared_parameters)
    shared_parameters: tuple = ()
    # what hands a V placement's loss to the last stage (pipesplit.passes.engine.loss_location)
    loss_carrier: Optional[object] = None
    # what moves between this engine's processes: its device's Transport
    # (pipesplit.passes.transport.devices.transport_for), chosen once where the state is opened
    transport: Optional[object] = None
    # strategy fields of no effect here or done differently, said once (passes.engine.knobs)
    notices: tuple = ()
    # strategy.pipeline.micro_batch_size as the user set it (said at the first step if the
    # batch cuts otherwise: knobs.micro_batch_notice)
    asked_micro_batch_size: Optional[int] = None
    # strategy.return_numpy: a step's loss handed on as numpy (else as a Tensor)
    return_numpy: bool = True
    # strategy.fused_passes lists passes the engine runs on the first plan's programs (a
    # re-plan could not repeat them)
    fused_passes: bool = False

    def __deepcopy__(self, memo):
        return self  # one state per engine, however often Paddle copies its strategy

    @property
    def requested(self) -> str:
        """The schedule name as the user wrote it."""
        return self.request.name

    @property
    def config(self) -> PipelineConfig:
        """The request's config (pp_stage None: no rank yet)."""
        return self.request.config

    @property
    def placement_kind(self) -> str:
        return self.request.placement.kind

    def pipeline_of(self, mode: str):
        """The PipelinePlan of ``mode`` (None before the engine prepared it)."""
        plan = self.modes.get(mode)
        return None if plan is None else plan.pipeline


def handle_of(pipeline_strategy):
    return getattr(pipeline_strategy, HANDLE, None)


def options_of(pipeline_strategy) -> UserOptions:
    """The user's options on a section: held alone before ``to_static``, or by what its handle
    holds (an engine's state, a section's resolved request: :mod:`.section`)."""
    handle = handle_of(pipeline_strategy)
    if isinstance(handle, UserOptions):
        return handle
    options = getattr(handle, "options", None)
    return options if isinstance(options, UserOptions) else UserOptions()


def set_options(pipeline_strategy, **changes) -> None:
    """Record a user option on the user's pipeline section (before ``to_static``)."""
    if isinstance(handle_of(pipeline_strategy), EngineState):
        raise ValueError("this strategy is an engine's own copy (dist.to_static was called): "
                         "give options on the strategy before dist.to_static, or re-plan a "
                         "built engine with pipesplit.passes.strategy.replan(dist_model, costs)")
    setattr(pipeline_strategy, HANDLE, replace(options_of(pipeline_strategy), **changes))

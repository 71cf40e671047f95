"""A pipeline request: the pass attributes (or a strategy's pipeline section) checked once into
a :class:`PipelineConfig`, and the compute schedule it asks for.

:func:`request_schedule` is the passes' one way in: the attributes checked, the costs of
stages of uneven size and a memory limit priced in 1F1B's peak filled in, the schedule built
and every rank's config made, at once, into a :class:`RequestedSchedule` the passes then only
read.  Every bad value is a ValueError / TypeError naming it (a schedule that cannot serve
checked sizes: :class:`CannotServe`).  Pure Python, like all of ``job_list``: the passes and
the engine integration read a request, they do not derive it again."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Optional, Sequence, Tuple, Union

from .bounds import MemoryLimit, checked_memory_limit
from .costs import Costs
from .ir import Schedule
from .placement import Placement, check_positive_int
from .registry import ScheduleSpec, build_schedule, get_spec, searching_schedules
from .simulate import simulate
from .validate import validate

#: Attributes Paddle's own pipeline passes take, plus pipesplit's.
KNOWN_ATTRS = {
    "num_micro_batches": "micro-batches per step (the executor splits the batch into this many)",
    "pp_degree": "pipeline ranks",
    "pp_stage": "this process's rank; None emulates every rank in one process",
    "vpp_degree": "chunks (virtual stages) per rank",
    "split_backward": "split each backward into backward_b and backward_w",
    "grad_accumulation": "'avg' (default, matches a mean loss) or 'sum' over micro-batches",
    "costs": "pipesplit.job_list.Costs or a dict, for the simulator and the auto schedule",
    "memory_limit": "peak activation memory per rank for the auto schedule (simulator units; "
                    "one number, or one per pipeline rank)",
    "enable_backward_forward_overlap": "accepted for compatibility with Paddle's 1F1B; ignored",
}
ACCUMULATION_MODES = ("avg", "sum")


@dataclass(frozen=True)
class PipelineConfig:
    """A checked request: the schedule's spec (resolved once, by :meth:`from_attrs`), the sizes
    and the options.  ``schedule`` is the spec's canonical name; ``placement`` is made with the
    config from the spec and the degrees.  Nothing here looks a schedule up by name again."""

    spec: ScheduleSpec
    num_micro_batches: int
    pp_degree: int = 1
    vpp_degree: int = 1
    pp_stage: Optional[int] = None
    split_backward: bool = False
    grad_accumulation: str = "avg"
    costs: Optional[Costs] = None
    memory_limit: Optional[MemoryLimit] = None
    #: where the schedule puts each chunk (looped or V) on these degrees
    placement: Placement = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # (frozen: the one derived field is set as the config is made)
        object.__setattr__(self, "placement", self.spec.placed(self.pp_degree, self.vpp_degree))

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                          if f.repr and f.name != "spec")
        return f"{type(self).__name__}(schedule={self.schedule!r}, {shown})"

    @property
    def schedule(self) -> str:
        """The schedule's canonical name (``"ZBV"`` for ``"zb-v"``)."""
        return self.spec.name

    @property
    def num_stages(self) -> int:
        return self.pp_degree * self.vpp_degree

    @property
    def splits_backward(self) -> bool:
        """True when the sub-programs need backward_b / backward_w (asked for or implied)."""
        return self.split_backward or self.spec.splits_backward

    @classmethod
    def from_attrs(cls, schedule: Union[str, ScheduleSpec], attrs: dict) -> "PipelineConfig":
        """The request ``attrs`` make of ``schedule`` (a name, looked up here, or the spec a
        caller resolved it to already), checked."""
        if not isinstance(attrs, dict):
            raise TypeError(f"pass attrs must be a dict, got {type(attrs).__name__}")
        unknown = sorted(set(attrs) - set(KNOWN_ATTRS))
        if unknown:
            raise ValueError(f"unknown pass attrs {unknown}; known: {sorted(KNOWN_ATTRS)}")
        # (ValueError for an unknown name)
        spec = schedule if isinstance(schedule, ScheduleSpec) else get_spec(schedule)
        if "num_micro_batches" not in attrs:
            raise ValueError("pass attr num_micro_batches is required (micro-batches per step)")
        m = check_positive_int("num_micro_batches", attrs["num_micro_batches"])
        pp = check_positive_int("pp_degree", attrs.get("pp_degree", 1))
        vpp = check_positive_int("vpp_degree", attrs.get("vpp_degree", 1))
        stage = attrs.get("pp_stage")
        if stage is not None:
            check_stage(stage, pp)
        split = attrs.get("split_backward", False)
        if not isinstance(split, bool):
            raise TypeError(f"split_backward must be a bool, got {type(split).__name__}")
        mode = attrs.get("grad_accumulation", "avg")
        if mode not in ACCUMULATION_MODES:
            raise ValueError(f"grad_accumulation must be one of {ACCUMULATION_MODES}, got {mode!r}")
        costs = attrs.get("costs")
        if isinstance(costs, dict):
            costs = Costs.from_dict(costs)
        if costs is not None and not isinstance(costs, Costs):
            raise TypeError(f"costs must be a Costs or a dict, got {type(costs).__name__}")
        if costs is not None:
            costs.check_stages(pp * vpp)
        limit = attrs.get("memory_limit")
        if limit is not None:
            limit = check_memory_limit(spec, limit, pp)
        return cls(spec, m, pp, vpp, stage, split, mode, costs, limit)

    def replaced(self, **changes) -> "PipelineConfig":
        """This request with ``changes`` (pass attributes: ``costs``, ``memory_limit`` ...),
        checked as :meth:`from_attrs` checks every request (costs of pp x vpp stages, a memory
        limit only for a schedule that searches); never ``dataclasses.replace``, which checks
        nothing.  The same request on another rank is :meth:`on_rank`."""
        attrs = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.init and f.name != "spec"}
        return type(self).from_attrs(self.spec, {**attrs, **changes})

    def on_rank(self, rank: Optional[int]) -> "PipelineConfig":
        """This request on pipeline rank ``rank`` (None: every rank, emulated in one process).
        Only the rank is checked (an int in [0, pp)): the rest was checked when the request
        was made, and a rank changes nothing else."""
        if rank is not None:
            check_stage(rank, self.pp_degree)
        return replace(self, pp_stage=rank)

    def generator_options(self) -> dict:
        """The options the schedule's generator takes from this request (costs, memory limit)."""
        options = {}
        if self.costs is not None:
            options["costs"] = self.costs
        if self.memory_limit is not None:
            options["memory_limit"] = self.memory_limit
        return self.spec.accepted_options(options)

    def build(self) -> Schedule:
        """The compute schedule this request asks for, built (the ``auto`` search run), not
        yet validated (:func:`request_schedule` keeps it for the plan opening)."""
        return self.spec.build(self.pp_degree, self.vpp_degree, self.num_micro_batches,
                               split_backward=self.split_backward, **self.generator_options())


class CannotServe(ValueError):
    """The schedule of a checked request cannot serve its sizes (its generator refused them):
    ``cause`` is the generator's error (a :class:`~.placement.SizeError` names the size)."""

    def __init__(self, schedule: str, cause: ValueError):
        super().__init__(f"{schedule} cannot serve this request: {cause}")
        self.schedule = schedule
        self.cause = cause


@dataclass(frozen=True)
class RequestedSchedule:
    """A request resolved at once by :func:`request_schedule`: what the passes read of it after
    the one call (nothing here is derived again)."""

    config: PipelineConfig                 # the checked request (no rank)
    ranks: Tuple[PipelineConfig, ...]      # the request on each pipeline rank, in rank order
    schedule: Schedule                     # the compute schedule, built (the auto search run)


def request_schedule(schedule: Union[str, ScheduleSpec], attrs: dict, *,
                     blocks: Optional[Sequence[int]] = None,
                     memory_limit_times: Optional[float] = None) -> RequestedSchedule:
    """The request ``attrs`` (pass attributes, no rank) make of ``schedule`` (a name, looked up
    here), checked (:meth:`PipelineConfig.from_attrs`), completed and built:

    * ``blocks`` (the blocks each pipeline rank keeps, where they differ): without costs in
      ``attrs``, unit job costs scaled per virtual stage by its share of the blocks dealt to
      it (:meth:`~.placement.Placement.deal_blocks`), so the schedule is built and simulated
      for stages of uneven size;
    * ``memory_limit_times``: for a schedule that searches, its memory limit per rank at that
      many times the peak 1F1B reaches there (:func:`times_1f1b_peak`); a fixed schedule's
      order fixes its peak, so the times are not its to take (the caller says so);
    * the schedule built once (:class:`CannotServe` when it cannot serve the sizes), and the
      config made on every rank."""
    config = PipelineConfig.from_attrs(schedule, attrs)
    if blocks is not None and config.costs is None:
        config = config.replaced(costs=sized_costs(config.placement, blocks))
    if memory_limit_times is not None and config.spec.searches:
        config = config.replaced(memory_limit=times_1f1b_peak(
            memory_limit_times, config.pp_degree, config.vpp_degree, config.num_micro_batches))
    try:
        built = config.build()
    except ValueError as e:
        raise CannotServe(config.schedule, e) from None
    return RequestedSchedule(config, tuple(config.on_rank(rank)
                                           for rank in range(config.pp_degree)), built)


def sized_costs(placement: Placement, blocks: Sequence[int]) -> Costs:
    """Unit job costs scaled per global virtual stage by its share of ``blocks`` (the blocks
    each rank keeps), dealt to its chunks on ``placement``
    (:meth:`~.placement.Placement.deal_blocks`)."""
    dealt = placement.deal_blocks(blocks)
    mean = sum(dealt) / len(dealt)
    scale = [n / mean for n in dealt]
    return Costs(forward=scale, backward_b=scale, backward_w=scale)


def times_1f1b_peak(times: float, pp: int, vpp: int, m: int) -> list:
    """A memory limit per rank of ``times`` the peak 1F1B reaches on the rank, in the
    simulator's units of one virtual stage's activations (a rank's layers are ``vpp`` such
    stages)."""
    peaks = simulate(build_schedule("1F1B", pp=pp, vpp=1, m=m)).peak_memory
    return [times * peak * vpp for peak in peaks]


def make_schedule(config: PipelineConfig) -> Schedule:
    """The validated compute schedule ``config`` asks for."""
    schedule = config.build()
    validate(schedule)
    return schedule


def check_stage(stage, pp: int) -> int:
    """``pp_stage`` checked: an int in [0, ``pp``)."""
    check_positive_int("pp_stage", stage, minimum=0)
    if stage >= pp:
        raise ValueError(f"pp_stage must be < pp_degree ({pp}), got {stage}")
    return stage


def check_memory_limit(spec: ScheduleSpec, limit, pp: int) -> MemoryLimit:
    """``memory_limit`` checked (:func:`~.bounds.checked_memory_limit`: a finite number > 0,
    or one per pipeline rank), given to a schedule that searches under it.

    A fixed schedule (1F1B, ZBV ...) has the peak its order implies; a limit it would ignore is
    refused rather than dropped, so a run never looks limited when it is not."""
    limit = checked_memory_limit(limit, pp)
    if not spec.searches:
        takers = searching_schedules()
        raise ValueError(f"memory_limit is not used by schedule {spec.name}: only {takers} "
                         f"search under a memory limit; {spec.name}'s peak is fixed by its "
                         f"order (drop memory_limit, or use one of {takers})")
    return limit

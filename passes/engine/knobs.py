"""Every strategy field that meets a pipeline, and what pipesplit does with a value a user sets:
the one table (:data:`KNOBS`) that ``docs/engine.md`` shows ("Every knob") and that the code
follows.

A row is honoured (the run does what the field says), refused (a ``ValueError`` naming the
field, before anything trains), of no effect here, or done differently from what it asks; the
last two are said once, in a line of the run's output naming the field, its value and what is
done instead (a :class:`PipesplitNotice` warning, kept on the engine's session:
``pipesplit.passes.strategy.notices(dist_model)``).  A script Paddle's own pass trains is never
refused for a field Paddle ignores too: it is told.

The rows' handlers run at three moments:

* :func:`refuse_what_cannot_work` - ``DistModel.__init__``, before Paddle's (tensor fusion
  crashes inside it on a CPU build);
* :func:`notices_at_the_opening` - the engine's opening (what the strategy alone says);
* :func:`micro_batch_notice` - the first training step (the batch a step is given).

The translations of the honoured fields live with the rest of the strategy's translation
(:mod:`.strategy_config`: ``program_runtimes`` into job costs, ``memory_limit_times`` into
``auto``'s memory limit), the engine's copy is changed only at its opening
(:func:`~.open_state.fill_in_what_paddle_derives`), and the transport takes
``enable_send_recv_overlap`` there too (:func:`~.open_state.open_engine_state`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

HONOURED, REFUSED, NO_EFFECT, DIFFERS = ("honoured", "refused", "no effect here",
                                         "done differently")
VERDICTS = (HONOURED, REFUSED, NO_EFFECT, DIFFERS)

#: Paddle's defaults of the two fields whose default is a value, not "unset"
PADDLE_PROGRAM_RUNTIMES = (61, 72, 71, 34, 3)
UNSET_MEMORY_LIMIT_TIMES = -1
#: what Paddle's ``program_runtimes`` lists, in its order (its zero-bubble pass's reading)
RUNTIME_FIELDS = ("forward", "backward_b", "backward_w", "loss", "communication")


class PipesplitNotice(UserWarning):
    """A strategy field of no effect here, or done differently from what it asks: said once."""


@dataclass(frozen=True)
class Opening:
    """What a knob's handler may look at: the whole ``dist.Strategy`` (the engine's copy at the
    opening, the user's before ``DistModel``), whether this is a CPU build, and the schedule
    the strategy names (its spec) with whether its plan is measured and re-planned (known at
    the opening, which resolves the request; before ``DistModel``: no spec, no re-plan)."""

    strategy: object
    on_cpu: bool
    spec: object                 # the ScheduleSpec schedule_mode names (None: not resolved yet)
    replans: bool                # a measured training step re-plans (auto on a CPU build)
    costs_given: bool            # use_costs gave costs
    budget_given: bool           # use_memory_budget gave a budget


@dataclass(frozen=True)
class Knob:
    """One row of the table: ``path`` (``section.field``), its verdict for a value a user sets,
    the table's words (``how``), and its handlers: ``refuse(opening)`` raises, ``notice``
    (opening) returns the line to say or None."""

    path: str
    verdict: str
    how: str
    refuse: Optional[Callable[[Opening], None]] = None
    notice: Optional[Callable[[Opening], Optional[str]]] = None

    @property
    def section(self) -> str:
        return self.path.split(".")[0]

    @property
    def field(self) -> str:
        return self.path.split(".", 1)[1]

    def value(self, strategy):
        return getattr(getattr(strategy, self.section), self.field)


def _value(opening: Opening, path: str):
    section, field = path.split(".", 1)
    return getattr(getattr(opening.strategy, section), field)


# --------------------------------------------------------------------------- handlers

def _overlap_on_cpu(opening: Opening) -> Optional[str]:
    if opening.on_cpu and _value(opening, "pipeline.enable_send_recv_overlap"):
        return ("strategy.pipeline.enable_send_recv_overlap=True has no effect on this CPU "
                "build: its transfers are gloo broadcasts, which block, in one global order")
    return None


def runtimes_given(pipeline) -> bool:
    """``program_runtimes`` differs from Paddle's default (a user set it)."""
    value = pipeline.program_runtimes
    return value is not None and tuple(value) != PADDLE_PROGRAM_RUNTIMES


def check_program_runtimes(value) -> Tuple[float, ...]:
    """``program_runtimes`` as five finite numbers >= 0 (:data:`RUNTIME_FIELDS`), else a
    ``TypeError`` / ``ValueError`` naming the field."""
    import math

    where = "strategy.pipeline.program_runtimes"
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{where} must be a list of {len(RUNTIME_FIELDS)} numbers "
                        f"{list(RUNTIME_FIELDS)}, got {type(value).__name__} {value!r}")
    if len(value) != len(RUNTIME_FIELDS) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0 for v in value):
        raise ValueError(f"{where} must be {len(RUNTIME_FIELDS)} finite numbers >= 0 "
                         f"{list(RUNTIME_FIELDS)}, got {value!r}")
    return tuple(float(v) for v in value)


def _refuse_two_costs(opening: Opening) -> None:
    pipeline = opening.strategy.pipeline
    if not runtimes_given(pipeline):
        return
    check_program_runtimes(pipeline.program_runtimes)
    if opening.costs_given:
        raise ValueError("strategy.pipeline.program_runtimes and use_costs(strategy, ...) both "
                         "give job costs: give one (use_costs takes a cost file that `pipesplit "
                         "profile` measured)")


def memory_limit_times_given(pipeline) -> bool:
    return pipeline.memory_limit_times != UNSET_MEMORY_LIMIT_TIMES


def check_memory_limit_times(times) -> float:
    """``memory_limit_times`` as a finite number > 0, else a ``TypeError`` / ``ValueError``
    naming the field."""
    import math

    where = "strategy.pipeline.memory_limit_times"
    if isinstance(times, bool) or not isinstance(times, (int, float)):
        raise TypeError(f"{where} must be a number (a multiple of 1F1B's peak memory), got "
                        f"{type(times).__name__} {times!r}")
    if not math.isfinite(times) or times <= 0:
        raise ValueError(f"{where} must be > 0 (a multiple of 1F1B's peak memory) or "
                         f"{UNSET_MEMORY_LIMIT_TIMES} (none), got {times!r}")
    return float(times)


def _refuse_bad_memory_limit_times(opening: Opening) -> None:
    times = opening.strategy.pipeline.memory_limit_times
    if not memory_limit_times_given(opening.strategy.pipeline):
        return
    check_memory_limit_times(times)
    where = "strategy.pipeline.memory_limit_times"
    if opening.budget_given:
        raise ValueError(f"{where}={times} and use_memory_budget(strategy, ...) both limit "
                         "auto's memory: give one")


def _memory_limit_times_fixed(opening: Opening) -> Optional[str]:
    pipeline = opening.strategy.pipeline
    if memory_limit_times_given(pipeline) and not opening.spec.searches:
        return (f"strategy.pipeline.memory_limit_times={pipeline.memory_limit_times} has no "
                f"effect on schedule_mode={pipeline.schedule_mode!r}: its order fixes its "
                "peak (auto and autoV plan under it)")
    return None


def _unread(path: str, default, instead: str):
    def notice(opening: Opening) -> Optional[str]:
        value = _value(opening, path)
        if value == default:
            return None
        return f"strategy.{path}={value!r} has no effect: {instead}"
    return notice


def _sync_shared_params(opening: Opening) -> Optional[str]:
    if not opening.strategy.pipeline.auto_parallel_sync_shared_params:
        return None
    return ("strategy.pipeline.auto_parallel_sync_shared_params=True: a weight read on "
            "another stage (a tied embedding) is served by pipesplit's own exchange (the "
            "weight sent to its reader each step, its gradient summed back into the owner's), "
            "not Paddle's sync pass: the same training, one copy of the weight")


def _merge_sum(opening: Opening) -> Optional[str]:
    merge = opening.strategy.gradient_merge
    if not merge.avg:
        return ("strategy.gradient_merge.avg=False: the micro-batch gradients are averaged, "
                "as Paddle's engine does beside a pipeline (it sets avg=True itself); scale "
                "the loss by accumulate_steps for the sum")
    return None


def _refuse_sharding_overlap_on_cpu(opening: Opening) -> None:
    if not opening.on_cpu:
        return
    sharding = opening.strategy.sharding
    for field in ("enable_overlap", "enable_tensor_fusion"):
        if getattr(sharding, field, False):
            raise ValueError(
                f"strategy.sharding.{field}=True beside a pipeline cannot run on a CPU build: "
                "Paddle's engine stops in its optimizer's copy (Paddle's own 1F1B too); "
                f"leave strategy.sharding.{field} False on CPU")


def _refuse_fused_passes_with_a_replan(opening: Opening) -> None:
    fused = opening.strategy.fused_passes
    # the user's dist.Strategy names the passes (gemm_epilogue, dropout_add); the engine's
    # copy lists them (fused_passes_list)
    named = getattr(fused, "fused_passes_list", None) or getattr(fused, "gemm_epilogue", False) \
        or getattr(fused, "dropout_add", False)
    if opening.replans and fused.enable and named:
        raise ValueError(
            f"strategy.fused_passes with schedule_mode={opening.strategy.pipeline.schedule_mode!r}"
            " on a CPU build: its measured training step re-plans, and the engine ran the "
            "fused passes on the first plan's programs only; turn fused_passes off, or give "
            "costs (use_costs) so that nothing is re-planned")


# --------------------------------------------------------------------------- the table

_SEE = "`docs/engine_usage.md`"
KNOBS: Tuple[Knob, ...] = (
    Knob("pipeline.enable", HONOURED, "pipesplit serves the pipeline (after "
         "`enable_strategy()`)"),
    Knob("pipeline.schedule_mode", HONOURED, "any pipesplit schedule name or alias; an "
         "unknown one is refused with a suggestion"),
    Knob("pipeline.pp_degree", HONOURED, "left at 1, the number of stage meshes; another "
         "value must equal it (refused otherwise)"),
    Knob("pipeline.vpp_degree", HONOURED, "chunks per rank; a schedule that cannot take it "
         "is refused naming the constraint"),
    Knob("pipeline.vpp_seg_method", HONOURED, "the block class dealt to the chunks "
         "(misspelt: refused with the model's classes)"),
    Knob("pipeline.accumulate_steps", HONOURED, "micro-batches per step: the batch is cut "
         "into this many"),
    Knob("pipeline.micro_batch_size", DIFFERS, "the micro-batch is the batch / "
         "`accumulate_steps`, as in Paddle's engine; another value is said at the first "
         "step"),
    Knob("pipeline.split_backward", HONOURED, "classic schedules run I and W apart"),
    Knob("pipeline.enable_send_recv_overlap", HONOURED, "NCCL: True keeps transfers on their "
         "own streams, False runs them on the compute stream; no effect on the CPU "
         "transport (gloo blocks), said", notice=_overlap_on_cpu),
    Knob("pipeline.program_runtimes", HONOURED, "[forward, backward_b, backward_w, loss, "
         "communication] become the job costs (`loss` added to the last stage's forward) "
         "every schedule is lowered and simulated with, `auto` / `autoV` search with, and "
         "nothing is measured; with `use_costs` too: refused", refuse=_refuse_two_costs),
    Knob("pipeline.memory_limit_times", HONOURED, "`auto` / `autoV`: a memory limit of that "
         "many times 1F1B's peak on each rank; bad values and a `use_memory_budget` beside "
         "it refused; no effect on a fixed order, said",
         refuse=_refuse_bad_memory_limit_times, notice=_memory_limit_times_fixed),
    Knob("pipeline.auto_parallel_sync_shared_params", DIFFERS, "a weight read on another "
         "stage is served by pipesplit's own exchange, not Paddle's sync pass (same "
         "training), said", notice=_sync_shared_params),
    Knob("pipeline.generation_batch_size", NO_EFFECT, "not read by Paddle's auto-parallel "
         "engine either; said", notice=_unread(
             "pipeline.generation_batch_size", 1, "neither Paddle's auto-parallel engine nor "
             "pipesplit reads it (there is no pipelined generation)")),
    Knob("pipeline.job_schedule_profiler_start", NO_EFFECT, "not read by Paddle's "
         "auto-parallel engine either; said", notice=_unread(
             "pipeline.job_schedule_profiler_start", -1, "Paddle's auto-parallel engine does "
             "not read it (`pipesplit profile` and Paddle's profiler time the jobs)")),
    Knob("pipeline.job_schedule_profiler_stop", NO_EFFECT, "as `job_schedule_profiler_start`",
         notice=_unread("pipeline.job_schedule_profiler_stop", -1, "Paddle's auto-parallel "
                        "engine does not read it (`pipesplit profile` and Paddle's profiler "
                        "time the jobs)")),
    Knob("gradient_merge.enable", HONOURED, "beside a pipeline, the pipeline's own "
         "accumulation (Paddle's engine turns it on itself)"),
    Knob("gradient_merge.k_steps", HONOURED, "left at 1 or equal to `accumulate_steps`; "
         "another value is refused (Paddle would accumulate `accumulate_steps`)"),
    Knob("gradient_merge.avg", DIFFERS, "False: averaged all the same, as Paddle's engine "
         "does beside a pipeline, said", notice=_merge_sum),
    Knob("sharding.enable_overlap", REFUSED, "beside a pipeline on a CPU build (Paddle's "
         "engine crashes on it); on CUDA, Paddle's", refuse=_refuse_sharding_overlap_on_cpu),
    Knob("sharding.enable_tensor_fusion", REFUSED, "as `sharding.enable_overlap`",
         refuse=_refuse_sharding_overlap_on_cpu),
    Knob("fused_passes.enable", REFUSED, "with `auto` / `autoV` re-planned from a measured "
         "step (a CPU build without costs): the re-plan could not repeat the fused passes; "
         "otherwise Paddle runs them on the plan's programs",
         refuse=_refuse_fused_passes_with_a_replan),
)


def knob(path: str) -> Knob:
    return next(k for k in KNOBS if k.path == path)


# --------------------------------------------------------------------------- the moments

def refuse_what_cannot_work(opening: Opening) -> None:
    """Every refused value of the table, before anything is built (``ValueError`` /
    ``TypeError`` naming the field)."""
    for row in KNOBS:
        if row.refuse is not None:
            row.refuse(opening)


def notices_at_the_opening(opening: Opening) -> Tuple[str, ...]:
    """The lines the strategy alone calls for (each field once)."""
    said = []
    for row in KNOBS:
        line = row.notice(opening) if row.notice is not None else None
        if line is not None and line not in said:
            said.append(line)
    return tuple(said)


def micro_batch_notice(asked: int, batch: int, accumulate_steps: int) -> Optional[str]:
    """The first step's line when ``micro_batch_size`` is not the batch it was given over
    ``accumulate_steps``."""
    got = batch // accumulate_steps if accumulate_steps else batch
    if asked == got:
        return None
    return (f"strategy.pipeline.micro_batch_size={asked} has no effect: the batch of {batch} "
            f"is cut into accumulate_steps={accumulate_steps} micro-batches of {got}, as "
            "Paddle's engine cuts it")


def say(lines) -> None:
    """Say each line once in the run's output."""
    for line in lines:
        warnings.warn(line, PipesplitNotice, stacklevel=2)

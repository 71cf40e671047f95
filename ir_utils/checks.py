"""Checks that keep bad input away from Paddle's C++ (where it crashes or trains wrong).

Two groups:

* program checks, run by the pass on its private clone or read-only on the input:
  :func:`check_one_optimizer_step` and :func:`check_stage_flow`;
* run-time checks of :class:`~pipesplit.ir_utils.runner.PlanRunner`: what a plan reads
  (:func:`plan_inputs`), every feed of every step (:func:`check_feed`) and the persistable
  variables the scope must hold (:func:`missing_scope_vars`).

Every failure is a ``ValueError`` / ``TypeError`` whose first line names the parameter (or
feed / variable) and the constraint.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from paddle.base.data_feeder import _PADDLE_PIR_DTYPE_2_NUMPY_DTYPE

from .complete import GRAD_OP_RE, OPTIMIZER_OP_RE, SINK_OPS, is_source_op
from .regions import inputs_of
from .roles import ACC_SUFFIX, COUNT_PREFIX, ROLE_BACKWARD, ROLE_FORWARD

DATA_OP = "pd_op.data"
PARAMETER_OP = "builtin.parameter"
#: the learning rate an LR scheduler drives: Paddle's optimizer makes it a parameter named
#: ``unique_name.generate("learning_rate")``; a constant rate is a persistable data op instead
SCHEDULED_LR_RE = re.compile(r"learning_rate_\d+$")


# --------------------------------------------------------------------------- programs

def _where(op, index: int) -> str:
    return f"{op.name()} (op #{index})"


def check_one_optimizer_step(program) -> None:
    """Refuse a program with more than one optimizer step (e.g. ``minimize()`` called twice).

    The unsplit program runs backward 1, update 1, backward 2 (reading the updated parameters),
    update 2; the pipeline runs every backward before the one optimizer job, so it would train
    differently without saying so.  Two signs, checked on the ops in program order: a parameter
    updated by two optimizer ops, or a gradient op after an optimizer op."""
    first_update: Optional[Tuple[int, object]] = None
    updated_at: Dict[str, int] = {}
    for index, op in enumerate(program.global_block().ops):
        name = op.name()
        if OPTIMIZER_OP_RE.match(name):
            if first_update is None:
                first_update = (index, op)
            param = _parameter_name(op.operand_source(0)) if op.num_operands() else None
            if param is not None:
                if param in updated_at:
                    raise ValueError(
                        f"{_TWO_STEPS}: parameter {param} is updated twice ({name} at op #"
                        f"{updated_at[param]} and op #{index}); {_ONE_STEP}")
                updated_at[param] = index
        elif first_update is not None and GRAD_OP_RE.match(name):
            at, update = first_update
            raise ValueError(
                f"{_TWO_STEPS}: backward op {_where(op, index)} follows optimizer op "
                f"{_where(update, at)}; {_ONE_STEP}")


_TWO_STEPS = "program has more than one optimizer step (minimize() called twice?)"
_ONE_STEP = "pipesplit runs one optimizer step per program, after every micro-batch's backward"


def _parameter_name(value) -> Optional[str]:
    if value is None or not value.initialized():
        return None
    producer = value.get_defining_op()
    if producer is None or producer.name() != PARAMETER_OP:
        return None
    return producer.attrs()["parameter_name"]


def check_stage_flow(program) -> None:
    """Refuse data that flows against the pipeline (``program``: completed, chunk id = stage).

    A forward op of stage s runs before every forward of a later stage (same micro-batch), so
    it may read only forward values of stages <= s; a backward op of stage s runs before the
    backwards of earlier stages, so it may read only backward values of stages >= s (forward
    values of any stage are done by then).  Source ops (parameters, data, constants) are
    re-created where used and sinks go with their producer, so neither counts."""
    ops = list(program.global_block().ops)
    # each op's (role, stage) read once (None: a source op, or neither forward nor backward),
    # and whether it is a sink: every read from Python crosses into C++, and an op is the
    # producer of several others
    placed, sinks = {}, set()
    for op in ops:
        role = op.op_role
        placed[op] = None if role not in (ROLE_FORWARD, ROLE_BACKWARD) or is_source_op(op) \
            else (role, op.chunk_id)
        if op.name() in SINK_OPS:
            sinks.add(op)
    for i, op in enumerate(ops):
        if placed[op] is None or op in sinks:
            continue
        role, stage = placed[op]
        for value in inputs_of(op):  # (a control-flow op's captured values too)
            producer = value.get_defining_op()
            if producer is None:
                continue
            p_role, p_stage = placed.get(producer) or (None, None)  # (outside the block: None)
            if p_role is None or p_stage is None or p_stage < 0:
                continue
            if p_role == role and (p_stage > stage if role == ROLE_FORWARD else p_stage < stage):
                index = {o.id(): k for k, o in enumerate(ops)}
                raise ValueError(
                    f"program data flows against the pipeline, from stage {p_stage} to stage "
                    f"{stage}: "
                    f"{_ROLE_NAMES[role]} op {_where(op, i)} of stage {stage} reads the output "
                    f"of {_ROLE_NAMES[p_role]} op "
                    f"{_where(producer, index.get(producer.id(), -1))} of stage {p_stage}; "
                    + _FLOW_RULE[role])


_ROLE_NAMES = {ROLE_FORWARD: "forward", ROLE_BACKWARD: "backward"}
_FLOW_RULE = {
    ROLE_FORWARD: "a forward op may read only forward values of its own or earlier stages (check "
             "the pir_chunk_id_guard around these layers)",
    ROLE_BACKWARD: "a backward op may read only gradients of its own or later stages",
}


# --------------------------------------------------------------------------- run time

@dataclass(frozen=True)
class FeedSpec:
    """One input the plan reads: a non-persistable ``pd_op.data`` op."""

    name: str
    dtype: str                # numpy dtype name
    shape: Tuple[int, ...]    # as declared; -1 = any

    def describe(self) -> str:
        dims = ", ".join("?" if d < 0 else str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


@dataclass(frozen=True)
class PlanInputs:
    feeds: Dict[str, FeedSpec]
    persistables: Tuple[str, ...]   # variables the scope must hold before a step
    # learning-rate parameters of an LR scheduler (SCHEDULED_LR_RE) the plan reads
    scheduled_lr: Tuple[str, ...] = ()


def plan_inputs(plan) -> PlanInputs:
    """The feeds, persistable variables and scheduled learning rates the sub-programs of
    ``plan`` read."""
    feeds: Dict[str, FeedSpec] = {}
    persistables: Dict[str, None] = {}
    scheduled_lr: Dict[str, None] = {}
    for job_type in plan.job_types():
        block = plan.ir_program(job_type).global_block()
        for name, kwarg in block.kwargs().items():
            if kwarg.persistable:
                persistables[name] = None
        for op in block.ops:
            if op.name() == PARAMETER_OP:
                name = op.attrs()["parameter_name"]
                persistables[name] = None
                if SCHEDULED_LR_RE.search(name):
                    scheduled_lr[name] = None
            elif op.name() == DATA_OP:
                value, name = op.result(0), op.attrs()["name"]
                if value.persistable:
                    persistables[name] = None
                elif name not in feeds:
                    dtype = _PADDLE_PIR_DTYPE_2_NUMPY_DTYPE.get(value.dtype, str(value.dtype))
                    feeds[name] = FeedSpec(name, dtype, tuple(int(d) for d in value.shape))
    return PlanInputs(feeds, tuple(persistables), tuple(scheduled_lr))


def check_feed(feed, specs: Mapping[str, FeedSpec], num_micro_batches: int
               ) -> Dict[str, np.ndarray]:
    """``feed`` as arrays, after checking it against the plan's data ops: every name present
    (every step: a missing feed would reuse the previous step's values), no unknown names,
    dtype and trailing shape as declared, one batch size (dim 0) > 0 divisible by the
    micro-batch count."""
    if not isinstance(feed, Mapping):
        raise TypeError(f"feed must be a dict of name -> array, got {type(feed).__name__}")
    missing = sorted(set(specs) - set(feed))
    if missing:
        raise ValueError(f"feed lacks {missing}: every step must feed all of the plan's inputs "
                         f"{_spec_list(specs)}")
    unknown = sorted(set(feed) - set(specs))
    if unknown:
        raise ValueError(f"feed has {unknown}, which the plan does not read; its inputs are "
                         f"{_spec_list(specs)}")
    arrays: Dict[str, np.ndarray] = {}
    batch: Optional[Tuple[str, int]] = None
    for name in specs:
        spec, array = specs[name], np.asarray(feed[name])
        # float8 has no numpy dtype: Paddle takes such arrays as they come
        if _numpy_knows(spec.dtype) and array.dtype != np.dtype(spec.dtype):
            raise ValueError(f"feed {name!r} has dtype {array.dtype}, the program declares "
                             f"{spec.describe()}")
        if array.ndim != len(spec.shape):
            raise ValueError(f"feed {name!r} has shape {list(array.shape)} ({array.ndim} dims), "
                             f"the program declares {spec.describe()}")
        wrong = [i for i in range(1, array.ndim) if 0 <= spec.shape[i] != array.shape[i]]
        if wrong:
            raise ValueError(f"feed {name!r} has shape {list(array.shape)}, the program declares "
                             f"{spec.describe()} (dim {wrong[0]} differs)")
        rows = array.shape[0]
        if batch is None:
            batch = (name, rows)
        elif rows != batch[1]:
            raise ValueError(f"feed {name!r} has {rows} rows but feed {batch[0]!r} has "
                             f"{batch[1]}: every feed holds the same batch (dim 0)")
        arrays[name] = array
    if batch is not None:
        name, rows = batch
        if rows == 0:
            raise ValueError(f"feed {name!r} has 0 rows: the batch (dim 0) needs at least "
                             f"num_micro_batches={num_micro_batches} rows")
        if rows % num_micro_batches:
            raise ValueError(f"feed {name!r}: batch size (dim 0) {rows} is not divisible by "
                             f"num_micro_batches={num_micro_batches}")
    return arrays


def _numpy_knows(dtype: str) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return True


def _spec_list(specs: Mapping[str, FeedSpec]) -> str:
    return "{" + ", ".join(f"{n}: {s.describe()}" for n, s in sorted(specs.items())) + "}"


def missing_scope_vars(scope, names) -> List[str]:
    return [n for n in names if scope.find_var(n) is None]


def describe_missing(missing: List[str]) -> str:
    """Why variables a plan needs may be absent from the scope, and what to do."""
    accumulators = [n for n in missing if n.endswith(ACC_SUFFIX) or n.startswith(COUNT_PREFIX)]
    others = [n for n in missing if n not in accumulators]
    parts = []
    if accumulators:
        parts.append(f"gradient accumulators {_few(accumulators)}: call "
                     "pipeline.init_scope(scope) after running the startup program")
    if others:
        parts.append(f"{_few(others)}: run the startup program in this scope (and do not "
                     "erase what the plan reads)")
    return "; ".join(parts)


def _few(names: List[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... ({len(names)} in all)" if len(names) > limit else "")

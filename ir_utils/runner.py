"""Run split sub-programs as a ``core.Plan`` on Paddle's standalone executor (one process)."""
from __future__ import annotations

import weakref
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

import paddle
from paddle.base import core

from pipesplit.job_list.ir import (BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD, OPTIMIZER,
                                   RECV_BACKWARD, RECV_FORWARD, SEND_BACKWARD, SEND_FORWARD,
                                   job_type)

from .checks import check_feed, describe_missing, missing_scope_vars, plan_inputs

#: core.Plan -> the program whose LR scheduler the plan runs under (a program with
#: ``lr_scheduler`` and ``lr_name``), recorded by :func:`make_plan`.  Weak keys: an entry lives
#: as long as its plan (the program with it), and no later plan can take its place.
_LR_PROGRAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
#: what a place is: ``core.Place`` and each kind of place (in Paddle 3.0.0 ``paddle.CPUPlace()``
#: and its kin are not subclasses of ``core.Place``; in 3.3.1 they are)
_PLACES = tuple(getattr(core, name) for name in ("Place", "CPUPlace", "CUDAPlace",
                                                  "CUDAPinnedPlace", "XPUPlace", "IPUPlace",
                                                  "CustomPlace") if hasattr(core, name))


def required_vars_of(programs: Dict[str, "paddle.pir.Program"]) -> Dict[str, set]:
    """Non-persistable named values each sub-program reads or writes, minus the values it hands
    over whose buffers no program reads (:func:`shape_only_handoffs`; as Paddle's
    ``_set_skip_gc_vars_in_pir`` drops them, so their producer frees their memory)."""
    no_need = shape_only_handoffs(programs)
    named = named_values(programs)
    return {t: named[t] - no_need[t] for t in programs}


def named_values(programs: Dict[str, "paddle.pir.Program"]) -> Dict[str, set]:
    """Non-persistable named values each sub-program reads or writes."""
    out = {}
    for t, prog in programs.items():
        req, pers = set(), set()
        blk = prog.global_block()
        for name, kwarg in blk.kwargs().items():
            req.add(name)
            if kwarg.persistable:
                pers.add(name)
        # every operand of a top-level op is a kwarg or a result of a top-level op: the
        # results alone name every value (each read from Python costs microseconds)
        for op in blk.ops:
            if op.name() == "builtin.shadow_output":
                name = op.str_attr("output_name")
                req.add(name)
                if op.operand_source(0).persistable:
                    pers.add(name)
            for v in op.results():
                if v.has_name:
                    req.add(v.name)
                    if v.persistable:
                        pers.add(v.name)
        out[t] = req - pers
    return out


def written_names(program) -> set:
    """Names a program hands over (``builtin.shadow_output``)."""
    return {op.str_attr("output_name") for op in program.global_block().ops
            if op.name() == "builtin.shadow_output"}


def shape_only_handoffs(programs: Dict[str, "paddle.pir.Program"]) -> Dict[str, set]:
    """Per program, the names it hands over that the programs read for their shape only: the
    name is an input (block argument or ``pd_op.data``) somewhere, and each op using such an
    input reads it once, in a no-need-buffer operand (``add_grad``'s ``x``).  Only those may be
    freed by their producer; a later job reading one for its data would find no memory.

    Paddle's ``core.get_no_need_buffer_values`` means the same, but lets whichever use it visits
    last decide (a name read for its shape by one op and for its data by another, in the same
    or another program, can come out "no need buffer"): that freed live values of
    ``paddle.nn.TransformerEncoderLayer`` programs with a split backward."""
    walks = {t: _outputs_and_inputs(prog) for t, prog in programs.items()}
    written = {t: w for t, (w, _) in walks.items()}
    handed_over = set().union(*written.values())
    shape_read, data_read = set(), set()
    for _, inputs in walks.values():
        for name, value in inputs:
            if name not in handed_over or name in data_read:
                continue  # only handed-over names can be freed; one data read settles a name
            for op in value.all_used_ops():
                slots = sum(1 for v in op.operands_source() if v.is_same(value))
                if slots == 1 and op.is_no_need_buffer(value):
                    shape_read.add(name)
                else:
                    data_read.add(name)
                    break
    shape_only = shape_read - data_read
    return {t: written[t] & shape_only for t in programs}


def _inputs(program):
    """(name, value) of every input of ``program``: block arguments and ``pd_op.data`` results."""
    return _outputs_and_inputs(program)[1]


def _outputs_and_inputs(program):
    """From one walk over ``program``'s ops: the names it hands over (:func:`written_names`)
    and (name, value) of every input: block arguments and ``pd_op.data`` results."""
    blk = program.global_block()
    written, inputs = set(), list(blk.kwargs().items())
    for op in blk.ops:
        name = op.name()
        if name == "builtin.shadow_output":
            written.add(op.str_attr("output_name"))
        elif name == "pd_op.data":
            inputs.append((op.str_attr("name"), op.result(0)))
    return written, inputs


def _check_m(num_micro_batches):
    if not isinstance(num_micro_batches, int) or isinstance(num_micro_batches, bool) \
            or num_micro_batches < 1:
        raise ValueError(f"num_micro_batches must be an int >= 1, got {num_micro_batches!r}")


def make_plan(job_order: Sequence[Tuple[str, int]], programs: Dict[str, "paddle.pir.Program"],
              num_micro_batches: int, required_vars: Optional[Dict[str, Iterable[str]]] = None,
              *, gc_order: Optional[Sequence[Tuple[str, int]]] = None) -> "core.Plan":
    """``core.Plan`` running ``job_order`` ((job type, micro-batch id) pairs, in order).

    Skip-gc sets: walking the order backwards per micro-batch, a job keeps (does not free) the
    non-persistable values that a later job of the same micro-batch still reads.  ``gc_order``:
    a longer order that ``job_order`` begins; the skip-gc sets are then those of ``gc_order``
    (a value a later, absent job would read stays alive after the plan ends: profiling's
    prefix plans).  ``required_vars``: the non-persistable named values of the programs the
    caller knows them for (a split records them as it builds the programs); the others are
    walked (:func:`named_values`)."""
    _check_m(num_micro_batches)
    job_order = list(job_order)
    if not job_order:
        raise ValueError("job_order is empty")
    gc_order = job_order if gc_order is None else list(gc_order)
    if gc_order[:len(job_order)] != job_order:
        raise ValueError("gc_order must begin with job_order")
    for t, mb in gc_order:
        if t not in programs:
            raise ValueError(f"job type {t!r} has no program (have {sorted(programs)})")
        if not isinstance(mb, int) or not 0 <= mb < num_micro_batches:
            raise ValueError(f"micro-batch id {mb!r} of {t} not in [0, {num_micro_batches})")
    used = {t: programs[t] for t in dict.fromkeys(t for t, _ in job_order)}
    gc_used = {t: programs[t] for t in dict.fromkeys(t for t, _ in gc_order)}
    known = required_vars or {}
    named = named_values({t: p for t, p in gc_used.items() if t not in known})
    no_need = shape_only_handoffs(gc_used)
    required = {t: set(known[t] if t in known else named[t]) - no_need[t] for t in gc_used}
    skip = skip_gc_sets(gc_order, required, num_micro_batches)
    jobs = []
    for (t, mb), keep in zip(job_order, skip):
        job = core.Job(t)
        job.set_micro_batch_id(mb)
        job.set_skip_gc_vars(keep)
        jobs.append(job)
    plan = core.Plan(jobs, used)
    lr_program = _lr_program_among(used)
    if lr_program is not None:
        _LR_PROGRAMS[plan] = lr_program
    return plan


def _lr_program_among(programs: Dict[str, "paddle.pir.Program"]):
    """The program of ``programs`` carrying an LR scheduler (the pass's sub-programs get it
    from the training program: :func:`pipesplit.ir_utils.extract.carry_lr_scheduler`); None
    if none does.  Programs carrying different schedulers are refused."""
    found = {}
    for t, program in programs.items():
        scheduler = getattr(program, "lr_scheduler", None)
        if scheduler is not None:
            found.setdefault((id(scheduler), getattr(program, "lr_name", None)), (t, program))
    if len(found) > 1:
        raise ValueError(f"programs {sorted(t for t, _ in found.values())} carry different LR "
                         "schedulers; a plan runs under one")
    return next(iter(found.values()))[1] if found else None


def lr_program_of(plan):
    """The program whose LR scheduler ``plan`` runs under, as :func:`make_plan` found it among
    the plan's programs (every plan pipesplit's passes build from a program with an LR
    scheduler has one); None if there is none."""
    try:
        return _LR_PROGRAMS.get(plan)
    except TypeError:  # not weak-referenceable: never recorded
        return None


def skip_gc_sets(job_order: Sequence[Tuple[str, int]], required: Dict[str, set],
                 num_micro_batches: int) -> List[set]:
    """Per job of ``job_order``, the values of ``required[type]`` that a later job of the same
    micro-batch still reads (walking the order backwards)."""
    later = [set() for _ in range(num_micro_batches)]
    skip: List[set] = [set() for _ in job_order]
    for i in reversed(range(len(job_order))):
        t, mb = job_order[i]
        skip[i] = required[t] & later[mb]
        later[mb] |= required[t]
    return skip


def fthenb_order(num_chunks: int, num_micro_batches: int, split_backward: bool = False
                 ) -> List[Tuple[str, int]]:
    """All forwards (stage order) per micro-batch, then all backwards (reverse stage order)
    per micro-batch, then the optimizer (micro-batch 0)."""
    _check_m(num_micro_batches)
    order = []
    backward = [BACKWARD_B, BACKWARD_W] if split_backward else [BACKWARD]
    for mb in range(num_micro_batches):
        for c in range(num_chunks):
            order += [(job_type(kind, c), mb) for kind in (RECV_FORWARD, FORWARD, SEND_FORWARD)]
    for mb in range(num_micro_batches):
        for c in reversed(range(num_chunks)):
            order += [(job_type(kind, c), mb)
                      for kind in [RECV_BACKWARD] + backward + [SEND_BACKWARD]]
    order.append((OPTIMIZER, 0))
    return order


def as_tensor(array, place):
    t = core.DenseTensor()
    t.set(np.ascontiguousarray(array), place)
    return t


class PlanRunner:
    """Runs one ``core.Plan`` step after step in one scope, keeping Paddle's executor (building
    it costs about as much as a small step).

    Before each step the feed is checked against the plan's data ops and the scope against the
    persistable variables the plan reads (see :mod:`pipesplit.ir_utils.checks`): Paddle's
    executor would otherwise crash on a missing or replaced variable, or silently reuse the
    previous step's value of a missing feed.  A variable erased and created again gets a fresh
    executor.  Do not call ``drop_kids()`` on the scope while the runner is in use: it frees the
    micro-batch scopes the executor keeps, and Paddle offers no way to notice.
    """

    def __init__(self, plan, scope, place=None, program=None):
        """When the plan runs under an LR scheduler, every step first writes the scheduler's
        current value into the learning-rate variable, as ``paddle.static.Executor.run`` does,
        so ``scheduler.step()`` between steps works unchanged.  The scheduler is found without
        help for every plan pipesplit builds from a program with one (:func:`lr_program_of`);
        ``program`` (the training program the plan was split from, with
        ``program.lr_scheduler``) names it for a plan built elsewhere.  A plan reading a
        scheduler's learning-rate parameter whose scheduler is not known is refused
        (``ValueError``): its rate would silently stay the initial one."""
        if not isinstance(plan, core.Plan):
            raise TypeError(f"plan must be a paddle core.Plan (apply_pass(...) or "
                            f"PipelinePlan.plan), got {type(plan).__name__}")
        if not isinstance(scope, core._Scope):
            raise TypeError(f"scope must be a paddle.static.Scope (e.g. init_scope(model, "
                            f"split)), got {type(scope).__name__}")
        if place is not None and not isinstance(place, _PLACES):
            raise TypeError(f"place must be a paddle place such as paddle.CPUPlace(), got "
                            f"{type(place).__name__}")
        self.plan = plan
        self.scope = scope
        self.place = place if place is not None else paddle.CPUPlace()
        self.num_micro_batches = plan.micro_batch_num()
        _check_m(self.num_micro_batches)
        self.inputs = plan_inputs(plan)
        self.program = _lr_program(plan, program, self.inputs.scheduled_lr)
        self._executor = None
        self._bound = {}  # scope variable name -> the Variable the kept executor was built on

    def _check_scope(self) -> None:
        """Every persistable variable the plan reads is in the scope (else ``ValueError``)."""
        missing = missing_scope_vars(self.scope, self.inputs.persistables)
        if missing:
            self._executor = None  # built on variables that are gone: never run it again
            raise ValueError(f"scope lacks {len(missing)} variable(s) the plan reads: "
                             f"{describe_missing(missing)}")

    def _executor_is_stale(self) -> bool:
        """Whether a scope variable the kept executor holds a pointer to (parameters, feed and
        fetch variables ...) was erased or replaced since it was built."""
        find = self.scope.find_var
        return any(find(name) is not var for name, var in self._bound.items())

    def step(self, feed: Dict[str, np.ndarray]) -> List[np.float32]:
        """One step on the FULL batch ``feed`` (the executor cuts dim 0 into micro-batches);
        returns the fetched values, one per micro-batch (for a single fetch such as the loss:
        per-micro-batch losses as ``np.float32``; with several fetches a list per fetch)."""
        m = self.num_micro_batches
        arrays = check_feed(feed, self.inputs.feeds, m)
        self._check_scope()
        for name, arr in arrays.items():
            core.set_feed_variable(self.scope, as_tensor(arr, self.place), name, 0)
        apply_lr_scheduler(self.program, self.scope, self.place)
        if self._executor is not None and self._executor_is_stale():
            self._executor = None  # rebuild on the scope's current variables
        fresh = self._executor is None
        if fresh:
            self._executor = paddle.base.executor._StandaloneExecutor(self.place, self.plan,
                                                                       self.scope)
        try:
            out = self._executor.run(list(arrays))
        except BaseException:
            self._executor = None  # a run that failed half-way leaves nothing to reuse
            raise
        if fresh:  # what it holds now: everything the scope has after its first run
            self._bound = {n: self.scope.find_var(n) for n in self.scope.local_var_names()}
        per_fetch = []
        for x in out:
            arr = np.asarray(x)
            arr = arr.reshape(m, -1) if arr.size % m == 0 else arr
            per_fetch.append([np.float32(r[0]) if r.size == 1 else r for r in arr])
        if len(per_fetch) == 1:
            return per_fetch[0]
        return per_fetch


def apply_lr_scheduler(program, scope, place=None) -> Optional[float]:
    """Write ``program.lr_scheduler()`` (the optimizer's LR scheduler, if it has one) into the
    learning-rate variable ``program.lr_name`` of ``scope``, as ``Executor.run`` does before each
    run in PIR mode.  Returns the value written, or None when there is no scheduler."""
    scheduler = getattr(program, "lr_scheduler", None) if program is not None else None
    if scheduler is None:
        return None
    name = program.lr_name
    var = scope.find_var(name)
    if var is None:
        raise ValueError(f"learning-rate variable {name!r} of the program's LR scheduler is not "
                         "in the scope: run the startup program in it first")
    tensor = var.get_tensor()
    current = np.array(tensor)
    value = float(scheduler())
    tensor.set(np.full(current.shape, value, dtype=current.dtype),
               place if place is not None else paddle.CPUPlace())
    return value


def _lr_program(plan, program, scheduled_lr: Sequence[str]):
    """The program whose LR scheduler a runner of ``plan`` applies: ``program`` if it has a
    scheduler, else the one recorded for the plan (:func:`lr_program_of`), else ``program``.
    ``scheduled_lr``: the learning-rate parameters of a scheduler the plan reads; one of them
    with no scheduler known, or not the one the scheduler drives, raises ValueError.  (Plans
    from apply_pass / apply_pipeline / new_pass, and make_plan of split_program's
    sub-programs, have theirs recorded; a core.Plan made elsewhere may not.)"""
    for candidate in (program, lr_program_of(plan)):
        if getattr(candidate, "lr_scheduler", None) is None:
            continue
        name = getattr(candidate, "lr_name", None)
        if scheduled_lr and name not in scheduled_lr:
            raise ValueError(f"the program's LR scheduler drives learning-rate variable "
                             f"{name!r}, but the plan reads {list(scheduled_lr)}: pass the "
                             "training program the plan was split from")
        return candidate
    if scheduled_lr:
        raise ValueError(
            f"the plan reads the learning rate {list(scheduled_lr)} of an LR scheduler, but no "
            "scheduler is known for it (its rate would stay the initial one): pass the "
            "training program the plan was split from, PlanRunner(plan, scope, program=main)")
    return program


def run_plan(plan, scope, feed: Dict[str, np.ndarray], place=None, program=None
             ) -> List[np.float32]:
    """One step of ``plan`` (see :meth:`PlanRunner.step`; ``program`` as there); use a
    PlanRunner for several."""
    return PlanRunner(plan, scope, place, program=program).step(feed)


def read_params(scope, names: Iterable[str]) -> Dict[str, np.ndarray]:
    """Copies of the tensors ``names`` in ``scope``."""
    names = list(names)
    missing = missing_scope_vars(scope, names)
    if missing:
        raise ValueError(f"scope has no variable(s) {missing[:8]}")
    return {n: np.array(scope.find_var(n).get_tensor()) for n in names}


def run_unsplit_baseline(model, steps: int, num_micro_batches: int, place=None):
    """Train ``model`` unsplit for ``steps`` full-batch steps (batch ``model.make_batch(step)``).
    Returns (losses[step][micro_batch] computed by the forward-only program on each
    micro-batch before the update, final params dict)."""
    _check_m(num_micro_batches)
    if model.batch_size % num_micro_batches:
        raise ValueError(f"batch_size ({model.batch_size}) must be divisible by "
                         f"num_micro_batches ({num_micro_batches})")
    place = place if place is not None else paddle.CPUPlace()
    exe = paddle.static.Executor(place)
    scope = paddle.static.Scope()
    losses = []
    # Executor.run applies the program's LR scheduler; step it as a training loop does and
    # leave it as it was found, so the pipeline run after this one starts from the same LR
    scheduler = getattr(model.main, "lr_scheduler", None)
    scheduler_state = scheduler.state_dict() if scheduler is not None else None
    with paddle.static.scope_guard(scope):
        exe.run(model.startup)
        for step in range(steps):
            batch = model.make_batch(step)
            mb = model.batch_size // num_micro_batches
            row = []
            for j in range(num_micro_batches):
                part = {k: v[j * mb:(j + 1) * mb] for k, v in batch.items()}
                (l,) = exe.run(model.forward_program, feed=part, fetch_list=[model.forward_loss])
                row.append(np.float32(l))
            losses.append(row)
            exe.run(model.main, feed=batch, fetch_list=[model.main_loss])
            if scheduler is not None:
                scheduler.step()
        params = read_params(scope, model.param_names)
    if scheduler is not None:
        scheduler.set_state_dict(scheduler_state)
    return losses, params


def init_scope(model, split=None, place=None):
    """A new scope with the model's startup program run and ``split``'s accumulators zeroed."""
    place = place if place is not None else paddle.CPUPlace()
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(place)
    with paddle.static.scope_guard(scope):
        exe.run(model.startup)
    if split is not None:
        split.init_scope(scope, place)
    return scope

"""Schedules by name: one :class:`ScheduleSpec` per generator, found by :func:`get_spec` (the
one look-up of a name, aliases and case aside), and one ``build`` for every generator.

A generator is a function ``(pp, vpp, m, **options) -> list of per-rank job lists`` (compute jobs
only).  It raises ``ValueError`` naming the parameter for a configuration its definition cannot
serve.  :meth:`ScheduleSpec.build` checks the common arguments, applies ``split_backward`` and
wraps the result in a :class:`Schedule`; :func:`build_schedule` is the same by name.  A request
(:class:`~.request.PipelineConfig`) holds its spec and never looks its name up again.
"""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, Job, Schedule
from .placement import LOOPED, PLACEMENTS, Placement, check_positive_int

Generator = Callable[..., List[List[Job]]]


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    generator: Generator
    placement: str = LOOPED
    aliases: Tuple[str, ...] = ()
    #: True when the generator itself emits backward_b / backward_w (zero-bubble family).
    splits_backward: bool = False
    description: str = ""

    @property
    def searches(self) -> bool:
        """Whether this schedule is searched (``auto`` / ``autoV``): its generator takes a
        ``memory_limit``, so costs, a memory limit and a memory budget change its order (a
        fixed schedule's order, and its peak, are its definition).  The one rule for "does
        this schedule search?"."""
        return accepts_option(self.generator, "memory_limit")

    def placed(self, pp: int, vpp: int) -> Placement:
        """Where this schedule puts each chunk on ``pp`` ranks of ``vpp`` chunks."""
        return Placement(self.placement, pp, vpp)

    def accepted_options(self, options: dict) -> dict:
        """The subset of ``options`` this schedule's generator takes (e.g. only ``auto`` takes
        ``costs`` and ``memory_limit``)."""
        return {key: value for key, value in options.items()
                if accepts_option(self.generator, key)}

    def build(self, pp: int, vpp: int = 1, m: int = 1, *, split_backward: bool = False,
              **options) -> Schedule:
        """This compute-only schedule for ``pp`` ranks, ``vpp`` chunks, ``m`` micro-batches
        (:func:`build_schedule` without the look-up of a name)."""
        check_positive_int("pp", pp)
        check_positive_int("vpp", vpp)
        check_positive_int("m", m)
        if not isinstance(split_backward, bool):
            raise TypeError(f"split_backward must be a bool, got {type(split_backward).__name__}")
        ignored = sorted(set(options) - set(self.accepted_options(options)))
        if ignored:
            raise TypeError(f"schedule {self.name!r} takes no option(s) {ignored}")
        ranks = self.generator(pp, vpp, m, **options)
        if split_backward and not self.splits_backward:
            ranks = split_backward_jobs(ranks)
        return Schedule(name=self.name, pp=pp, vpp=vpp, m=m, placement=self.placed(pp, vpp),
                        ranks=[list(jobs) for jobs in ranks],
                        split_backward=split_backward or self.splits_backward,
                        options=dict(options))


_REGISTRY: Dict[str, ScheduleSpec] = {}
_LOOKUP: Dict[str, str] = {}


def register_schedule(name: str, *, aliases: Sequence[str] = (), placement: str = LOOPED,
                      splits_backward: bool = False, description: str = ""):
    """Decorator registering a generator under ``name`` (case-insensitive) and ``aliases``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")

    def decorate(generator: Generator) -> Generator:
        spec = ScheduleSpec(name, generator, placement, tuple(aliases), splits_backward,
                            description or (generator.__doc__ or "").strip().splitlines()[0])
        for key in (name, *aliases):
            owner = _LOOKUP.get(key.lower())
            if owner is not None and owner != name:
                raise ValueError(f"schedule name {key!r} is already registered by {owner!r}")
            _LOOKUP[key.lower()] = name
        _REGISTRY[name] = spec
        return generator

    return decorate


def schedule_names() -> List[str]:
    """Canonical names of every registered schedule, in registration order."""
    return list(_REGISTRY)


def schedule_specs() -> List[ScheduleSpec]:
    """Every registered schedule's spec, in registration order (no look-up by name)."""
    return list(_REGISTRY.values())


def searching_schedules() -> List[str]:
    """Canonical names of the schedules that search (:attr:`ScheduleSpec.searches`), in
    registration order."""
    return [spec.name for spec in schedule_specs() if spec.searches]


def get_spec(name: str) -> ScheduleSpec:
    if not isinstance(name, str):
        raise TypeError(f"schedule name must be a str, got {type(name).__name__}")
    canonical = _LOOKUP.get(name.lower())
    if canonical is None:
        known = ", ".join(sorted(_LOOKUP))
        raise ValueError(f"unknown schedule {name!r}{_did_you_mean(name)}; known names "
                         f"(case-insensitive): {known}")
    return _REGISTRY[canonical]


def _did_you_mean(name: str) -> str:
    """``" (did you mean 'ZBH1'?)"`` naming the schedules whose names or aliases are closest to
    a misspelled one; empty when none is close."""
    close = difflib.get_close_matches(name.lower(), list(_LOOKUP), n=5, cutoff=0.6)
    names = list(dict.fromkeys(_LOOKUP[key] for key in close))[:3]
    if not names:
        return ""
    return " (did you mean " + " or ".join(repr(n) for n in names) + "?)"


def accepts_option(function: Callable, name: str) -> bool:
    """True if ``function`` takes a keyword argument ``name`` (or ``**kwargs``): the one rule
    for which options reach a generator (also the cli's)."""
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    if name in params and params[name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                inspect.Parameter.KEYWORD_ONLY):
        return True
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())


def split_backward_jobs(ranks: Sequence[Sequence[Job]]) -> List[List[Job]]:
    """Replace every full backward by backward_b immediately followed by backward_w."""
    out = []
    for jobs in ranks:
        split: List[Job] = []
        for job in jobs:
            if job.kind == BACKWARD:
                split.append(Job(BACKWARD_B, job.chunk, job.micro_batch))
                split.append(Job(BACKWARD_W, job.chunk, job.micro_batch))
            else:
                split.append(job)
        out.append(split)
    return out


def build_schedule(name: str, pp: int, vpp: int = 1, m: int = 1, *, split_backward: bool = False,
                   **options) -> Schedule:
    """Build the compute-only schedule ``name`` for ``pp`` ranks, ``vpp`` chunks, ``m`` micro-batches.

    Zero-bubble schedules always emit backward_b / backward_w; for the others
    ``split_backward=True`` turns each backward into backward_b followed by backward_w.
    Extra ``options`` (e.g. ``costs``, ``memory_limit``) go to the generator.  (A caller that
    holds the spec already calls :meth:`ScheduleSpec.build`.)
    """
    return get_spec(name).build(pp, vpp, m, split_backward=split_backward, **options)


def serves(name: str, pp: int, vpp: int = 1, m: int = 1) -> bool:
    """Whether schedule ``name`` serves the configuration (False where it raises the
    ValueError naming its constraint)."""
    try:
        build_schedule(name, pp, vpp, m)
    except ValueError:
        return False
    return True

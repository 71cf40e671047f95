"""The job IR every stage of pipesplit speaks.

A job is ``(kind, chunk, micro_batch)``; its Paddle job type is :func:`job_type` of its kind and
chunk (``optimizer`` has no chunk), read back by :func:`parse_job_type`.  The short form
``{stage}{op}{mb}`` (PyTorch's pipelining CSV) names a job by its *global* virtual stage, so it
needs the placement to translate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from .placement import Placement

FORWARD = "forward"
BACKWARD = "backward"
BACKWARD_B = "backward_b"
BACKWARD_W = "backward_w"
SEND_FORWARD = "send_forward"
RECV_FORWARD = "recv_forward"
SEND_BACKWARD = "send_backward"
RECV_BACKWARD = "recv_backward"
OPTIMIZER = "optimizer"
#: a generator's (local chunk, micro-batch) pair; in job_list ``chunk`` is always a rank's local
#: chunk and ``stage`` a global virtual stage (``Placement.stage(rank, chunk)``)
Slot = Tuple[int, int]
#: ``Schedule.options`` key of an evaluation schedule: forward jobs only (see ``forward_only``)
FORWARD_ONLY = "forward_only"

KINDS = (FORWARD, BACKWARD, BACKWARD_B, BACKWARD_W, SEND_FORWARD, RECV_FORWARD,
         SEND_BACKWARD, RECV_BACKWARD, OPTIMIZER)
COMPUTE_KINDS = (FORWARD, BACKWARD, BACKWARD_B, BACKWARD_W)
COMM_KINDS = (SEND_FORWARD, RECV_FORWARD, SEND_BACKWARD, RECV_BACKWARD)

# Short-form op codes (PyTorch: F, B, I, W and SEND_F / RECV_F / SEND_B / RECV_B).
OP_OF_KIND = {
    FORWARD: "F", BACKWARD: "B", BACKWARD_B: "I", BACKWARD_W: "W",
    SEND_FORWARD: "SEND_F", RECV_FORWARD: "RECV_F",
    SEND_BACKWARD: "SEND_B", RECV_BACKWARD: "RECV_B",
}
KIND_OF_OP = {op: kind for kind, op in OP_OF_KIND.items()}
OPTIMIZER_ACTION = "OPT"

#: send / recv kind -> (offset from its stage to its peer's, the peer's matching kind)
_OTHER_END = {SEND_FORWARD: (1, RECV_FORWARD), RECV_FORWARD: (-1, SEND_FORWARD),
              SEND_BACKWARD: (-1, RECV_BACKWARD), RECV_BACKWARD: (1, SEND_BACKWARD)}

_ACTION_RE = re.compile(r"^(\d+)(F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B)(\d+)$")
#: a job type: a kind followed by its chunk / stage number (longest kind first: backward_b
#: before backward)
_TYPE_RE = re.compile(r"^(" + "|".join(sorted((k for k in KINDS if k != OPTIMIZER), key=len,
                                               reverse=True)) + r")(\d+)$")


def job_type(kind: str, chunk: Optional[int] = None) -> str:
    """The one writer of job-type strings: ``("backward_b", 3)`` -> ``"backward_b3"``,
    ``("optimizer", None)`` -> ``"optimizer"``; :func:`parse_job_type` reads them back.  The
    number is the chunk or the global stage, whichever the caller types its jobs by."""
    if kind == OPTIMIZER:
        return OPTIMIZER
    if kind not in KINDS or not isinstance(chunk, int) or isinstance(chunk, bool):
        raise ValueError(f"a job type needs a kind of {KINDS} and an int chunk, got "
                         f"({kind!r}, {chunk!r})")
    return f"{kind}{chunk}"


#: job-type prefix of the CPU transports' bystander jobs (a process's part in a collective of
#: jobs it does not run itself)
BYSTANDER = "bystander"


def bystander_type(owner: int, of: str) -> str:
    """The one writer of bystander job types: the bystander of job (or exchange) ``of`` of
    ``owner`` (a pipeline rank, or a sending stage): ``(1, "forward0")`` ->
    ``"bystander_1_forward0"``; :func:`parse_bystander_type` reads it back."""
    if isinstance(owner, bool) or not isinstance(owner, int) or not isinstance(of, str) \
            or not of:
        raise ValueError(f"a bystander job type needs an int owner and a job, got "
                         f"({owner!r}, {of!r})")
    return f"{BYSTANDER}_{owner}_{of}"


def parse_bystander_type(text: str) -> Optional[Tuple[int, str]]:
    """(owner, job) of a :func:`bystander_type`, or None for any other job type."""
    if not isinstance(text, str) or not text.startswith(BYSTANDER + "_"):
        return None
    owner, of = text[len(BYSTANDER) + 1:].split("_", 1)
    return int(owner), of


def other_end(kind: str, stage: int) -> Tuple[int, str]:
    """(global stage, kind) at the other end of a send / recv of ``kind`` on ``stage``: a
    forward output goes to the next stage, an input gradient to the previous one.  At the
    pipeline's ends the stage lies outside ``[0, num_stages)``."""
    offset, kind_there = _OTHER_END[kind]
    return stage + offset, kind_there


def parse_job_type(text: str) -> Tuple[str, Optional[int]]:
    """The one parser of job-type strings (:func:`job_type`'s): ``"backward_b3"`` ->
    ``("backward_b", 3)``, ``"send_forward0"`` -> ``("send_forward", 0)``, ``"optimizer"`` ->
    ``("optimizer", None)``.  The number is what the type's writer put there: a chunk in a
    schedule's job types, a global stage in per-stage profiles."""
    if text == OPTIMIZER:
        return OPTIMIZER, None
    match = _TYPE_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"not a pipesplit job type: {text!r} (expected a kind of {KINDS} "
                         f"followed by a number, or {OPTIMIZER!r})")
    return match.group(1), int(match.group(2))


@dataclass(frozen=True, order=True)
class Job:
    """One unit of work on one rank: ``kind`` of ``chunk`` for ``micro_batch``."""

    kind: str
    chunk: Optional[int] = None
    micro_batch: Optional[int] = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == OPTIMIZER:
            if self.chunk is not None or self.micro_batch is not None:
                raise ValueError("an optimizer job has neither chunk nor micro_batch")
            return
        for name in ("chunk", "micro_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0 for a {self.kind} job, got {value!r}")

    @property
    def type(self) -> str:
        """Paddle's job-type string, e.g. ``forward0``, ``backward_b1``, ``optimizer``."""
        return job_type(self.kind, self.chunk)

    @property
    def op(self) -> str:
        """Short-form op code: F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B or OPT."""
        return OPTIMIZER_ACTION if self.kind == OPTIMIZER else OP_OF_KIND[self.kind]

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    def __str__(self) -> str:
        if self.kind == OPTIMIZER:
            return OPTIMIZER
        return f"{self.type}[mb{self.micro_batch}]"


@dataclass(frozen=True)
class Action:
    """Short form of a job: global virtual ``stage``, ``op`` code, ``micro_batch``."""

    stage: Optional[int]
    op: str
    micro_batch: Optional[int]

    def __str__(self) -> str:
        if self.op == OPTIMIZER_ACTION:
            return OPTIMIZER_ACTION
        return f"{self.stage}{self.op}{self.micro_batch}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        text = text.strip()
        if text == OPTIMIZER_ACTION:
            return cls(None, OPTIMIZER_ACTION, None)
        match = _ACTION_RE.match(text)
        if not match:
            raise ValueError(
                f"action {text!r} is not of the form {{stage}}{{F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B}}{{mb}}")
        return cls(int(match.group(1)), match.group(2), int(match.group(3)))


@dataclass
class Schedule:
    """Per-rank ordered job lists of one pipeline schedule.

    ``ranks[r]`` is the list rank ``r`` runs in order.  ``placement`` maps (rank, chunk) to the
    global virtual stage.  ``lowered`` is True once send / recv jobs have been inserted.
    """

    name: str
    pp: int
    vpp: int
    m: int
    placement: Placement
    ranks: List[List[Job]]
    split_backward: bool = False
    lowered: bool = False
    options: dict = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    def stage_of(self, rank: int, job: Job) -> Optional[int]:
        return None if job.chunk is None else self.placement.stage(rank, job.chunk)

    def to_action(self, rank: int, job: Job) -> Action:
        if job.kind == OPTIMIZER:
            return Action(None, OPTIMIZER_ACTION, None)
        return Action(self.placement.stage(rank, job.chunk), job.op, job.micro_batch)

    def from_action(self, action: Action) -> Tuple[Optional[int], Job]:
        """(rank, job) of an action; the optimizer's rank is None (it runs on every rank)."""
        if action.op == OPTIMIZER_ACTION:
            return None, Job(OPTIMIZER)
        rank, chunk = self.placement.rank_chunk(action.stage)
        return rank, Job(KIND_OF_OP[action.op], chunk, action.micro_batch)

    def actions(self, rank: int) -> List[Action]:
        return [self.to_action(rank, job) for job in self.ranks[rank]]

    def compute_only(self) -> "Schedule":
        """A copy without send / recv / optimizer jobs."""
        return self.with_ranks([[j for j in jobs if j.is_compute] for jobs in self.ranks], lowered=False)

    def with_ranks(self, ranks: Sequence[Sequence[Job]], **changes) -> "Schedule":
        fields = dict(name=self.name, pp=self.pp, vpp=self.vpp, m=self.m, placement=self.placement,
                      ranks=[list(jobs) for jobs in ranks], split_backward=self.split_backward,
                      lowered=self.lowered, options=dict(self.options))
        fields.update(changes)
        return Schedule(**fields)

    @property
    def is_forward_only(self) -> bool:
        return bool(self.options.get(FORWARD_ONLY))

    def forward_only(self) -> "Schedule":
        """The evaluation (inference) form of a compute schedule: its forward jobs in its
        order, no backward jobs and no optimizer."""
        if self.lowered:
            raise ValueError("forward_only() takes a compute schedule (lower it afterwards)")
        return self.with_ranks([[j for j in jobs if j.kind == FORWARD] for jobs in self.ranks],
                               split_backward=False, options={**self.options, FORWARD_ONLY: True})

    def __str__(self) -> str:
        lines = [f"{self.name} pp={self.pp} vpp={self.vpp} m={self.m} placement={self.placement.kind}"]
        for rank in range(self.pp):
            lines.append(f"rank {rank}: " + " ".join(str(a) for a in self.actions(rank)))
        return "\n".join(lines)

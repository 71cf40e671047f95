"""Where a rank is in its step's communication: which comm job, micro-batch and peer.

Every comm program can bump a persistable counter (:data:`pipesplit.passes.transport.p2p.PROGRESS_VAR`)
once its transfers are done (``build_comm_program(..., progress=True)``); zeroed before each
step, it counts the comm jobs finished.  When a step fails (a peer's process ended, a gloo
timeout) or stalls, :meth:`CommProgress.where` names the job it was in.  Our multi-rank runner
(``tools/train.py``) and the engine path (:mod:`pipesplit.passes.engine.hooks`) both say it so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from pipesplit.passes.transport.p2p import PROGRESS_VAR


@dataclass
class CommProgress:
    """A rank's comm jobs of one step, in order, and how to read how far it got."""

    # (job type, micro-batch, peer process); a bystander job's peer is its exchange's sender
    sequence: List[Tuple[str, int, Optional[int]]] = field(default_factory=list)
    # CPU world-ring transport: bystander job type -> (sender, receiver) of its exchange
    bystanders: Dict[str, Tuple[int, int]] = field(default_factory=dict)

    def describe(self, index: int) -> str:
        """Name the ``index``-th comm job of a step."""
        if not 0 <= index < len(self.sequence):
            return f"no comm job #{index} (the step has {len(self.sequence)})"
        job, mb, peer = self.sequence[index]
        where = f"(comm job {index + 1} of {len(self.sequence)} in the step)"
        if job in self.bystanders:
            src, dst = self.bystanders[job]
            return f"{job} micro-batch {mb}: the world-ring broadcast from rank {src} to rank " \
                   f"{dst} {where}"
        return f"{job} micro-batch {mb} with rank {peer} {where}"

    def start_step(self, scope, place) -> None:
        """Create or zero the counter (before each step)."""
        import numpy as np

        if self.sequence:
            scope.var(PROGRESS_VAR).get_tensor().set(np.zeros([1], np.float32), place)

    def where(self, scope) -> str:
        """Where the rank was, read from the counter in ``scope``: ``waiting in <comm job>``, or
        that it was not in a communication job (a step without comm jobs, one that failed
        before the counter was set, or compute after the last comm job)."""
        import numpy as np

        var = scope.find_var(PROGRESS_VAR)
        if var is None or not self.sequence or not var.get_tensor()._is_initialized():
            return "not in a communication job"
        done = int(round(float(np.array(var.get_tensor()).reshape(-1)[0])))
        if done >= len(self.sequence):
            return "not in a communication job (after its last one: compute or optimizer)"
        return f"waiting in {self.describe(done)}"


#: what Paddle's error says when a gloo peer's connection closes: the C++ type and nothing else
_BARE_CPP_ERRORS = ("", "std::exception")


#: how much of Paddle's message a report quotes (its call stacks run to many kilobytes)
_QUOTED = 2000
#: a line that states an error: Paddle's ``XxxError: (Kind) ...`` / ``(Kind) ...`` and
#: Python's ``XxxError: ...``
_ERROR_LINE = re.compile(r"^\s*(\w+(Error|Exception)\s*:\s*\S.*|\((\w+)\) \S.*)$")


def root_cause(text: str) -> Optional[str]:
    """The last line of ``text`` that states an error: Paddle puts its cause at the end, after
    the user's code and the C++ stack (``UnimplementedError: Unimplemented cpu kernel ...``)."""
    lines = [line.strip() for line in text.splitlines() if _ERROR_LINE.match(line)]
    return lines[-1] if lines else None


def failure_reason(exc: BaseException) -> str:
    """The error's text (its first :data:`_QUOTED` characters), led by its root cause line
    where the quoted part would cut it off; or what it means where Paddle passes on only a
    bare C++ type name."""
    raw = str(exc)
    text = " ".join(raw.split())
    if text in _BARE_CPP_ERRORS:
        return ("the connection to its peer broke or timed out without an error message (the "
                "peer's process ended or stopped responding; see that rank's log)")
    cause = root_cause(raw)
    if len(text) <= _QUOTED or cause is None or " ".join(cause.split()) in text[:_QUOTED]:
        return text[:_QUOTED]
    return f"{cause} (the root cause; Paddle's message begins: {text[:_QUOTED]} ...)"

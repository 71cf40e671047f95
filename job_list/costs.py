"""Job costs and the memory model: the one place the time of a job kind on a stage, the p2p
latency and the live-memory change at the end of a job are defined.

Memory model (units of one stage's activations for one micro-batch): +1 at the end of F(s, mb);
-1 at the end of its B, or -(1-h) at the end of I and -h at the end of W, with h =
``Costs.w_memory`` (1/2 by default, as in the zero-bubble paper).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

from .ir import BACKWARD, BACKWARD_B, BACKWARD_W, FORWARD


Number = Union[int, float]
PerStage = Union[Number, Sequence[Number]]
COST_FIELDS = ("forward", "backward", "backward_b", "backward_w")
EXTRA_FIELDS = ("comm", "w_memory")
#: how the simulator times a cross-rank transfer (see :class:`Costs`)
COMM_MODES = ("latency", "rendezvous")
LATENCY, RENDEZVOUS = COMM_MODES


@dataclass(frozen=True)
class Costs:
    """Time per job kind, a scalar or one value per global virtual stage, and the p2p latency.

    ``backward`` defaults to ``backward_b + backward_w``.  ``w_memory`` is the memory model's one
    calibrated number: the units of a stage's activations still alive between the end of its I
    and the end of its W (the zero-bubble paper's 1/2; ``pipesplit profile`` measures it, and in
    Paddle's executor it is larger, since W reads every matmul input plus the output gradients
    that I produced).

    ``comm_mode`` says what ``comm`` stands for.  ``"latency"`` (default): a delay added to a
    dependency across ranks; send / recv take no time and block nobody (NCCL-like asynchronous
    p2p).  ``"rendezvous"``: blocking transfers (gloo on CPU): the schedule is simulated lowered
    (:func:`lower.lower_comm`), a send and its recv start together once both ranks reach them
    and the data exists, and keep both ranks busy for ``comm``.
    """

    forward: PerStage = 1.0
    backward: Optional[PerStage] = None
    backward_b: PerStage = 1.0
    backward_w: PerStage = 1.0
    comm: Number = 0.0
    w_memory: Number = 0.5
    comm_mode: str = LATENCY

    def __post_init__(self):
        for name in COST_FIELDS:
            value = getattr(self, name)
            if name == "backward" and value is None:
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            if isinstance(value, (list, tuple)) and not value:
                raise ValueError(f"costs.{name} must be a number or one number per stage, "
                                 "got an empty list")
            if not all(_is_cost(item) for item in values):
                raise ValueError(f"costs.{name} must be finite numbers >= 0, got {value!r}")
        for name in EXTRA_FIELDS:
            value = getattr(self, name)
            if not _is_cost(value):
                raise ValueError(f"costs.{name} must be a finite number >= 0, got {value!r}")
        if self.comm_mode not in COMM_MODES:
            raise ValueError(f"costs.comm_mode must be one of {COMM_MODES}, got "
                             f"{self.comm_mode!r}")

    @property
    def rendezvous(self) -> bool:
        """True when transfers block both ranks (``comm_mode="rendezvous"``)."""
        return self.comm_mode == RENDEZVOUS

    def as_latency(self) -> "Costs":
        """The same costs under the latency comm model (the fast one the search uses)."""
        return self if self.comm_mode == LATENCY else replace(self, comm_mode=LATENCY)

    def memory_delta(self, kind: str) -> float:
        """Change of live activation units at the end of a ``kind`` job (see class doc)."""
        return {FORWARD: 1.0, BACKWARD: -1.0, BACKWARD_B: self.w_memory - 1.0,
                BACKWARD_W: -self.w_memory}.get(kind, 0.0)

    def of(self, kind: str, stage: int) -> float:
        """Cost of a ``kind`` job on global ``stage`` (0 for send / recv / optimizer)."""
        if kind == BACKWARD and self.backward is None:
            return self.of(BACKWARD_B, stage) + self.of(BACKWARD_W, stage)
        if kind not in COST_FIELDS:
            return 0.0
        value = getattr(self, kind)
        if isinstance(value, (list, tuple)):
            if not 0 <= stage < len(value):
                raise ValueError(f"costs.{kind} has {len(value)} entries, stage {stage} needs more")
            return float(value[stage])
        return float(value)

    def check_stages(self, num_stages: int) -> None:
        for name in COST_FIELDS:
            value = getattr(self, name)
            if isinstance(value, (list, tuple)) and len(value) != num_stages:
                raise ValueError(f"costs.{name} has {len(value)} entries; the schedule has "
                                 f"{num_stages} virtual stages (pp*vpp)")

    @classmethod
    def from_string(cls, text: str, comm: Number = 0.0) -> "Costs":
        """``"tF,tB,tI,tW"`` (or ``"tF,tB"``, then tI = tW = tB/2)."""
        try:
            parts = [float(p) for p in text.split(",")]
        except ValueError:
            raise ValueError(f"cost must be numbers 'tF,tB,tI,tW', got {text!r}") from None
        if len(parts) == 2:
            parts += [parts[1] / 2, parts[1] / 2]
        if len(parts) != 4:
            raise ValueError(f"cost must be 'tF,tB,tI,tW' (4 numbers) or 'tF,tB', got {text!r}")
        return cls(*parts, comm=comm)

    def to_dict(self) -> dict:
        """The fields by name; ``comm_mode`` only when not the default, so files and outputs
        written before it existed stay identical."""
        out = {name: (list(v) if isinstance(v, (list, tuple)) else v)
               for name, v in ((n, getattr(self, n)) for n in COST_FIELDS + EXTRA_FIELDS)}
        if self.comm_mode != LATENCY:
            out["comm_mode"] = self.comm_mode
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Costs":
        if not isinstance(data, dict):
            raise TypeError(f"costs must be a dict of {COST_FIELDS + EXTRA_FIELDS}, got "
                            f"{type(data).__name__}")
        known = COST_FIELDS + EXTRA_FIELDS + ("comm_mode",)
        unknown = set(data) - set(known)
        if unknown:
            raise ValueError(f"unknown cost fields {sorted(unknown)}; expected {known}")
        missing = [n for n in ("forward", "backward_b", "backward_w") if n not in data]
        if missing:
            raise ValueError(f"costs lack {missing}; every compute kind needs a time")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})

    @classmethod
    def load(cls, path: str) -> "Costs":
        """Costs of a JSON file: a :meth:`to_dict` object, or an object holding one under
        ``"costs"`` (a ``pipesplit profile`` file)."""
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError(f"cost file {path}: the top level must be a JSON object (cost "
                             f"fields, or a profile with a 'costs' object), got "
                             f"{_json_kind(data)}")
        if "costs" in data:
            data = data["costs"]
            if not isinstance(data, dict):
                raise ValueError(f"cost file {path}: 'costs' must be a JSON object of cost "
                                 f"fields, got {_json_kind(data)}")
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cost file {path}: {exc}") from None


def _is_cost(value) -> bool:
    """A finite real number >= 0 (NaN would make every comparison false, inf every makespan)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0


def _json_kind(value) -> str:
    return {list: "a list", type(None): "null", str: "a string", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}")

"""Which virtual stage each (rank, chunk) holds, and which layers each stage holds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

LOOPED = "looped"
V_SHAPE = "v"
PLACEMENTS = (LOOPED, V_SHAPE)


class SizeError(ValueError):
    """A size (``pp``, ``vpp``, ``m`` ...) a schedule or layout cannot take.  ``field`` names
    it, so a caller says it in its own words (:meth:`said_as`: ``strategy.pipeline.vpp_degree
    must be even ...``) without rewriting the message."""

    def __init__(self, field: str, constraint: str, got):
        self.field, self.constraint, self.got = field, constraint, got
        super().__init__(self.said_as(field))

    def said_as(self, field: str) -> str:
        return f"{field} {self.constraint}, got {self.got}"


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """Shared argument check: ``TypeError`` for non-ints, :class:`SizeError` below ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise SizeError(name, f"must be >= {minimum}", value)
    return value


@dataclass(frozen=True)
class Placement:
    """Stage layout over ``pp`` ranks with ``vpp`` chunks each.

    looped: chunk ``c`` on rank ``r`` is stage ``c*pp + r``.
    v (zig-zag): even ``c`` -> ``c*pp + r``; odd ``c`` -> ``c*pp + pp-1-r``.
    """

    kind: str
    pp: int
    vpp: int

    def __post_init__(self):
        if self.kind not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.kind!r}")
        check_positive_int("pp", self.pp)
        check_positive_int("vpp", self.vpp)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    def stage(self, rank: int, chunk: int) -> int:
        if not 0 <= rank < self.pp:
            raise ValueError(f"rank must be in [0, {self.pp}), got {rank}")
        if not 0 <= chunk < self.vpp:
            raise ValueError(f"chunk must be in [0, {self.vpp}), got {chunk}")
        if self.kind == V_SHAPE and chunk % 2 == 1:
            return chunk * self.pp + self.pp - 1 - rank
        return chunk * self.pp + rank

    def rank_chunk(self, stage: int) -> Tuple[int, int]:
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage must be in [0, {self.num_stages}), got {stage}")
        chunk, offset = divmod(stage, self.pp)
        if self.kind == V_SHAPE and chunk % 2 == 1:
            return self.pp - 1 - offset, chunk
        return offset, chunk

    def rank_of(self, stage: int) -> int:
        return self.rank_chunk(stage)[0]

    def stage_of_block(self, block: int, num_blocks: int) -> int:
        """The virtual stage 0-based ``block`` of ``num_blocks`` (model order) goes to: an even
        split in model order, whatever the placement puts the stage on."""
        return block * self.num_stages // num_blocks

    def deal_blocks(self, per_rank: Sequence[int]) -> List[int]:
        """Blocks per global virtual stage when rank ``r`` keeps ``per_rank[r]`` blocks, dealt
        one by one to its chunks (its ``i``-th block to chunk ``i % vpp``), the blocks of the
        model then filling the stages in order: Paddle's rule for the layers a user placed on
        each stage mesh (``complete_chunk_id``), on this placement's stages (the V order for
        ``v``).  Every rank needs at least ``vpp`` blocks."""
        if len(per_rank) != self.pp:
            raise ValueError(f"per_rank must give the blocks of each of the {self.pp} ranks, "
                             f"got {list(per_rank)}")
        short = [r for r, n in enumerate(per_rank) if n < self.vpp]
        if short:
            raise ValueError(
                f"rank {short[0]} keeps {per_rank[short[0]]} block(s), fewer than vpp = "
                f"{self.vpp}: every chunk needs one (blocks per rank: {list(per_rank)})")
        counts = [0] * self.num_stages
        for rank, blocks in enumerate(per_rank):
            for i in range(blocks):
                counts[self.stage(rank, i % self.vpp)] += 1
        return counts

    def stages_of_blocks(self, per_rank: Sequence[int]) -> List[int]:
        """The virtual stage of each block, in model order (:meth:`deal_blocks`)."""
        return [stage for stage, n in enumerate(self.deal_blocks(per_rank)) for _ in range(n)]

    def layers_per_stage(self, num_layers: int) -> int:
        check_positive_int("num_layers", num_layers)
        if num_layers % self.num_stages:
            raise ValueError(
                f"num_layers ({num_layers}) must be divisible by pp*vpp ({self.pp}*{self.vpp}="
                f"{self.num_stages}) so every virtual stage holds the same number of layers")
        return num_layers // self.num_stages

    def layer_owner(self, layer: int, num_layers: int) -> Tuple[int, int]:
        """(rank, chunk) of 0-based ``layer`` when ``num_layers`` are split evenly over stages."""
        self.layers_per_stage(num_layers)  # (checks the even split)
        if not 0 <= layer < num_layers:
            raise ValueError(f"layer must be in [0, {num_layers}), got {layer}")
        return self.rank_chunk(self.stage_of_block(layer, num_layers))

    def layers_of_rank(self, num_layers: int) -> Dict[int, List[int]]:
        """0-based layer indices each rank holds, in model order."""
        self.layers_per_stage(num_layers)  # (checks the even split)
        held: Dict[int, List[int]] = {r: [] for r in range(self.pp)}
        for layer in range(num_layers):
            held[self.rank_of(self.stage_of_block(layer, num_layers))].append(layer)
        return held

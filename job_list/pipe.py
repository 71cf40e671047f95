"""Which process is which pipeline rank: the one peer rule for hybrid meshes.

With data / tensor parallelism beside the pipeline, a pipeline stage is a sub-mesh of the
global mesh (its ``pp`` coordinate fixed), and each process runs one pipeline rank of ONE
pipeline: the processes that share its other (dp, mp, ...) coordinates.  Schedules, placements
and lowering speak of pipeline ranks 0 .. pp-1; :class:`Pipe` maps them to processes.  A peer
is never "process +- 1": it is the process of the neighbouring stage at the same coordinate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple


@dataclass(frozen=True)
class Pipe:
    """One pipeline: ``processes[r]`` is the process that runs pipeline rank ``r``."""

    processes: Tuple[int, ...]

    @property
    def pp(self) -> int:
        return len(self.processes)

    def process_of(self, rank: int) -> int:
        if not 0 <= rank < self.pp:
            raise ValueError(f"pipeline rank must be in [0, {self.pp}), got {rank}")
        return self.processes[rank]

    def rank_of(self, process: int) -> int:
        """The pipeline rank of ``process``; ``ValueError`` if it is not in this pipeline."""
        try:
            return self.processes.index(process)
        except ValueError:
            raise ValueError(f"process {process} is not in this pipeline (processes "
                             f"{list(self.processes)} by pipeline rank)") from None

    @classmethod
    def single_process_per_stage(cls, pp: int) -> "Pipe":
        """Stage meshes of one process each: pipeline rank r is process r."""
        return cls(tuple(range(pp)))


def pipe_of(stage_processes: Sequence[Sequence[int]], process: int,
            stage_shapes: Sequence[Sequence[int]] = ()) -> Pipe:
    """The pipeline ``process`` belongs to.

    ``stage_processes[r]``: the process ids of stage r's mesh in its row-major order (as
    ``ProcessMesh.process_ids`` lists them); ``stage_shapes``: their mesh shapes, if known.
    Every stage must have the same shape (size-1 dims may be kept or dropped), so a position in
    one stage's mesh names the same (dp, mp, ...) coordinate in all of them."""
    stages = [tuple(int(p) for p in ids) for ids in stage_processes]
    if not stages:
        raise ValueError("stage meshes: need at least one stage mesh")
    sizes = {len(s) for s in stages}
    if len(sizes) != 1:
        raise ValueError("stage meshes must all hold the same number of processes (the "
                         "pipeline stages of one global mesh along its 'pp' axis), got "
                         + ", ".join(f"stage {r}: {list(s)}" for r, s in enumerate(stages)))
    shapes = {tuple(d for d in shape if d != 1) for shape in stage_shapes}
    if len(shapes) > 1:
        raise ValueError("stage meshes must all have the same shape (size-1 dims aside), got "
                         + ", ".join(f"stage {r}: {list(s)}"
                                     for r, s in enumerate(stage_shapes)))
    seen = {}
    for r, stage in enumerate(stages):
        for p in stage:
            if p in seen and seen[p] != r:
                raise ValueError(f"process {p} is in stage {seen[p]}'s and stage {r}'s mesh: "
                                 "a process must run one pipeline stage")
            seen[p] = r
    for stage in stages:
        if process in stage:
            position = stage.index(process)
            return Pipe(tuple(s[position] for s in stages))
    raise ValueError(f"process {process} is in no stage mesh ("
                     + ", ".join(f"stage {r}: {list(s)}" for r, s in enumerate(stages)) + ")")

"""For worker scripts that try many cases in one launch: each case on every rank, under a fresh
start of its own, the ranks meeting after each; rank 0 writes ``{case: {rank: result}}``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, ContextManager, Dict


def record_cases(cases: Dict[str, object], run_case: Callable[[object], object], out: Path,
                 fresh: Callable[[], ContextManager], exchange: Callable, key: str) -> None:
    """``run_case(cases[case])`` on this rank for every case, each inside ``fresh()``;
    ``exchange(rank, world, payload, key)`` (the examples' store exchange) meets the ranks."""
    import paddle.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for case, spec in cases.items():
        with fresh():
            results[case] = run_case(spec)
        exchange(rank, world, {}, key=f"{key}/{case}")  # every rank done with it
    everyone = exchange(rank, world, results, key=f"{key}/results")
    if rank == 0:
        out.write_text(json.dumps({case: {r: res[case] for r, res in enumerate(everyone)}
                                   for case in cases}, indent=1))
    exchange(rank, world, {}, key=f"{key}/done")

"""``fleet.init`` with dp x pp hybrid groups on four CPU processes, as PaddleFormers' trainer
calls it under ``enable_auto_parallel=True``, after ``cpu_support.enable()``
(``tests/workers/fleet_hybrid_groups.py``).

Without cpu_support it fails in most launches while creating the groups (gloo ``connect ...:
Connection refused`` on one rank, ``TIMEOUT`` on another): every ``ProcessGroupGloo.create``
rendezvous under the bare keys ``"0"``, ``"1"`` ... of the launcher's store, which the global
group wrote first (:func:`pipesplit.passes.engine.cpu_hooks.gloo_group_store`).
"""
from __future__ import annotations

import json

import pytest

from _launch import launch
from _paths import WORKERS

SCRIPT = WORKERS / "fleet_hybrid_groups.py"
ROUNDS = 3
#: order dp, sharding, pp, sep, mp with dp = pp = 2: rank = 2 * dp index + pp index
GROUPS = {"dp": [[0, 2], [1, 3]], "pp": [[0, 1], [2, 3]], "check": [[0, 1], [2, 3]],
          "world": [[0, 1, 2, 3]], "later_1_2": [[1, 2]]}


def _expected(rank: int) -> dict:
    """{group name: [its ranks, the sum of rank + 1 over them each round]} for ``rank``."""
    out = {}
    for name, groups in GROUPS.items():
        for ranks in groups:
            if rank in ranks:
                out[name] = [ranks, [float(sum(r + 1 for r in ranks))] * ROUNDS]
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fleet_groups")
    done = launch(workdir, SCRIPT, workdir / "out", ROUNDS, nproc=4, timeout=600)
    assert done.returncode == 0, done.report()
    return {rank: json.loads((workdir / "out" / f"rank{rank}.json").read_text())
            for rank in range(4)}


@pytest.mark.slow
@pytest.mark.parametrize("rank", range(4))
def test_every_hybrid_group_sums_over_its_ranks(results, rank):
    assert results[rank] == _expected(rank)

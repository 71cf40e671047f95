"""dp and mp beside the pipeline through the engine: the Llama example on a global
``(dp, pp, mp)`` mesh of four CPU processes (dp2 x pp2, mp2 x pp2, pp 4), several
configurations per launch, every micro-batch loss and every rank's parameters compared with the
example's one-process dygraph reference (the two-process runs: ``test_hybrid.py``)."""
from __future__ import annotations

import pytest

from _llama_grid import (DP2, HYBRID_SCHEDULES, MP2, TIED, args,  # noqa: E402
                         check_group, launched)


def _four_process_configs():
    schedules = []
    for mesh_name, mesh in (("dp", DP2), ("mp", MP2)):
        schedules += [(f"{mesh_name}_{name}", args(mesh, name)) for name in HYBRID_SCHEDULES]
        schedules.append((f"{mesh_name}_ZBV_sgd", args(mesh, "ZBV", "--optimizer", "sgd")))
    # optimizer states sharded over dp (dist.shard_optimizer, ZeRO stage 1 / 2)
    schedules += [("dp_ZBV_sharding1", args(DP2, "ZBV", "--sharding", "1")),
                  ("dp_ZBH1_sharding2", args(DP2, "ZBH1", "--sharding", "2"))]
    return {
        "schedules": schedules,
        "library": [(f"{mesh_name}_library_{name}", args(mesh, name, "--style", "library"))
                    for mesh_name, mesh in (("dp", DP2), ("mp", MP2)) for name in ("ZBV", "VPP")],
        "tied": [("dp_tied_ZBV", args(DP2, "ZBV", *TIED)),
                 ("mp_tied_1F1B", args(MP2, "1F1B", *TIED)),
                 ("dp_tied_VPP_vpp2", args(DP2, "VPP", *TIED))],
        # four stages (the world ring): the head three stages from the embedding
        "pp4": [("pp4_tied_1F1B", args(["--pp", "4"], "1F1B", *TIED)),
                ("pp4_tied_ZBH1", args(["--pp", "4"], "ZBH1", *TIED))],
        "parallelize": [("dp_parallelize_tied_ZBV", args(DP2, "ZBV", "--parallelize", "prefix",
                                                          *TIED)),
                        ("dp_parallelize_VPP", args(DP2, "VPP", "--parallelize", "points")),
                        ("mp_parallelize_tied_1F1B", args(MP2, "1F1B", "--parallelize",
                                                           "points", *TIED)),
                        ("mp_parallelize_VPP", args(MP2, "VPP", "--parallelize", "prefix"))],
    }


@pytest.fixture(scope="module")
def four_processes(tmp_path_factory):
    return launched(tmp_path_factory, "llama_4", _four_process_configs(), nproc=4)


@pytest.mark.slow
def test_dp_and_mp_beside_the_pipeline_train_llama_like_the_reference(four_processes):
    """dp2 x pp2 and mp2 x pp2 on four CPU processes, in one launch: peers by mesh
    coordinate (not rank +- 1), the engine's dp gradient all-reduce after the last W (and the
    sharded optimizer's all-gathers), mp collectives inside F / B, all on the CPU world-ring
    transport; no fleet groups (started as docs/engine_usage.md's command is)."""
    groups = _four_process_configs()
    for name in ("schedules", "library", "tied"):
        check_group(four_processes, groups[name], params=78)  # every rank's: replicas, shards


@pytest.mark.slow
def test_dist_parallelize_with_dp_or_mp_beside_the_pipeline(four_processes):
    """``parallelize``'s ``dp_config`` / ``mp_config`` beside its ``pp_config``: ZBV, VPP (vpp
    2: the blocks of ``parallelize``'s stages moved as for hand-placed models) and 1F1B on
    each mesh, the embedding tied for some."""
    check_group(four_processes, _four_process_configs()["parallelize"], params=78)


@pytest.mark.slow
def test_a_tied_weight_crosses_three_stages_once_per_step(four_processes):
    """pp 4 (the CPU world ring, every process in every exchange): the embedding of stage 0
    read on stage 3."""
    check_group(four_processes, _four_process_configs()["pp4"], params=39)

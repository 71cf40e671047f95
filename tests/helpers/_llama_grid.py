"""The Llama example's configurations on a global ``(dp, pp, mp)`` mesh, launched several per
launch (``tests/workers/llama_grid.py``), and the checks of their records against the
example's one-process dygraph reference: shared by the hybrid test modules."""
from __future__ import annotations

import json

from _paths import WORKERS

GRID = WORKERS / "llama_grid.py"
ADAMW_TOL, SGD_TOL = 1e-5, 1e-6

VPP_OF = {"VPP": 2, "InterleavedZB": 2, "ZBV": 2, "ZBVPP": 2, "DualPipeV": 2}
EVERY_SCHEDULE = ["FThenB", "1F1B", "Eager1F1B", "VPP", "ZBH1", "ZBH2", "InterleavedZB", "ZBV",
                  "ZBVPP", "DualPipeV", "auto"]
HYBRID_SCHEDULES = ["1F1B", "ZBH1", "VPP", "ZBV", "DualPipeV", "auto"]
V_SCHEDULES = ["ZBV", "ZBVPP", "DualPipeV"]  # (the first and the last stage on one rank)

PP2 = ["--pp", "2"]
DP2, MP2 = ["--dp", "2", "--pp", "2"], ["--mp", "2", "--pp", "2"]
#: tied: the head reads the first stage's embedding weight through a reshard onto the last
#: stage's mesh; it crosses once per step to the head's rank, or stays on the rank (V)
TIED = ["--tie-embedding"]
#: the example's embedding weight (--vocab 64 --hidden 32), whole on every rank
EMBEDDING = [64, 32]


def args(mesh, schedule, *extra):
    """The example's arguments: ``mesh``'s degrees, ``schedule`` at its vpp, m 4, 2 steps."""
    return [*mesh, "--schedule", schedule, "--vpp", str(VPP_OF.get(schedule, 1)), "-m", "4",
            "--steps", "2", *extra]


def vpp_for_tied(name):
    return ["--vpp", "2" if name in V_SCHEDULES else "1"]


def launched(tmp_path_factory, name, groups, nproc):
    """{tag: record} of every configuration of ``groups`` ({test: [(tag, args)]}), one launch;
    each chunk completion checked against Paddle's own (``--compare-chunks``), the number of
    ops compared on each rank in ``record["chunks_compared"]``."""
    from _launch import launch

    configs = [config for group in groups.values() for config in group]
    work = tmp_path_factory.mktemp(name)
    (work / "configs.json").write_text(json.dumps(configs))
    done = launch(work, GRID, work / "configs.json", work, "--compare-chunks", nproc=nproc)
    assert done.returncode == 0, done.report()
    records = {tag: json.loads((work / f"{tag}.json").read_text()) for tag, _ in configs}
    for tag, record in records.items():
        record["chunks_compared"] = [int(f.read_text())
                                     for f in sorted(work.glob(f"{tag}.r*.chunks"))]
    return records


def check(record, tag, params):
    tol = SGD_TOL if record["optimizer"] == "sgd" else ADAMW_TOL
    assert record["params_compared"] == params, tag
    # the loss comes back where trainers read it, whatever the placement: the last stage
    assert record["loss_ranks"] == record["last_stage_ranks"], (tag, record["loss_ranks"])
    assert len(record["losses"]) == 2 and len(record["losses"][0]) == 4, tag
    assert record["max_loss_diff"] <= tol, (tag, record["max_loss_diff"])
    assert record["max_param_diff"] <= tol, (tag, record["max_param_diff"])
    if "tied" in tag and not record["paddle"]:
        check_once_per_step(record, tag)
    # vpp >= 2: every rank's chunk ids are those Paddle's own completion gives the program
    ranks = record["dp"] * record["pp"] * record["mp"]
    compared = record.get("chunks_compared")
    if compared is not None and record["vpp"] >= 2 and not record["paddle"]:
        assert len(compared) == ranks and min(compared) > 0, (tag, compared)


def check_once_per_step(record, tag):
    """The tied weight crosses to the head's rank once per step (``shared_weights``, its
    gradient in ``shared_grads`` before the optimizer), never with a micro-batch; under a V
    placement the head is on the embedding's rank and nothing crosses."""
    same_rank = record["schedule"] in V_SCHEDULES
    for rank, (jobs, shapes) in enumerate(zip(record["step_jobs"],
                                              record["micro_batch_transfers"])):
        assert jobs == ([] if same_rank else ["shared_weights", "shared_grads"]), (tag, rank)
        assert EMBEDDING not in shapes, (tag, rank, shapes)


def check_group(records, configs, params):
    """``params``: the parameters compared over every rank, 39 per copy of the model (dp
    replicas and mp shards each count); a tied head has no weight of its own."""
    for tag, _ in configs:
        check(records[tag], tag, params=params - (params // 39 if "tied" in tag else 0))

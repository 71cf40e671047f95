"""Paddle's own auto-parallel Llama test (``tests/vendor/paddle_llama/semi_auto_llama_vpp.py``,
unchanged) at ``dp1 x mp2 x pp4`` on eight CPU processes, several schedules in one launch
(``tests/workers/paddle_llama_test.py``), against the same model trained in one process.

Eight processes on two cores take about 50 s a schedule (build 35-45 s): the suite runs VPP
(looped, two chunks a rank), ZBV (V) and the searched one, which re-plans from a measured step
(one chunk a rank, the labels relayed at pp 4 with 1F1B / ZBH1: ``test_user_conventions.py``'s
four-process launch); ``PIPESPLIT_LLAMA_TEST_SCHEDULES=all`` runs every schedule (about 10 minutes: done by
hand before a change to the relay lands; 11 of 11 equal to the reference on 9f9e9fd).

The test feeds its labels on stage 1's mesh (``shard_dataloader(meshes=[get_mesh(0),
get_mesh(1)])``) and computes the loss on the last stage: at pp 4 the engine's program hands
them from stage 1 to stage 3, past stage 2, and a V placement brings the loss to rank 0.  Each
schedule must relay them through the stages between (:mod:`pipesplit.passes.engine.relay`),
train equal to the reference, and return the loss where Paddle's own engine does: on the last
stage's ranks (6 and 7 here; Paddle's own 1F1B fetches it there too, whatever mesh the labels
are fed on).  The test's own ``rank in [2, 3, 6, 7]`` assertion is written for its
``dp2 x mp2 x pp2`` layout, whose last stage those ranks are."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _llama_grid import EVERY_SCHEDULE, VPP_OF  # noqa: E402
from _paths import WORKERS  # noqa: E402

SCRIPT = WORKERS / "paddle_llama_test.py"
DP, MP, PP = 1, 2, 4
TOL = 1e-5
SCHEDULES = (EVERY_SCHEDULE if os.environ.get("PIPESPLIT_LLAMA_TEST_SCHEDULES") == "all"
             else ["VPP", "ZBV", "auto"])
#: schedules whose NCCL plans are also built (from the same engine programs) and read: looped
#: and V
NCCL_PLANS = ("VPP", "ZBV")


def _stage_of(process):
    """The pp index of ``process`` in the global mesh arange(8).reshape(dp, pp, mp)."""
    return process // MP % PP


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from _launch import launch

    work = tmp_path_factory.mktemp("paddle_llama_test")
    reference = work / "reference.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "reference", str(reference)],
                          cwd=work, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    configs = [{"tag": name, "schedule": name, "vpp": VPP_OF.get(name, 1),
                "gpu_plan": name in NCCL_PLANS} for name in SCHEDULES]
    (work / "configs.json").write_text(json.dumps(configs))
    launched = launch(work, SCRIPT, "train", "--dp", DP, "--mp", MP, "--pp", PP,
                      work / "configs.json", work / "out", nproc=DP * MP * PP, timeout=1800)
    assert launched.returncode == 0, launched.report()
    records = {(c["tag"], r): json.loads((work / "out" / f"{c['tag']}.rank{r}.json").read_text())
               for c in configs for r in range(DP * MP * PP)}
    return json.loads(reference.read_text())["losses"], records


@pytest.mark.slow
@pytest.mark.parametrize("name", SCHEDULES)
def test_paddles_llama_test_at_dp1_mp2_pp4_trains_as_one_process(runs, name):
    reference, records = runs
    holders = sorted(r for r in range(DP * MP * PP) if records[(name, r)]["losses"][0] is not None)
    assert holders == [r for r in range(DP * MP * PP) if _stage_of(r) == PP - 1], holders
    for r in holders:
        losses = records[(name, r)]["losses"]
        assert len(losses) == len(reference)
        diff = max(abs(a - b) for got, want in zip(losses, reference) for a, b in zip(got, want))
        assert diff <= TOL, (name, r, losses, reference)


def _carriers(name):
    """(pipeline rank, chunk) of every stage that sends the labels on: from the last stage of
    rank 1 (where they are fed) before the loss's, up to the one before the loss's."""
    from pipesplit.job_list.placement import Placement
    from pipesplit.job_list.registry import get_spec

    placement = Placement(get_spec(name).placement, PP, VPP_OF.get(name, 1))
    last = placement.num_stages - 1
    entry = max(s for s in range(last) if placement.rank_of(s) == 1)
    return {placement.rank_chunk(s) for s in range(entry, last)}


@pytest.mark.slow
@pytest.mark.parametrize("name", NCCL_PLANS)
def test_the_nccl_plans_send_the_labels_to_the_next_stage_only(runs, name):
    """In the NCCL plan of the same engine program, each carrier's send job has one send_v2
    of the labels' shape, on a ring of two processes (its own and the next stage's at the same
    mp coordinate), and the next stage's recv job the matching recv_v2."""
    _, records = runs
    for process in range(DP * MP * PP):
        rank, nccl = _stage_of(process), records[(name, process)]["gpu_plan"]
        for job, ops in nccl.items():
            labels = [op for op in ops if op["shape"] == [2, 8]]
            chunk = int(job[len(job.rstrip("0123456789")):])
            sending = job.startswith("send_forward") and (rank, chunk) in _carriers(name)
            if not sending:
                assert not (job.startswith("send") and labels), (name, process, job, ops)
                continue
            assert len(labels) == 1 and labels[0]["op"] == "pd_op.send_v2", (name, process, ops)
            ring = labels[0]["ring_ranks"]
            assert process in ring and len(ring) == 2, (name, process, labels)
            peer = next(p for p in ring if p != process)
            assert peer % MP == process % MP and _stage_of(peer) != rank, (name, process, peer)
            received = [op for j, op_list in records[(name, peer)]["gpu_plan"].items()
                        if j.startswith("recv_forward") for op in op_list
                        if op["shape"] == [2, 8]]
            assert len(received) == 1 and received[0]["op"] == "pd_op.recv_v2", (name, peer)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCHEDULES)
def test_the_labels_ride_through_every_stage_between(runs, name):
    """The labels (int64 [micro, seq]) leave stage 1's mesh and are sent on by every stage
    after it up to the loss's: one forward job per stage in between hands them on, beside the
    activation; no rank sends them twice."""
    _, records = runs
    carriers = _carriers(name)
    for process in range(DP * MP * PP):
        rank = _stage_of(process)
        for job, sent in records[(name, process)]["sent_on"].items():
            chunk = int(job[len("forward"):])
            labels = [s for s in sent if s[1] == "int64"]
            expected = 1 if (rank, chunk) in carriers else 0
            assert len(labels) == expected, (name, process, job, sent)
            if labels:
                assert labels[0][2] == [2, 8]

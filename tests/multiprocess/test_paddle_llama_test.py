"""Paddle's own auto-parallel Llama test (``tests/vendor/paddle_llama/semi_auto_llama_vpp.py``,
unchanged) at ``dp1 x mp2 x pp4`` on eight CPU processes, with every pipesplit schedule in one
launch (``tests/workers/paddle_llama_test.py``), against the same model trained in one process.

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
import subprocess
import sys

import pytest

from _llama_grid import EVERY_SCHEDULE, VPP_OF  # noqa: E402
from _paths import WORKERS  # noqa: E402

SCRIPT = WORKERS / "paddle_llama_test.py"
DP, MP, PP = 1, 2, 4
TOL = 1e-5


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
    configs = [{"tag": name, "schedule": name, "vpp": VPP_OF.get(name, 1)}
               for name in EVERY_SCHEDULE]
    (work / "configs.json").write_text(json.dumps(configs))
    launched = launch(work, SCRIPT, "train", "--dp", DP, "--mp", MP, "--pp", PP,
                      work / "configs.json", work / "out", nproc=DP * MP * PP, timeout=1800)
    assert launched.returncode == 0, launched.report()
    records = {(c["tag"], r): json.loads((work / "out" / f"{c['tag']}.rank{r}.json").read_text())
               for c in configs for r in range(DP * MP * PP)}
    return json.loads(reference.read_text())["losses"], records


@pytest.mark.slow
@pytest.mark.parametrize("name", EVERY_SCHEDULE)
def test_paddles_llama_test_at_dp1_mp2_pp4_trains_as_one_process(runs, name):
    reference, records = runs
    holders = sorted(r for r in range(DP * MP * PP) if records[(name, r)]["losses"][0] is not None)
    assert holders == [r for r in range(DP * MP * PP) if _stage_of(r) == PP - 1], holders
    for r in holders:
        losses = records[(name, r)]["losses"]
        assert len(losses) == len(reference)
        diff = max(abs(a - b) for got, want in zip(losses, reference) for a, b in zip(got, want))
        assert diff <= TOL, (name, r, losses, reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", EVERY_SCHEDULE)
def test_the_labels_ride_through_every_stage_between(runs, name):
    """The labels (int64 [micro, seq]) leave stage 1's mesh and are sent on by every stage
    after it up to the loss's: one forward job per stage in between hands them on, beside the
    activation; no rank sends them twice."""
    from pipesplit.job_list.placement import Placement
    from pipesplit.job_list.registry import get_spec

    _, records = runs
    vpp = VPP_OF.get(name, 1)
    placement = Placement(get_spec(name).placement, PP, vpp)
    last = placement.num_stages - 1
    entry = max(s for s in range(last) if placement.rank_of(s) == 1)
    carriers = {(placement.rank_of(s), placement.rank_chunk(s)[1]) for s in range(entry, last)}
    for process in range(DP * MP * PP):
        rank = _stage_of(process)
        for job, sent in records[(name, process)]["sent_on"].items():
            chunk = int(job[len("forward"):])
            labels = [s for s in sent if s[1] == "int64"]
            expected = 1 if (rank, chunk) in carriers else 0
            assert len(labels) == expected, (name, process, job, sent)
            if labels:
                assert labels[0][2] == [2, 8]

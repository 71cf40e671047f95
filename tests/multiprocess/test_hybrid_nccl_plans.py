"""The NCCL plans of dp2 x mp2 x pp2 (eight processes, one launch of
``tests/workers/llama_gpu_structure.py``), built on a CPU build and read, not run: peers by
mesh coordinate, rings and events per group, a tied weight sent once per step."""
from __future__ import annotations

import json

import pytest

from _llama_grid import EMBEDDING, VPP_OF  # noqa: E402
from _paths import WORKERS  # noqa: E402


STRUCTURE = WORKERS / "llama_gpu_structure.py"
#: (InterleavedZB and ZBVPP place and send as VPP and ZBV do: left out for the suite's time)
STRUCTURE_SCHEDULES = ["1F1B", "VPP", "ZBH1", "ZBV", "DualPipeV"]
DP, PP, MP = 2, 2, 2


def _coords(process):
    """(dp, pp, mp) of a process of the global mesh arange(8).reshape(2, 2, 2)."""
    return process // (PP * MP), process // MP % PP, process % MP


def _collectives(ops):
    return [op for op in ops if op["op"] in ("pd_op.all_reduce", "pd_op.all_gather")]


@pytest.fixture(scope="module")
def structure(tmp_path_factory):
    """The NCCL plans of dp2 x mp2 x pp2 (8 processes, one launch), built on a CPU build:
    (tag, rank) -> the rank's record."""
    from _launch import launch

    work = tmp_path_factory.mktemp("llama_structure")
    configs = [(name, ["--dp", "2", "--mp", "2", "--pp", "2", "--schedule", name, "--vpp",
                       str(VPP_OF.get(name, 1)), "-m", "4"]) for name in STRUCTURE_SCHEDULES]
    configs.append(("1F1B_tied", ["--dp", "2", "--mp", "2", "--pp", "2", "--schedule", "1F1B",
                                  "-m", "4", "--tie-embedding"]))
    (work / "configs.json").write_text(json.dumps(configs))
    done = launch(work, STRUCTURE, work / "configs.json", work, nproc=DP * PP * MP)
    assert done.returncode == 0, done.report()
    return {(tag, r): json.loads((work / f"{tag}.rank{r}.json").read_text())
            for tag, _ in configs for r in range(DP * PP * MP)}


@pytest.mark.slow
@pytest.mark.parametrize("name", STRUCTURE_SCHEDULES)
def test_cuda_plans_of_dp2_mp2_pp2_have_peers_rings_and_events_per_group(structure, name):
    """Peers by mesh coordinate, p2p on a two-process ring of the pair, mp / dp collectives on
    their group's ring in the same order on every member, the dp gradient all-reduce only in
    the optimizer, and an event edge on every transfer."""
    from pipesplit.job_list.placement import Placement
    from pipesplit.job_list.registry import get_spec

    vpp = VPP_OF.get(name, 1)
    placement = Placement(get_spec(name).placement, PP, vpp)
    records = {r: structure[(name, r)] for r in range(DP * PP * MP)}
    for r, record in records.items():
        d, s, m = _coords(r)
        assert record["pp_rank"] == s
        assert record["pipe"] == [d * PP * MP + k * MP + m for k in range(PP)]
        programs = record["programs"]
        recorded = {op["event_to_record"] for ops in programs.values() for op in ops
                    if "event_to_record" in op}
        waited = {e for ops in programs.values() for op in ops for e in op.get("events_to_wait", [])}
        comm = {t for t, _ in record["job_order"] if t.startswith(("send", "recv"))}
        assert comm, (name, r)
        for job_type in comm:
            kind = job_type.rstrip("0123456789")
            stage = placement.stage(s, int(job_type[len(kind):]))
            neighbour = stage + 1 if kind in ("send_forward", "recv_backward") else stage - 1
            p2p = [op for op in programs[job_type] if op["op"] in ("pd_op.send_v2", "pd_op.recv_v2")]
            assert p2p, (name, r, job_type)
            for op in p2p:
                peer = record["pipe"][placement.rank_of(neighbour)]
                assert op["pipesplit_peer"] == peer and _coords(peer)[::2] == (d, m)
                assert sorted(op["ring_ranks"]) == sorted((r, peer))
                if op["op"] == "pd_op.send_v2":
                    assert set(op["events_to_wait"]) <= recorded
                else:
                    assert op["event_to_record"] in waited
        for job_type, ops in programs.items():
            for op in _collectives(ops):  # within the stage: mp or dp group
                members = op["ring_ranks"]
                assert r in members and {_coords(p)[1] for p in members} == {s}, (job_type, op)
                if job_type.startswith("backward"):  # dp reduces gradients once, in the optimizer
                    assert {_coords(p)[0] for p in members} == {d}, (job_type, op)
        dp_reduces = [op for op in _collectives(programs["optimizer"])
                      if op["op"] == "pd_op.all_reduce"
                      and sorted(op["ring_ranks"]) == [k * PP * MP + s * MP + m for k in range(DP)]]
        assert dp_reduces, (name, r)
    for r, record in records.items():  # the same collectives in the same order in a group
        d, s, m = _coords(r)
        mp_peer, dp_peer = records[r ^ 1], records[r ^ (PP * MP)]
        assert mp_peer["job_order"] == record["job_order"] == dp_peer["job_order"]
        for job_type, ops in record["programs"].items():
            mine = [(op["op"], op["ring_id"], op["shape"]) for op in _collectives(ops)]
            theirs = [(op["op"], op["ring_id"], op["shape"])
                      for op in _collectives(mp_peer["programs"][job_type])]
            mp_only = [c for c in mine if c[1] in {op["ring_id"] for op in _collectives(ops)
                                                  if r ^ 1 in op["ring_ranks"]}]
            assert [c for c in theirs if c[1] in {x[1] for x in mp_only}] == mp_only, job_type
            assert [(o, sh) for o, _, sh in mine] == [
                (op["op"], op["shape"]) for op in _collectives(dp_peer["programs"][job_type])]


@pytest.mark.slow
def test_cuda_plans_send_a_tied_weight_once_per_step_between_the_pair(structure):
    """NCCL: the embedding goes from each pipeline's first stage to its last in the step's
    first job and its gradient back in the job before the optimizer, one send_v2 / recv_v2 on
    the pair's ring each; the micro-batch jobs carry only activations.  The embedding is
    column-parallel over mp: its shard crosses, its gradient comes back whole (the owner's
    optimizer slices its shard from the sum)."""
    shard = [EMBEDDING[0], EMBEDDING[1] // MP]
    for r in range(DP * PP * MP):
        record = structure[("1F1B_tied", r)]
        order = [t for t, _ in record["job_order"]]
        assert order[0] == "shared_weights" and order[-2:] == ["shared_grads", "optimizer"]
        owner, reader = record["pipe"]
        for job_type, src, dst, shape in (("shared_weights", owner, reader, shard),
                                          ("shared_grads", reader, owner, EMBEDDING)):
            p2p = [op for op in record["programs"][job_type]
                   if op["op"] in ("pd_op.send_v2", "pd_op.recv_v2")]
            assert [op["op"] for op in p2p] == ["pd_op.send_v2" if r == src else "pd_op.recv_v2"]
            assert sorted(p2p[0]["ring_ranks"]) == sorted((owner, reader)), (r, job_type)
            assert p2p[0]["shape"] == shape
        for job_type in {t for t in order if t.startswith(("send_", "recv_"))}:
            assert all(op["shape"] not in (shard, EMBEDDING)
                       for op in record["programs"][job_type] if "shape" in op), (r, job_type)

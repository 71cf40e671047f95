"""The GPU flavour of the per-rank programs, checked structurally on CPU (nothing runs).

pp=4, vpp=2: for every rank, each send / recv sub-program holds NCCL ``send_v2`` / ``recv_v2``
ops whose peer is the rank the placement puts the neighbouring stage on, on the p2p ring of
that rank pair, with the event dependencies Paddle's executor uses across sub-programs.
"""
from __future__ import annotations

import functools

import pytest

from pipesplit.job_list import Job
from pipesplit.job_list.lower import peer_of
from pipesplit.passes.transport.nccl import NcclTransport

PP, VPP, M = 4, 2, 4


@functools.lru_cache(maxsize=None)
def _plans(schedule, split_backward=False):
    from pipesplit.ir_utils import build_mlp
    from pipesplit.job_list.request import PipelineConfig
    from pipesplit.passes.split.per_rank import build_rank_plan

    built = build_mlp(num_stages=PP * VPP, hidden=16, batch_size=2 * M)
    out = []
    for r in range(PP):
        config = PipelineConfig.from_attrs(schedule, dict(
            num_micro_batches=M, pp_degree=PP, vpp_degree=VPP, pp_stage=r,
            split_backward=split_backward))
        out.append(build_rank_plan(built.main, built.startup, config, device="gpu"))
    return out


def _attr(op, name, default=None):
    return op.attrs()[name] if op.has_attr(name) else default


@pytest.mark.parametrize("schedule,split_backward", [("VPP", False), ("VPP", True),
                                                     ("ZBVPP", False)])
def test_p2p_ops_have_the_placement_peers(schedule, split_backward):
    plans = _plans(schedule, split_backward)
    placement = plans[0].schedule.placement
    ring_ids = plans[0].rank_info.ring_ids
    assert all(p.rank_info.ring_ids == ring_ids for p in plans)  # same rings on every rank
    checked = 0
    for r, p in enumerate(plans):
        info = p.rank_info
        assert isinstance(info.transport, NcclTransport)
        for c in range(VPP):
            stage = placement.stage(r, c)
            for kind in ("send_forward", "recv_forward", "send_backward", "recv_backward"):
                t = f"{kind}{c}"
                prog = p.split.programs[t]
                ops = [op for op in prog.global_block().ops
                       if op.name() in ("pd_op.send_v2", "pd_op.recv_v2", "pd_op.broadcast_")]
                neighbour = stage + 1 if kind in ("send_forward", "recv_backward") else stage - 1
                if not 0 <= neighbour < placement.num_stages \
                        or placement.rank_of(neighbour) == r:
                    assert not ops, f"rank {r} {t}: no p2p expected"
                    continue
                peer = peer_of(p.schedule, r, Job(kind, c, 0))
                assert peer == placement.rank_of(neighbour)
                assert ops, f"rank {r} {t}: no p2p op"
                want = "pd_op.send_v2" if kind.startswith("send") else "pd_op.recv_v2"
                pair = (min(r, peer), max(r, peer))
                for op in ops:
                    assert op.name() == want
                    assert op.attrs()["ring_id"] == ring_ids[pair]
                    assert op.attrs()["peer"] == pair.index(peer)  # rank inside the p2p ring
                    assert op.attrs()["pipesplit_peer"] == peer
                    assert op.attrs()["use_calc_stream"] is True
                    checked += 1
                    if want == "pd_op.send_v2":
                        assert _attr(op, "events_to_wait"), f"rank {r} {t}: send waits on nothing"
                    else:
                        assert _attr(op, "force_record_event") and _attr(op, "event_to_record")
    assert checked >= PP * 2


def test_events_connect_producer_send_recv_consumer():
    plans = _plans("VPP")
    for r, p in enumerate(plans):
        progs = p.split.programs
        recorded = {}
        for t, prog in progs.items():
            for op in prog.global_block().ops:
                if _attr(op, "event_to_record"):
                    recorded[op.attrs()["event_to_record"]] = t
        for t, prog in progs.items():
            for op in prog.global_block().ops:
                for ev in _attr(op, "events_to_wait", []) or []:
                    assert ev in recorded, f"rank {r} {t}: waits on unknown event {ev}"
                    src = recorded[ev]
                    if op.name() == "pd_op.send_v2":  # producer compute job -> send
                        assert src.startswith(("forward", "backward")), (t, src)
                        assert src[-1] == t[-1]  # same chunk
                    else:  # recv -> consumer compute job
                        assert src.startswith("recv_"), (t, src)


def test_ring_per_adjacent_rank_pair():
    plans = _plans("VPP")
    # looped placement over 4 ranks: pairs (0,1) (1,2) (2,3) and the wrap (0,3) between chunks
    assert set(plans[0].rank_info.ring_ids) == {(0, 1), (1, 2), (2, 3), (0, 3)}
    assert len(set(plans[0].rank_info.ring_ids.values())) == 4
    v = _plans("ZBVPP")
    # V placement: the turn stays on rank 3, so only neighbouring ranks talk
    assert set(v[0].rank_info.ring_ids) == {(0, 1), (1, 2), (2, 3)}


def test_without_overlap_transfers_run_on_the_compute_stream_in_job_order():
    """``enable_send_recv_overlap = False``: the same p2p ops, on the compute stream (no
    execution stream of their own) and with no event edges: job order orders them."""
    from pipesplit.ir_utils import build_mlp
    from pipesplit.job_list.request import PipelineConfig
    from pipesplit.passes.split.per_rank import build_rank_plan
    from pipesplit.passes.transport import NCCL_ON_COMPUTE_STREAM

    built = build_mlp(num_stages=PP * VPP, hidden=16, batch_size=2 * M)
    overlapped = _plans("VPP")
    for r in range(PP):
        config = PipelineConfig.from_attrs("VPP", dict(num_micro_batches=M, pp_degree=PP,
                                                       vpp_degree=VPP, pp_stage=r))
        plan = build_rank_plan(built.main, built.startup, config, device="gpu", overlap=False)
        assert plan.rank_info.transport.way == NCCL_ON_COMPUTE_STREAM
        assert plan.job_order == overlapped[r].job_order
        p2p = 0
        for t, prog in plan.split.programs.items():
            for op in prog.global_block().ops:
                assert not _attr(op, "events_to_wait") and not _attr(op, "event_to_record"), t
                if op.name() in ("pd_op.send_v2", "pd_op.recv_v2"):
                    assert _attr(op, "execution_stream") in (None, "", "DefaultStream"), t
                    p2p += 1
        assert p2p == sum(1 for prog in overlapped[r].split.programs.values()
                          for op in prog.global_block().ops
                          if op.name() in ("pd_op.send_v2", "pd_op.recv_v2"))

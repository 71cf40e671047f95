"""Comm lowering: one send / recv pair per cross-rank dependency, deadlock-free under rendezvous
semantics, and a global order that respects every dependency."""
import pytest

from pipesplit.job_list import build_schedule, global_order, lower_comm, peer_of
from pipesplit.job_list.deps import DependencyGraph, job_key
from pipesplit.job_list.ir import (BACKWARD, FORWARD, RECV_BACKWARD, RECV_FORWARD, SEND_BACKWARD,
                                   SEND_FORWARD, Job, Schedule)
from pipesplit.job_list.placement import V_SHAPE, Placement
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.validate import ScheduleError, validate

SAMPLES = [("1F1B", 4, 1, 8, False), ("VPP", 4, 2, 8, True), ("VPP", 4, 4, 5, False),
           ("Eager1F1B", 3, 2, 7, True), ("FThenB", 2, 3, 1, False), ("LoopedBFS", 5, 2, 6, True)]


def cross_rank_deps(schedule):
    graph = DependencyGraph(schedule)
    return [(rank, job, dep_rank, dep) for rank, jobs in enumerate(schedule.ranks) for job in jobs
            for dep_rank, dep in graph.dependencies(rank, job) if dep_rank != rank]


def v_schedule(pp, m):
    """A hand-made BFS order on the V placement (vpp=2): stages pp-1 and pp share rank pp-1."""
    ranks = []
    for _ in range(pp):
        ranks.append([Job(FORWARD, c, mb) for c in (0, 1) for mb in range(m)]
                     + [Job(BACKWARD, c, mb) for c in (1, 0) for mb in range(m)])
    return Schedule("VBFS", pp, 2, m, Placement(V_SHAPE, pp, 2), ranks)


def comm_jobs(schedule):
    return [(r, j) for r, jobs in enumerate(schedule.ranks) for j in jobs if j.is_comm]


@pytest.mark.parametrize("name, pp, vpp, m, split", SAMPLES)
def test_one_pair_per_cross_rank_dependency(name, pp, vpp, m, split):
    schedule = build_schedule(name, pp, vpp, m, split_backward=split)
    lowered = lower_comm(schedule)
    assert lowered.lowered and lowered.compute_only().ranks == [
        [j for j in jobs if j.is_compute] for jobs in lowered.ranks]
    validate(lowered)
    deps = cross_rank_deps(schedule)
    comms = comm_jobs(lowered)
    sends = [c for c in comms if c[1].kind in (SEND_FORWARD, SEND_BACKWARD)]
    recvs = [c for c in comms if c[1].kind in (RECV_FORWARD, RECV_BACKWARD)]
    assert len(sends) == len(recvs) == len(deps)
    # The recv carries the consumer's chunk, the send the producer's.
    assert sorted((r, j.kind == FORWARD, j.chunk, j.micro_batch) for r, j, _, _ in deps) == sorted(
        (r, j.kind == RECV_FORWARD, j.chunk, j.micro_batch) for r, j in recvs)
    for rank, job in comms:
        assert peer_of(lowered, rank, job) != rank
    # Each rank's compute jobs keep their order.
    assert [[j for j in jobs if j.is_compute] for jobs in lowered.ranks] == schedule.ranks


def test_pp1_inserts_nothing():
    schedule = build_schedule("VPP", 1, 3, 4)
    assert lower_comm(schedule).ranks == schedule.ranks


def test_v_placement_turn_needs_no_comm():
    pp, m = 4, 3
    schedule = v_schedule(pp, m)
    validate(schedule)
    lowered = lower_comm(schedule)
    validate(lowered)
    assert len(comm_jobs(lowered)) == 2 * len(cross_rank_deps(schedule))
    # Stage pp-1 (rank pp-1, chunk 0) hands to stage pp (rank pp-1, chunk 1) locally.
    turn = {(RECV_FORWARD, 1), (SEND_FORWARD, 0), (SEND_BACKWARD, 1), (RECV_BACKWARD, 0)}
    assert not [j for j in lowered.ranks[pp - 1] if (j.kind, j.chunk) in turn]
    # Per micro-batch: 2*pp stages, 2*pp-2 cross-rank hops each way.
    assert len(cross_rank_deps(schedule)) == 2 * m * (2 * pp - 2)


def assert_sequential_execution(schedule, lowered, sequence):
    """``sequence`` interleaves the lowered lists, pairs each send with its recv right after,
    and runs every compute job after its dependencies."""
    per_rank = [[] for _ in range(lowered.pp)]
    for rank, job in sequence:
        per_rank[rank].append(job)
    assert per_rank == lowered.ranks
    graph = DependencyGraph(schedule)
    done = set()
    for i, (rank, job) in enumerate(sequence):
        if job.kind in (SEND_FORWARD, SEND_BACKWARD):
            peer, match = graph.comm_partner(rank, job)
            assert sequence[i + 1] == (peer, match)
        if job.is_compute:
            for dep_rank, dep in graph.dependencies(rank, job):
                assert job_key(schedule, dep_rank, dep) in done, (rank, job, dep)
            done.add(job_key(schedule, rank, job))


@pytest.mark.parametrize("name, pp, vpp, m, split", SAMPLES)
def test_global_order_respects_dependencies(name, pp, vpp, m, split):
    schedule = build_schedule(name, pp, vpp, m, split_backward=split)
    lowered = lower_comm(schedule)
    assert_sequential_execution(schedule, lowered, global_order(schedule))
    # Replaying an already lowered schedule gives a valid sequence too.
    assert_sequential_execution(schedule, lowered, global_order(lowered))


def test_zero_costs_still_topological():
    # Every job starts at 0: only the dependency order can place the pairs.
    costs = Costs(forward=0.0, backward_b=0.0, backward_w=0.0)
    schedule = build_schedule("VPP", 3, 2, 5, split_backward=True)
    lowered = lower_comm(schedule, costs)
    validate(lowered)
    assert_sequential_execution(schedule, lowered, global_order(schedule, costs))


def test_costs_with_comm_latency():
    schedule = build_schedule("1F1B", 4, 1, 8)
    validate(lower_comm(schedule, Costs(comm=0.5)))


def bad_and_good_pp2():
    """pp=2, m=2 lowered by hand; ``bad`` has both ranks send first in the steady state."""
    F, B = FORWARD, BACKWARD
    rank0 = [Job(F, 0, 0), Job(SEND_FORWARD, 0, 0), Job(F, 0, 1), Job(SEND_FORWARD, 0, 1),
             Job(RECV_BACKWARD, 0, 0), Job(B, 0, 0), Job(RECV_BACKWARD, 0, 1), Job(B, 0, 1)]
    good1 = [Job(RECV_FORWARD, 0, 0), Job(F, 0, 0), Job(B, 0, 0), Job(RECV_FORWARD, 0, 1),
             Job(SEND_BACKWARD, 0, 0), Job(F, 0, 1), Job(B, 0, 1), Job(SEND_BACKWARD, 0, 1)]
    bad1 = list(good1)
    bad1[3], bad1[4] = bad1[4], bad1[3]  # send_backward(0) before recv_forward(1)
    make = lambda r1: Schedule("hand", 2, 1, 2, Placement("looped", 2, 1), [rank0, r1], lowered=True)
    return make(bad1), make(good1)


def test_both_ranks_sending_first_is_rejected():
    bad, good = bad_and_good_pp2()
    validate(good)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(bad)
    with pytest.raises(ScheduleError):
        global_order(bad)


def test_lowered_output_of_a_bad_swap_is_rejected():
    # Same defect made from lower_comm's own output: on rank 1 swap the two transfers of the
    # steady state (receive micro-batch 1's input, send micro-batch 0's gradient), so that both
    # ranks send first, or both receive first, at that point.
    lowered = lower_comm(build_schedule("1F1B", 2, 1, 2))
    rank1 = list(lowered.ranks[1])
    recv = rank1.index(Job(RECV_FORWARD, 0, 1))
    send = rank1.index(Job(SEND_BACKWARD, 0, 0))
    rank1[recv], rank1[send] = rank1[send], rank1[recv]
    bad = lowered.with_ranks([lowered.ranks[0], rank1])
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(bad)


def test_the_last_stage_receives_after_its_backward():
    # issue 58: 1F1B at pp 2 receives micro-batch 1's input after backward 0 (as Paddle's own
    # 1F1B does), not before it: the pair waits in both ranks' slack (rank 0 has nothing to run
    # until backward 0's gradient comes back), and the last stage holds one input fewer at its
    # backward's peak
    lowered = lower_comm(build_schedule("1F1B", 2, 1, 4))
    rank1 = [str(j) for j in lowered.ranks[1]]
    assert rank1[:6] == ["recv_forward0[mb0]", "forward0[mb0]", "backward0[mb0]",
                         "send_backward0[mb0]", "recv_forward0[mb1]", "forward0[mb1]"]
    # every rank's compute order is the schedule's, and no rank waits longer (latency model)
    assert simulate(lowered, Costs()).makespan == simulate(build_schedule("1F1B", 2, 1, 4),
                                                           Costs()).makespan


def test_peer_of():
    schedule = lower_comm(build_schedule("VPP", 4, 2, 8))
    assert peer_of(schedule, 3, Job(SEND_FORWARD, 0, 0)) == 0   # stage 3 -> stage 4 on rank 0
    assert peer_of(schedule, 0, Job(RECV_FORWARD, 1, 0)) == 3
    assert peer_of(schedule, 0, Job(SEND_BACKWARD, 1, 0)) == 3
    assert peer_of(schedule, 2, Job(RECV_BACKWARD, 0, 0)) == 3
    with pytest.raises(ValueError):
        peer_of(schedule, 0, Job(FORWARD, 0, 0))
    with pytest.raises(ValueError, match="no peer"):
        peer_of(schedule, 0, Job(SEND_BACKWARD, 0, 0))  # stage 0 has no previous stage


def test_defer_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match="defer must be None or a bool"):
        lower_comm(build_schedule("1F1B", 2, 1, 2), defer="yes")
    eager = lower_comm(build_schedule("1F1B", 2, 1, 2), defer=False)
    assert [str(j) for j in eager.ranks[1][:4]] == ["recv_forward0[mb0]", "forward0[mb0]",
                                                    "recv_forward0[mb1]", "backward0[mb0]"]

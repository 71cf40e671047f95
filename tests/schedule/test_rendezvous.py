"""The simulator's rendezvous comm model (``Costs(comm_mode="rendezvous")``): blocking send /
recv pairs, as gloo runs them on CPU, timed on the lowered schedule; the latency default is
unchanged."""
import pytest

from pipesplit.job_list import build_schedule, lower_comm, schedule_names, serves, simulate
from pipesplit.job_list.ir import (BACKWARD, FORWARD, RECV_BACKWARD, RECV_FORWARD, SEND_BACKWARD,
                                   SEND_FORWARD, Job)
from pipesplit.job_list.lower import EQUAL_STEERING
from pipesplit.job_list.simulate import Costs
from pipesplit.job_list.validate import ScheduleError

#: F = 1, B = 2 (one job), a transfer 0.5
LATENCY = Costs(forward=1.0, backward=2.0, comm=0.5)
RENDEZVOUS = Costs(forward=1.0, backward=2.0, comm=0.5, comm_mode="rendezvous")


def spans(result):
    return [[(str(t.job), t.start, t.end) for t in row] for row in result.timeline]


def test_one_micro_batch_costs_what_the_latency_model_says():
    # Nothing competes with a transfer: F0 on rank 0 [0, 1], its pair [1, 1.5], F0 on rank 1
    # [1.5, 2.5], B0 [2.5, 4.5], the gradient's pair [4.5, 5], B0 on rank 0 [5, 7].
    schedule = build_schedule("1F1B", 2, 1, 1)
    result = simulate(schedule, RENDEZVOUS)
    assert result.makespan == 7.0 == simulate(schedule, LATENCY).makespan
    assert spans(result) == [[("forward0[mb0]", 0.0, 1.0), ("backward0[mb0]", 5.0, 7.0)],
                             [("forward0[mb0]", 1.5, 2.5), ("backward0[mb0]", 2.5, 4.5)]]


def test_two_micro_batches_wait_for_the_blocked_transfers():
    # lower_comm puts each pair where both ranks have slack (latency times): F1's pair waits
    # until rank 1's B0 is done, when rank 0 has nothing left to run before B0 (issue 58: the
    # last stage holds one input fewer in its backward).  Rank 0 runs F0 sF0 F1 rB0 sF1 B0 rB1
    # B1, rank 1 rF0 F0 B0 sB0 rF1 F1 B1 sB1.  Rendezvous:
    #   rank 0 F0 [0, 1]; pair F0 [1, 1.5]; rank 0 F1 [1.5, 2.5] (the pair kept rank 0 busy),
    #   rank 1 F0 [1.5, 2.5], B0 [2.5, 4.5]; pair B0 [4.5, 5]; pair F1 [5, 5.5];
    #   rank 0 B0 [5.5, 7.5], rank 1 F1 [5.5, 6.5], B1 [6.5, 8.5]; pair B1 [8.5, 9];
    #   rank 0 B1 [9, 11]  ->  11 (latency model: 10), as with each pair at its producer's end
    #   (F1's pair [2.5, 3] before rank 1's B0 [3, 5]).
    schedule = build_schedule("1F1B", 2, 1, 2)
    assert simulate(schedule, LATENCY).makespan == 10.0
    result = simulate(schedule, RENDEZVOUS)
    assert result.makespan == 11.0
    assert spans(result) == [
        [("forward0[mb0]", 0.0, 1.0), ("forward0[mb1]", 1.5, 2.5),
         ("backward0[mb0]", 5.5, 7.5), ("backward0[mb1]", 9.0, 11.0)],
        [("forward0[mb0]", 1.5, 2.5), ("backward0[mb0]", 2.5, 4.5),
         ("forward0[mb1]", 5.5, 6.5), ("backward0[mb1]", 6.5, 8.5)]]
    eager = simulate(lower_comm(schedule, LATENCY, defer=False), RENDEZVOUS)
    assert eager.makespan == 11.0 and spans(eager)[1][1] == ("backward0[mb0]", 3.0, 5.0)


def test_a_late_send_blocks_its_sender_until_the_receiver_comes():
    # A lowered schedule runs as given.  Rank 0 sends F0 only after F1:
    #   rank 0 F0 [0, 1], F1 [1, 2]; pair F0 [2, 2.5]; rank 1 F0 [2.5, 3.5];
    #   rank 0 waits at sF1 from 2.5 until rank 1 reaches rF1 at 3.5: pair F1 [3.5, 4];
    #   rank 1 B0 [4, 6]; pair B0 [6, 6.5] (rank 0 waited since 4); rank 0 B0 [6.5, 8.5],
    #   rank 1 F1 [6.5, 7.5], B1 [7.5, 9.5]; pair B1 [9.5, 10]; rank 0 B1 [10, 12]  ->  12.
    schedule = build_schedule("1F1B", 2, 1, 2)
    f, b = (lambda mb: Job(FORWARD, 0, mb)), (lambda mb: Job(BACKWARD, 0, mb))
    sf, rf = (lambda mb: Job(SEND_FORWARD, 0, mb)), (lambda mb: Job(RECV_FORWARD, 0, mb))
    sb, rb = (lambda mb: Job(SEND_BACKWARD, 0, mb)), (lambda mb: Job(RECV_BACKWARD, 0, mb))
    late = schedule.with_ranks([[f(0), f(1), sf(0), sf(1), rb(0), b(0), rb(1), b(1)],
                                [rf(0), f(0), rf(1), b(0), sb(0), f(1), b(1), sb(1)]],
                               lowered=True)
    result = simulate(late, RENDEZVOUS)
    assert result.makespan == 12.0
    assert [t.start for t in result.timeline[0]] == [0.0, 1.0, 6.5, 10.0]
    assert [t.start for t in result.timeline[1]] == [2.5, 4.0, 6.5, 7.5]
    # the timeline indexes the input's own lists (here: lowered, with the comm jobs)
    assert [(t.index, t.job) for t in result.timeline[0]] == [(0, f(0)), (1, f(1)), (5, b(0)),
                                                              (7, b(1))]


@pytest.mark.parametrize("name", [n for n in schedule_names() if n not in ("auto", "autoV")])
def test_rendezvous_runs_the_plan_builders_lowering(name):
    vpp = 2 if serves(name, 4, 2, 8) else 1
    schedule = build_schedule(name, 4, vpp, 8, split_backward=True)
    costs = Costs(1.0, None, 1.5, 0.5, comm=0.25, comm_mode="rendezvous")
    result = simulate(schedule, costs)
    latency = simulate(schedule, costs.as_latency())
    # under blocking pairs the lowering is the fastest of the costs' own steering and equal
    # times', each with the pairs deferred into the slack or at their producer's end (the
    # latency model's lowerings, or EQUAL_STEERING's), and a lowered input is simulated as given
    chosen = lower_comm(schedule, costs).ranks
    ways = [lower_comm(schedule, c, defer=d) for c in (costs.as_latency(), EQUAL_STEERING)
            for d in (True, False)]
    assert chosen in [way.ranks for way in ways]
    assert simulate(lower_comm(schedule, costs), costs).makespan == result.makespan
    assert result.makespan <= min(simulate(x, costs).makespan for x in ways)
    # the timeline indexes the compute-only input's lists, every compute job once
    for rank, row in enumerate(result.timeline):
        assert [t.job for t in row] == schedule.ranks[rank]
        assert [t.index for t in row] == list(range(len(schedule.ranks[rank])))
    # per-rank order is unchanged, so is the memory; blocking only delays
    assert result.peak_memory == latency.peak_memory
    assert result.makespan >= latency.makespan - 1e-9


def test_comm_mode_is_checked_and_serialized_only_when_not_default():
    assert "comm_mode" not in Costs().to_dict() and Costs().comm_mode == "latency"
    assert RENDEZVOUS.to_dict()["comm_mode"] == "rendezvous"
    assert Costs.from_dict(RENDEZVOUS.to_dict()) == RENDEZVOUS
    assert RENDEZVOUS.as_latency() == LATENCY and LATENCY.as_latency() is LATENCY
    with pytest.raises(ValueError, match="comm_mode must be one of"):
        Costs(comm_mode="async")


def test_a_deadlocked_order_raises_under_rendezvous_too():
    schedule = build_schedule("1F1B", 2, 1, 2)
    swapped = schedule.with_ranks([list(reversed(schedule.ranks[0])), schedule.ranks[1]])
    with pytest.raises(ScheduleError):
        simulate(swapped, RENDEZVOUS)

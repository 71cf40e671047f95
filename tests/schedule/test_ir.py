"""The job IR, placements and the validator's messages."""
import pytest

from pipesplit.job_list import (Action, Job, Placement, Schedule, ScheduleError, build_schedule,
                                validate)
from pipesplit.job_list.ir import KINDS


def test_paddle_job_type_strings():
    assert Job("forward", 0, 3).type == "forward0"
    assert Job("backward_b", 1, 0).type == "backward_b1"
    assert Job("send_forward", 0, 2).type == "send_forward0"
    assert Job("optimizer").type == "optimizer"
    assert {Job(kind, None, None) if kind == "optimizer" else Job(kind, 2, 1) for kind in KINDS}
    with pytest.raises(ValueError, match="kind must be one of"):
        Job("forwardd", 0, 0)
    with pytest.raises(ValueError, match="micro_batch must be an int >= 0"):
        Job("forward", 0, -1)
    with pytest.raises(ValueError, match="neither chunk nor micro_batch"):
        Job("optimizer", 0, 0)


@pytest.mark.parametrize("text", ["0F0", "13I7", "5W12", "3B0", "2SEND_F4", "1RECV_B0", "OPT"])
def test_short_form_round_trip(text):
    assert str(Action.parse(text)) == text


@pytest.mark.parametrize("bad", ["F0", "0X0", "0F", "a0F0", "0 F0"])
def test_short_form_rejects_malformed_text(bad):
    with pytest.raises(ValueError, match="is not of the form"):
        Action.parse(bad)


def test_schedule_actions_and_back():
    schedule = build_schedule("ZBV", 4, 2, 8)
    for rank in range(4):
        for job, action in zip(schedule.ranks[rank], schedule.actions(rank)):
            assert schedule.from_action(action) == (rank, job)


def test_textbook_looped_layer_assignment():
    """pp=4, v=2, 16 layers (1-based): device 0 holds 1, 2, 9, 10; device 1: 3, 4, 11, 12 ..."""
    held = Placement("looped", 4, 2).layers_of_rank(16)
    assert {rank: [layer + 1 for layer in layers] for rank, layers in held.items()} == {
        0: [1, 2, 9, 10], 1: [3, 4, 11, 12], 2: [5, 6, 13, 14], 3: [7, 8, 15, 16]}


def test_v_placement_mirrors_odd_chunks():
    placement = Placement("v", 4, 2)
    assert [placement.stage(r, 0) for r in range(4)] == [0, 1, 2, 3]
    assert [placement.stage(r, 1) for r in range(4)] == [7, 6, 5, 4]
    for stage in range(8):
        assert placement.stage(*placement.rank_chunk(stage)) == stage
    assert placement.layer_owner(7, 16) == (3, 0) and placement.layer_owner(8, 16) == (3, 1)


def test_layers_not_divisible_by_stages():
    with pytest.raises(ValueError, match=r"num_layers \(10\) must be divisible by pp\*vpp"):
        Placement("looped", 4, 2).layers_per_stage(10)


def test_validator_names_rank_position_and_jobs_of_a_local_order_error():
    schedule = build_schedule("1F1B", 4, 1, 4, split_backward=True)
    ranks = [list(jobs) for jobs in schedule.ranks]
    ranks[3].insert(0, ranks[3].pop(ranks[3].index(Job("backward_b", 0, 1))))
    with pytest.raises(ScheduleError, match=r"rank 3, job #0 \(3I1\) comes before its 3F1"):
        validate(schedule.with_ranks(ranks))
    ranks = [list(jobs) for jobs in schedule.ranks]
    w = ranks[2].pop(ranks[2].index(Job("backward_w", 0, 0)))
    ranks[2].insert(ranks[2].index(Job("backward_b", 0, 0)), w)
    with pytest.raises(ScheduleError, match=r"rank 2, job #\d+ \(2W0\) comes before its 2I0"):
        validate(schedule.with_ranks(ranks))


def test_validator_reports_a_cross_rank_cycle():
    pp, m = 2, 2
    placement = Placement("looped", pp, 1)
    f, b = (lambda mb: Job("forward", 0, mb)), (lambda mb: Job("backward", 0, mb))
    ranks = [[f(0), f(1), b(1), b(0)],     # rank 0 wants 0B1 (needs 1B1) before 0B0
             [f(0), b(0), f(1), b(1)]]     # rank 1 runs 1B0 first: needs nothing from rank 0
    validate(Schedule("ok", pp, 1, m, placement, ranks))
    ranks = [[f(0), b(0), f(1), b(1)],     # rank 0 waits for 1B0 ...
             [f(0), f(1), b(1), b(0)]]     # ... which rank 1 runs after 1F1, needing 0F1
    with pytest.raises(ScheduleError) as error:
        validate(Schedule("bad", pp, 1, m, placement, ranks))
    message = str(error.value)
    assert "rank 0, job #1 (0B0) waits for 1B0" in message
    assert "rank 1, job #1 (1F1) waits for 0F1, which rank 0 runs only after 0B0" in message


def test_validator_rejects_incomplete_and_duplicate_jobs():
    schedule = build_schedule("1F1B", 2, 1, 2)
    ranks = [list(jobs) for jobs in schedule.ranks]
    ranks[1].remove(Job("backward", 0, 1))
    with pytest.raises(ScheduleError, match="stage 1, micro-batch 1: needs one backward"):
        validate(schedule.with_ranks(ranks))
    ranks = [list(jobs) + [Job("forward", 0, 0)] if r == 0 else list(jobs)
             for r, jobs in enumerate(schedule.ranks)]
    with pytest.raises(ScheduleError, match="appears 2 times"):
        validate(schedule.with_ranks(ranks))


@pytest.mark.parametrize("kind,per_rank,counts,stages", [
    # Paddle's VPP test: 7 layers, pp 2, vpp 2, 4 on stage 0 and 3 on stage 1
    ("looped", [4, 3], [2, 2, 2, 1], [0, 0, 1, 1, 2, 2, 3]),
    ("v", [4, 3], [2, 2, 1, 2], [0, 0, 1, 1, 2, 3, 3]),  # rank 1 holds stages 1 and 2
    ("v", [2, 5], [1, 3, 2, 1], [0, 1, 1, 1, 2, 2, 3]),
    ("looped", [3, 2], [3, 2], [0, 0, 0, 1, 1]),          # vpp 1: the user's meshes
])
def test_blocks_are_dealt_to_each_ranks_chunks_as_paddle_deals_them(kind, per_rank, counts,
                                                                     stages):
    placement = Placement(kind, 2, 2 if len(counts) == 4 else 1)
    assert placement.deal_blocks(per_rank) == counts
    assert placement.stages_of_blocks(per_rank) == stages
    held = [sum(1 for s in stages if placement.rank_of(s) == r) for r in range(2)]
    assert held == per_rank  # every rank keeps its blocks


def test_even_blocks_deal_as_the_even_split():
    for kind in ("looped", "v"):
        placement = Placement(kind, 4, 2)
        assert placement.stages_of_blocks([4] * 4) == [placement.stage_of_block(i, 16)
                                                       for i in range(16)]


def test_a_rank_with_fewer_blocks_than_chunks_is_refused():
    with pytest.raises(ValueError, match=r"rank 0 keeps 1 block\(s\), fewer than vpp = 2"):
        Placement("v", 2, 2).deal_blocks([1, 6])
    with pytest.raises(ValueError, match="per_rank must give the blocks of each of the 2 ranks"):
        Placement("v", 2, 2).deal_blocks([4])

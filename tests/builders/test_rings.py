"""One ring per group of ranks (``passes/transport/rings.py``): the ids every process agrees on,
what cannot be mended, and the renumbering of a real program's collectives."""
import paddle
import pytest

from pipesplit.passes.transport.rings import (FRESH_RING_BASE, RingDisagreement, agreed_ids,
                                              rewrite_ring_ids)

#: what the four processes of sharding stage 3 at dp2 x pp2 made (issue 43): the two stages
#: number the same ranks differently, and ring 14 is two different groups
DP2_PP2_STAGE3 = {
    0: [(12, (0, 2), False), (13, (0, 1), False), (14, (1, 0), False), (15, (0, 1, 2, 3), False)],
    1: [(12, (0, 1), False), (13, (1, 0), False), (14, (1, 3), False), (15, (0, 1, 2, 3), False)],
    2: [(12, (0, 2), False), (13, (2, 3), False), (14, (3, 2), False), (15, (0, 1, 2, 3), False)],
    3: [(12, (2, 3), False), (13, (3, 2), False), (14, (1, 3), False), (15, (0, 1, 2, 3), False)],
}


def _groups(tables, mapping):
    """agreed id -> ranks, per process; every process must say the same of every id."""
    seen = {}
    for process, held in tables.items():
        for ring, ranks, _ in held:
            new = mapping[process][ring]
            assert seen.setdefault(new, ranks) == ranks, (process, ring, new)
    return seen


def test_every_process_gives_a_group_the_same_id():
    mapping = agreed_ids(DP2_PP2_STAGE3)
    groups = _groups(DP2_PP2_STAGE3, mapping)
    assert len(groups) == len({ranks for held in DP2_PP2_STAGE3.values()
                               for _, ranks, _ in held})  # one id per group of ranks
    assert mapping[0][15] == 15  # an id all holders share and nobody else uses stays
    # a renumbered group's id is far from the ids Paddle gives the groups it makes later
    assert mapping[0][13] >= FRESH_RING_BASE
    assert mapping == agreed_ids(dict(reversed(list(DP2_PP2_STAGE3.items()))))  # no order


def test_ids_that_agree_are_kept_and_reserved_ids_are_not_given():
    tables = {0: [(11, (0, 1), False)], 1: [(11, (0, 1), False)]}
    assert agreed_ids(tables) == {0: {11: 11}, 1: {11: 11}}
    moved = agreed_ids(tables, reserved={11})
    assert moved[0][11] == moved[1][11] not in (0, 11)


def test_a_group_made_already_keeps_its_id_and_a_new_one_moves_aside():
    tables = {0: [(12, (0, 1), True), (13, (0, 2), False)],
              1: [(12, (0, 1), True)],
              2: [(12, (0, 2), False)]}
    mapping = agreed_ids(tables)
    assert mapping[0][12] == mapping[1][12] == 12
    assert mapping[0][13] == mapping[2][12] not in (0, 12)


def test_a_group_made_under_two_ids_is_refused():
    tables = {0: [(12, (0, 1), True)], 1: [(13, (0, 1), True)]}
    with pytest.raises(RingDisagreement, match=r"ranks \[0, 1\] are ring 12 on one process and "
                                               r"ring 13 on another"):
        agreed_ids(tables)


def test_a_group_a_member_never_made_is_refused_not_a_hang():
    tables = {0: [(12, (0, 1), False)], 1: []}
    with pytest.raises(RingDisagreement, match=r"ranks \[0, 1\] \(ring 12 on process 0\) is not "
                                               r"held by its member\(s\) \[1\]"):
        agreed_ids(tables)


def test_a_forced_second_group_of_the_same_ranks_is_its_own_ring():
    tables = {p: [(12, (0, 1), False), (20, (0, 1), False)] for p in (0, 1)}
    tables[1] = [(12, (0, 1), False), (19, (0, 1), False)]
    mapping = agreed_ids(tables)
    assert mapping[0][12] == mapping[1][12] == 12
    assert mapping[0][20] == mapping[1][19] not in (12, 19, 20)


def test_the_renumbering_reaches_every_collective_of_a_program():
    paddle.enable_static()
    try:
        program = paddle.static.Program()
        with paddle.static.program_guard(program):
            x = paddle.static.data("x", [4, 2], "float32")
            a = paddle._C_ops.all_gather(x, 12, 2)
            b = paddle._C_ops.reduce_scatter(a, 13, 2)
            paddle._C_ops.all_reduce(b, 12, 0)
        assert rewrite_ring_ids([program], {12: 13, 13: 12}) == 3  # a swap, all at once
        rings = [op.attrs()["ring_id"] for op in program.global_block().ops
                 if op.has_attr("ring_id")]
        assert rings == [13, 12, 13]
    finally:
        paddle.disable_static()

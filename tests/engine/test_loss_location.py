"""The loss of a step handed to the last pipeline stage's ranks (``passes/engine/loss_location``)
through a real TCP store: a V placement computes it on pipeline rank 0 and gives it to the last
rank at the same coordinate; a looped placement already has it there and leaves it."""
import numpy as np
import pytest

from _launch import free_port
from pipesplit.job_list.pipe import Pipe
from pipesplit.job_list.placement import LOOPED, V_SHAPE, Placement
from pipesplit.passes.engine.loss_location import hand_the_loss_on, loss_rank
from pipesplit.passes.transport.loss_carriers import StoredLoss, pack, unpack


def _store(port: int):
    from paddle.base import core

    return core.TCPStore("127.0.0.1", port, True, 1, 30)


def test_the_loss_is_computed_on_the_rank_of_the_last_virtual_stage():
    assert [loss_rank(Placement(V_SHAPE, pp, 2)) for pp in (2, 3, 4)] == [0, 0, 0]
    assert [loss_rank(Placement(LOOPED, pp, vpp)) for pp, vpp in ((2, 1), (2, 2), (4, 3))] \
        == [1, 1, 3]


def test_a_v_placement_hands_each_steps_loss_to_the_last_stage():
    store = _store(free_port())
    pipe = Pipe((4, 6, 9))  # processes of pipeline ranks 0, 1, 2 at one (dp, mp) coordinate
    v = Placement(V_SHAPE, 3, 2)
    for step in range(2):
        loss = np.array([1.5 + step, 2.5], np.float32)
        given = hand_the_loss_on({"loss": loss, "outputs": loss, "other": 7}, pipe, v, 4,
                                 carrier=StoredLoss(store))
        assert given == {"loss": None, "outputs": None, "other": 7}
        middle = {"loss": None, "outputs": None}
        assert hand_the_loss_on(middle, pipe, v, 6, carrier=StoredLoss(store)) is middle
        taken = hand_the_loss_on({"loss": None, "outputs": None}, pipe, v, 9,
                                 carrier=StoredLoss(store))
        np.testing.assert_array_equal(taken["loss"], loss)
        assert taken["loss"].dtype == np.float32 and taken["outputs"] is taken["loss"]


def test_a_looped_placement_keeps_the_loss_where_it_is():
    logs = {"loss": np.array([0.5]), "outputs": None}
    for process in (4, 6):
        assert hand_the_loss_on(logs, Pipe((4, 6)), Placement(LOOPED, 2, 2), process,
                                carrier=object()) is logs


def test_a_giver_without_a_loss_is_named():
    with pytest.raises(RuntimeError, match=r"pipeline rank 0 computes the loss \(v placement\) "
                                           r"but the step fetched none"):
        hand_the_loss_on({"loss": None}, Pipe((0, 1)), Placement(V_SHAPE, 2, 2), 0,
                         carrier=StoredLoss(_store(free_port())))


def test_a_loss_packs_into_the_gathered_vector_and_back_exactly():
    for value in (np.array([1.25, 2.5e-8, 3.0], np.float32), np.array([[0.1], [0.2]]),
                  np.array(7.5, np.float16)):
        back = unpack(pack(value, capacity=4))
        assert back.dtype == value.dtype and back.shape == value.shape
        np.testing.assert_array_equal(back, value)
    with pytest.raises(RuntimeError, match="does not fit the loss hand-off"):
        pack(np.zeros(5, np.float32), capacity=4)

"""The peer rule of hybrid meshes: a pipeline is the processes that share their non-pp mesh
coordinates (job_list.pipe, pure Python)."""
import numpy as np
import pytest

from pipesplit.job_list.pipe import Pipe, pipe_of


def _stages(dp, pp, mp, order=("dp", "pp", "mp")):
    """Stage meshes (process ids, row-major) of a global mesh arange(world) laid out ``order``."""
    sizes = {"dp": dp, "pp": pp, "mp": mp}
    grid = np.arange(dp * pp * mp).reshape([sizes[d] for d in order])
    axis = order.index("pp")
    return [np.take(grid, i, axis=axis).reshape(-1).tolist() for i in range(pp)]


@pytest.mark.parametrize("dp,pp,mp", [(1, 2, 1), (2, 2, 1), (1, 2, 2), (2, 2, 2), (2, 4, 1),
                                      (1, 3, 2), (2, 2, 3)])
@pytest.mark.parametrize("order", [("dp", "pp", "mp"), ("pp", "dp", "mp"), ("dp", "mp", "pp")])
def test_every_process_is_in_one_pipe_of_pp_ranks_with_equal_coordinates(dp, pp, mp, order):
    stages = _stages(dp, pp, mp, order)
    sizes = {"dp": dp, "pp": pp, "mp": mp}
    grid = np.arange(dp * pp * mp).reshape([sizes[d] for d in order])
    coords = {int(grid[idx]): dict(zip(order, idx)) for idx in np.ndindex(grid.shape)}
    pipes = set()
    for process in range(dp * pp * mp):
        pipe = pipe_of(stages, process)
        assert pipe.pp == pp
        assert pipe.process_of(pipe.rank_of(process)) == process
        assert pipe.rank_of(process) == coords[process]["pp"]
        for r, p in enumerate(pipe.processes):  # same dp / mp coordinate, stage r
            assert coords[p]["pp"] == r
            assert coords[p]["dp"] == coords[process]["dp"]
            assert coords[p]["mp"] == coords[process]["mp"]
        pipes.add(pipe)
    assert len(pipes) == dp * mp
    assert sorted(p for pipe in pipes for p in pipe.processes) == list(range(dp * pp * mp))


def test_one_process_stages_are_the_plain_rank_order():
    assert pipe_of([[0], [1], [2]], 2) == Pipe((0, 1, 2)) == Pipe.single_process_per_stage(3)
    assert pipe_of([[0], [1]], 0).rank_of(1) == 1


def test_stage_meshes_that_cannot_form_pipes_are_refused_with_the_meshes_named():
    with pytest.raises(ValueError, match=r"same number of processes.*stage 1: \[2\]"):
        pipe_of([[0, 1], [2]], 0)
    with pytest.raises(ValueError, match=r"same shape.*stage 0: \[2, 1\]"):
        pipe_of([[0, 1], [2, 3]], 0, stage_shapes=[[2, 1], [1, 1, 2]][:1] + [[4]])
    with pytest.raises(ValueError, match="process 1 is in stage 0's and stage 1's mesh"):
        pipe_of([[0, 1], [1, 2]], 0)
    with pytest.raises(ValueError, match="process 9 is in no stage mesh"):
        pipe_of([[0, 1], [2, 3]], 9)
    with pytest.raises(ValueError, match=r"process 5 is not in this pipeline"):
        Pipe((0, 2)).rank_of(5)
    with pytest.raises(ValueError, match=r"pipeline rank must be in \[0, 2\)"):
        Pipe((0, 2)).process_of(2)


def test_size_one_dims_may_be_kept_or_dropped():
    assert pipe_of([[0, 1], [2, 3]], 3, stage_shapes=[[1, 2], [2]]) == Pipe((1, 3))

"""The parity tests on one GPU, for users with a CUDA build of Paddle (skipped on CPU builds:
paddlepaddle-gpu 3.x is not on PyPI, so CI never has one)."""
import paddle
import pytest

from pipesplit.job_list import schedule_names, serves

from _parity import assert_matches_unsplit

HAS_GPU = paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA build of Paddle and a GPU")]

GRID = [(name, pp, vpp, pp + 1) for name in schedule_names()
        for pp, vpp in [(1, 1), (2, 2), (4, 1), (4, 2)] if serves(name, pp, vpp, pp + 1)]


@pytest.fixture(scope="module")
def gpu_place():
    paddle.set_device("gpu:0")
    yield paddle.CUDAPlace(0)
    paddle.set_device("cpu")


@pytest.mark.parametrize("split_backward", [False, True], ids=["B", "IW"])
@pytest.mark.parametrize("name, pp, vpp, m", GRID)
def test_gpu_parity(gpu_place, name, pp, vpp, m, split_backward):
    assert_matches_unsplit("gpt", "adam", name, pp, vpp, m, split_backward, place=gpu_place)

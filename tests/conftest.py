"""Fixtures shared by several test files."""
import pytest


@pytest.fixture
def static_mode():
    """Paddle's static (PIR) mode for one test, dynamic mode again after it."""
    import paddle

    paddle.enable_static()
    yield
    paddle.disable_static()

"""Fixtures shared by several test files; the helper modules (``tests/helpers``) importable
from every room."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))


@pytest.fixture
def static_mode():
    """Paddle's static (PIR) mode for one test, dynamic mode again after it."""
    import paddle

    paddle.enable_static()
    yield
    paddle.disable_static()

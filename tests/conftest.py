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


def pytest_configure(config):
    """The launch ledger (:mod:`_ledger`): named before xdist starts its workers, which inherit
    it; in a worker it is already there."""
    if not hasattr(config, "workerinput"):
        import _ledger

        config._pipesplit_launches = _ledger.open_ledger()


def pytest_terminal_summary(terminalreporter, config):
    """How many launches the session made, their seconds and a launch's start-up cost."""
    folder = getattr(config, "_pipesplit_launches", None)
    if folder is None:
        return
    import shutil

    import _ledger

    lines = _ledger.summary_lines(folder)
    shutil.rmtree(folder, ignore_errors=True)
    if lines:
        terminalreporter.section("launches")
        for line in lines:
            terminalreporter.write_line(line)

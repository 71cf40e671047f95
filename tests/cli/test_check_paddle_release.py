"""``tools/check_paddle_release.py``: its arguments checked before any environment is made, the
tests it runs (the CI subset ``.ci/run`` runs on each other line), what it installs for a
release, and pytest's counts read from its summary line.  (Making an environment takes minutes:
``.ci/run`` does that.)"""
from __future__ import annotations

import subprocess
import sys

import pytest

from pipesplit.passes._paddle import SUPPORTED_PADDLE_VERSIONS
from pipesplit.tools import check_paddle_release as tool

from _paths import REPO

SCRIPT = REPO / "tools" / "check_paddle_release.py"


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as info:
        tool.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("bad", ["3.2", "latest", "3.2.x", "v3.2.2", "3.2.2 ", ""])
def test_a_malformed_release_is_refused_and_nothing_is_made(capsys, tmp_path, bad):
    venv = tmp_path / "venv"
    err = _refused(capsys, [bad, "--venv", str(venv)])
    assert f"error: {bad!r} is not a PaddlePaddle release number (MAJOR.MINOR.PATCH" in err
    assert not venv.exists()


@pytest.mark.parametrize("release", ["3.0.1", "2.6.2", "3.4.0"])
def test_an_unsupported_release_is_refused_naming_it_unless_untested(capsys, tmp_path, release):
    venv = tmp_path / "venv"
    err = _refused(capsys, [release, "--venv", str(venv)])
    assert (f"error: PaddlePaddle {release} is not a release pipesplit supports (3.3.1, 3.3.0, "
            "3.2.2, 3.2.1, 3.2.0, 3.1.1, 3.1.0, 3.0.0; passes/_paddle.py); to try it with the "
            "gate opened for it, add --untested") in err
    assert not venv.exists()
    assert tool.parse_args([release, "--untested", "--venv", str(venv)]).untested
    assert not venv.exists()


def test_a_test_path_not_in_the_checkout_is_refused(capsys, tmp_path):
    err = _refused(capsys, ["3.2.2", "--tests", "tests/no_such_test.py", "--venv",
                            str(tmp_path / "v")])
    assert "error: no such test path in" in err and "tests/no_such_test.py" in err
    assert not (tmp_path / "v").exists()


def test_the_script_runs_as_a_file_with_the_standard_library(tmp_path):
    """As a maintainer runs it (``python tools/check_paddle_release.py ...``): a bad release
    stops it at once, and it imports nothing but the standard library."""
    done = subprocess.run([sys.executable, str(SCRIPT), "3.9", "--venv", str(tmp_path / "v")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "'3.9' is not a PaddlePaddle release number" in done.stderr
    assert not (tmp_path / "v").exists()
    probe = ("import sys, runpy; runpy.run_path(sys.argv[1]); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('paddle', 'pipesplit', 'numpy', 'pytest')))")
    done = subprocess.run([sys.executable, "-c", probe, str(SCRIPT)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_parts_it_runs():
    assert tool.selected_tests(tool.parse_args(["3.2.2"])) == list(tool.CI_SUBSET)
    assert tool.selected_tests(tool.parse_args(["3.2.2", "--ci-subset"])) == list(tool.CI_SUBSET)
    assert tool.selected_tests(tool.parse_args(["3.1.1", "--full"])) == ["tests"]
    picked = ["tests/engine/test_strategy.py", "tests/cli/test_cli.py::test_version"]
    assert tool.selected_tests(tool.parse_args(["3.3.0", "--tests", *picked])) == picked
    for node in tool.CI_SUBSET:
        path, _, name = node.partition("::")
        assert (REPO / path).is_file(), node
        assert not name or f"def {name}(" in (REPO / path).read_text(), node
    args = tool.parse_args(["3.2.2"])
    assert str(args.venv) == "/tmp/pipesplit-paddle-3.2.2"


def test_ci_runs_the_subset_on_each_other_line_through_the_script():
    ci = (REPO / ".ci" / "run").read_text()
    for release in ("3.1.1", "3.2.2", "3.3.0"):
        assert release in ci
    assert "tools/check_paddle_release.py" in ci and "--ci-subset" in ci
    assert "python -m pytest -q tests" in ci  # the whole suite on the pinned release


def test_what_it_installs_for_a_release(tmp_path):
    def commands(release):
        return tool.install_commands(tool.parse_args([release, "--venv", str(tmp_path)]))

    for release in SUPPORTED_PADDLE_VERSIONS:
        first, *rest = commands(release)
        assert f"paddlepaddle=={release}" in first
        assert not any(a.startswith("paddlepaddle==") and a != f"paddlepaddle=={release}"
                       for a in first)
        assert "numpy==1.26.4" in first and "pytest-xdist==3.8.0" in first
        assert rest[-1][-1] == str(REPO)  # this checkout, last
        with_formers = any("requirements-nodeps.txt" in " ".join(c) for c in rest)
        assert with_formers == (not release.startswith(("3.1.", "3.0."))), release
        assert ("protobuf==6.33.6" in first) == (release != "3.3.1"), release


def test_pytest_s_counts_are_read_from_its_summary_line():
    text = ("..s.F\n= short test summary info =\nFAILED tests/x.py::test_y\n"
            "1 failed, 1006 passed, 12 skipped, 2 deselected in 1336.61s (0:22:16)\n")
    assert tool.counts(text) == {"failed": 1, "passed": 1006, "skipped": 12, "deselected": 2}
    assert tool.counts("127 passed in 136.64s (0:02:16)\n") == {"passed": 127}
    assert tool.counts("= 3 passed, 1 error in 2.0s =\n") == {"passed": 3, "errors": 1}
    assert tool.counts("nothing ran\n") == {}
    args = tool.parse_args(["3.2.2", "--full"])
    line = tool.summary(args, {"passed": 3, "skipped": 1}, 12.4, 0)
    assert line.startswith("paddlepaddle==3.2.2: full suite: 3 passed, 1 skipped, 0 failed in 12 s")

"""What a new user meets first: --version, --help with defaults, "did you mean", output paths,
closed pipes, the grid's width, progress lines, the demo's schedule-dependent defaults."""
import io
import os
import re
import subprocess
import sys

import pytest

import pipesplit
from pipesplit.job_list import build_schedule, get_spec
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.views import ascii_grid
from pipesplit.tools import _console
from pipesplit.tools.cli import load_schedules, main

load_schedules()
PIPESPLIT = [sys.executable, "-m", "pipesplit.tools.cli"]


def _cli(*args, **kwargs):
    return subprocess.run(PIPESPLIT + list(args), capture_output=True, text=True, timeout=300,
                          **kwargs)


_PADDLE_WARNING = re.compile(r"^\S*[/\\]paddle[/\\]\S+\.py:\d+: \w*Warning: ")


def _ours(stderr: str) -> str:
    """``stderr`` without the warnings Paddle's own files emit (each with the source line
    Python quotes under it): what a release prints at import or on the way (``No ccache found``,
    a reworded PIR warning) is not pipesplit's output."""
    kept, skip_quote = [], False
    for line in stderr.splitlines(keepends=True):
        if _PADDLE_WARNING.match(line):
            skip_quote = True
            continue
        if skip_quote and line.startswith("  "):
            continue
        skip_quote = False
        kept.append(line)
    return "".join(kept)


def test_paddle_s_own_warnings_are_told_from_our_output():
    paddle_file = "/venv/lib/python3.11/site-packages/paddle/utils/cpp_extension/x.py"
    text = (f"{paddle_file}:718: UserWarning: No ccache found.\n  warnings.warn(message)\n"
            "pipesplit demo: error: -m must be >= 1, got 0\n")
    assert _ours(text) == "pipesplit demo: error: -m must be >= 1, got 0\n"
    assert _ours("/work/pipesplit/tools/demo.py:3: UserWarning: ours\n") != ""


def test_quiet_paddle_silences_the_pir_place_warning_of_every_supported_release(monkeypatch):
    import warnings

    monkeypatch.setenv("GLOG_minloglevel", "2")  # (quiet_paddle's setdefault: undone after)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _console.quiet_paddle()
        for wording in ("Tensor", "Value"):  # 3.3; 3.1 and 3.2
            warnings.warn(f"{wording} do not have 'place' interface for pir graph mode",
                          UserWarning)
        warnings.warn("No ccache found. Please be aware", UserWarning)
    assert caught == []


def test_version_matches_the_installed_metadata(capsys):
    from importlib.metadata import version

    assert pipesplit.__version__ == version("pipesplit")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pipesplit {pipesplit.__version__}"


def test_help_shows_defaults(capsys):
    assert main(["schedule", "show", "--help"]) == 0
    out = capsys.readouterr().out
    assert "pipeline ranks (default: 4)" in out and "chunks per rank (default: 1)" in out
    assert "(default: None)" not in out and "(default: False)" not in out
    from pipesplit.tools.demo import make_parser

    text = make_parser().format_help()
    assert "(default: ZBVPP)" in text and "(default: 3)" in text and "(default: gpt)" in text
    assert "else 1, e.g. 1 for ZBH1" in text


def test_misspelled_schedule_gets_a_suggestion(capsys):
    with pytest.raises(ValueError, match=r"unknown schedule 'ZBH' \(did you mean 'ZBH2' or "
                                         r"'ZBH1'"):
        get_spec("ZBH")
    with pytest.raises(ValueError, match=r"'Interleaved1FB1' \(did you mean 'VPP'"):
        get_spec("Interleaved1FB1")  # an alias's schedule is named by its canonical name
    with pytest.raises(ValueError) as info:
        get_spec("nothing-like-it")
    assert "did you mean" not in str(info.value)
    assert main(["schedule", "show", "-s", "1f1", "--pp", "2"]) == 2
    assert "did you mean '1F1B'?" in capsys.readouterr().err


def test_output_folders_are_created_before_the_work(tmp_path, capsys):
    target = tmp_path / "new" / "dir" / "x.json"
    assert main(["schedule", "trace", "-s", "VPP", "--pp", "2", "--vpp", "2", "-m", "4",
                 "-o", str(target)]) == 0
    assert target.exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["schedule", "trace", "-s", "VPP", "--pp", "2", "-m", "4",
                 "-o", str(blocker / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesplit: error: -o ") and "cannot create folder" in err
    assert err.count("\n") == 1


def test_closed_pipe_exits_quietly():
    for args in (["schedule", "show", "--schedule", "1F1B", "--pp", "2", "-m", "4"],
                 ["schedule", "export", "-s", "1F1B", "--pp", "8", "-m", "2000",
                  "--format", "json"]):
        proc = subprocess.run(" ".join(PIPESPLIT + args) + " | head -1", shell=True,
                              capture_output=True, text=True, timeout=120,
                              executable="/bin/bash")
        assert proc.stdout.count("\n") == 1 and proc.stderr == "", proc.stderr
        status = subprocess.run("set -o pipefail; " + " ".join(PIPESPLIT + args) + " | head -1",
                                shell=True, capture_output=True, text=True, timeout=120,
                                executable="/bin/bash")
        assert status.returncode == 0, status.stderr


def test_grid_fits_its_width_and_counts_the_jobs_that_share_a_column():
    costs = Costs(forward=1.0, backward=2.0, backward_b=0.3, backward_w=1.7, comm=0.05)
    sim = simulate(build_schedule("ZBH1", 4, 1, 16), costs)
    wide = ascii_grid(sim)
    assert "+N" not in wide  # the default step gives every job a cell of its own
    for width in (60, 100, 160):
        grid = ascii_grid(sim, width=width)
        rows = [line for line in grid.splitlines() if line.startswith("rank ")]
        assert rows and all(len(line) <= width for line in rows), width
        legend = grid.splitlines()[-1]
        shared = sum(cell.startswith("+") for row in rows for cell in row.split("|")[1].split())
        if shared:
            assert "+N: N jobs shorter than the time step in one column" in legend
            assert f"of {sum(len(r) for r in sim.timeline)} jobs" in legend
    step = float(ascii_grid(sim, width=60).split()[2])
    assert step in (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)  # a round time step


def test_grid_width_default_follows_the_terminal(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert _console.grid_width() == _console.DEFAULT_WIDTH
    assert _console.grid_width(90) == 90


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_lines_only_on_a_terminal_and_not_when_quiet():
    terminal = _Terminal()
    progress = _console.Progress("bench", total=2, stream=terminal)
    progress.step("first")
    progress.step("second")
    lines = terminal.getvalue().splitlines()
    assert lines[0].startswith("bench [1/2] first") and lines[1].startswith("bench [2/2] second")
    for quiet, stream in ((True, _Terminal()), (False, io.StringIO())):
        progress = _console.Progress("bench", stream=stream, quiet=quiet)
        progress.step("x")
        progress.note("y")
        assert stream.getvalue() == ""


def test_bench_schedules_progress_goes_to_its_progress_object():
    from pipesplit.tools.bench.bench_schedules import run

    terminal = _Terminal()
    rows = run(["1F1B"], pps=[2], vpps=[1], jobs=1,
               progress=_console.Progress("bench_schedules", stream=terminal))
    lines = terminal.getvalue().splitlines()
    assert len(lines) == 5 and lines[-1].startswith("bench_schedules [5/5] pp=2 vpp=1")
    assert len(rows) == 5 * 3


def test_bench_pass_names_missed_targets():
    from pipesplit.tools.bench.bench_pass import target_status

    assert target_status(0.6, 0.5) == "target <= 0.5: MISSED"
    assert target_status(0.5, 0.5) == "target <= 0.5: met"
    assert target_status(None, 1.05) == "target <= 1.05: not measured"


def test_demo_vpp_follows_the_schedule_and_errors_name_the_flag(tmp_path):
    from pipesplit.tools.demo import default_vpp

    assert default_vpp("ZBH1", 2, 4) == 1 and default_vpp("zbh2", 4, 8) == 1
    assert default_vpp("ZBVPP", 2, 4) == 2 and default_vpp("ZBV", 2, 4) == 2
    proc = _cli("demo", "--schedule", "ZBH1", "--steps", "1", "--json",
                str(tmp_path / "a" / "b.json"), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ZBH1: pp=2 vpp=1 m=4") and (tmp_path / "a" / "b.json").exists()
    assert _ours(proc.stderr) == ""  # no progress lines when stderr is not a terminal
    proc = _cli("demo", "-m", "0")
    assert proc.returncode == 2 and "pipesplit demo: error: -m must be >= 1, got 0" in proc.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = _cli("demo", "--json", str(blocker / "x.json"))  # refused before any training
    assert proc.returncode == 2 and "--json" in proc.stderr and "Traceback" not in proc.stderr
    assert "loss" not in proc.stdout


def test_version_from_outside_the_clone(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import pipesplit; print(pipesplit.__version__)"],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=""))
    assert proc.returncode == 0 and proc.stdout.strip() == pipesplit.__version__

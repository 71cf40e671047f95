"""The ``pipesplit`` command line and ``bench_schedules``."""
import json
import subprocess
import sys
import types

import pytest

from pipesplit.job_list import build_schedule, schedule_names
from pipesplit.job_list import registry
from pipesplit.job_list.validate import validate
from pipesplit.job_list.views import from_csv, from_json
from pipesplit.tools import cli
from pipesplit.tools.cli import accepts, load_schedules, main

load_schedules()


def needs(*names):
    """Marks a test that uses these schedules; fails loudly if one is not registered."""
    missing = [n for n in names if n.lower() not in registry._LOOKUP]
    assert not missing, f"schedules {missing} are not registered"
    return lambda test: test


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@needs("1F1B")
def test_show_prints_lists_grid_and_summary(capsys):
    rc, out, err = run(capsys, "schedule", "show", "--schedule", "1F1B", "--pp", "4", "-m", "8")
    assert rc == 0, err
    assert "1F1B pp=4 vpp=1 m=8" in out
    assert "rank 0: 0F0 0F1 0F2 0F3 0B0" in out
    grid_rows = [l for l in out.splitlines() if l.startswith("rank ") and "|" in l]
    assert len(grid_rows) == 4
    assert "makespan 33" in out and "bubble 27.3%" in out
    assert "peak memory" in out and "(max 4)" in out


@needs("1F1B")
def test_show_with_costs_comm_and_split(capsys):
    rc, out, err = run(capsys, "schedule", "show", "-s", "1f1b", "--pp", "2", "-m", "3",
                       "--split-backward", "--cost", "1,2,1,1", "--comm", "0.5", "--width", "200")
    assert rc == 0, err
    assert "0I0" in out and "0W0" in out
    assert "makespan" in out


@needs("1F1B")
def test_costs_file(capsys, tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"costs": {"forward": 2, "backward_b": 1, "backward_w": 1,
                                          "comm": 0}}))
    rc, out, err = run(capsys, "schedule", "show", "-s", "1F1B", "--pp", "2", "-m", "2",
                       "--costs", str(path))
    assert rc == 0, err
    assert "makespan 12" in out  # (m+p-1)(tF+tB) = 3*4


@needs("1F1B", "VPP")
def test_export_csv_and_json_round_trip(capsys):
    for name, pp, vpp, m in (("1F1B", 4, 1, 8), ("VPP", 4, 2, 8)):
        rc, out, err = run(capsys, "schedule", "export", "--schedule", name, "--pp", str(pp),
                           "--vpp", str(vpp), "-m", str(m), "--format", "csv")
        assert rc == 0, err
        expected = build_schedule(name, pp, vpp, m)
        assert from_csv(out, name=name) == expected
        rc, out, err = run(capsys, "schedule", "export", "--schedule", name, "--pp", str(pp),
                           "--vpp", str(vpp), "-m", str(m), "--format", "json")
        assert rc == 0, err
        assert from_json(out) == expected
        data = json.loads(out)
        assert data["summary"]["makespan"] > 0 and len(data["jobs"]) == 2 * m * vpp * pp


@needs("VPP")
def test_export_vpp_pp4_vpp4_m5_is_valid(capsys):
    rc, out, err = run(capsys, "schedule", "export", "--schedule", "VPP", "--pp", "4", "--vpp",
                       "4", "-m", "5", "--format", "csv")
    assert rc == 0, err
    schedule = from_csv(out)
    assert (schedule.pp, schedule.vpp, schedule.m) == (4, 4, 5)
    validate(schedule)


@needs("1F1B")
def test_export_lowered(capsys):
    import pipesplit.job_list.lower  # noqa: F401
    rc, out, err = run(capsys, "schedule", "export", "-s", "1F1B", "--pp", "4", "-m", "4",
                       "--lowered")
    assert rc == 0, err
    assert "SEND_F" in out and "RECV_B" in out
    lowered = from_csv(out)
    assert lowered.lowered
    validate(lowered)


def test_compare_all_registered(capsys):
    assert schedule_names()
    rc, out, err = run(capsys, "schedule", "compare", "--pp", "4", "--vpp", "2", "-m", "8")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("pp=4 vpp=2 m=8") and "lower bound" in lines[0]
    assert lines[1].split() == ["schedule", "makespan", "/", "lower", "bound", "bubble", "peak",
                                "memory"]
    table = {l.split()[0]: l for l in lines[3:] if not l.startswith("  ")}
    refused = {l.split(":")[0].strip() for l in lines if l.startswith("  ")}
    for name in schedule_names():
        assert name in table or name in refused, name
    for line in lines:
        if line.startswith("  "):
            assert "cannot serve this config" in line


@needs("1F1B", "VPP")
def test_compare_selected_with_comm(capsys):
    rc, out, err = run(capsys, "schedule", "compare", "--schedules", "1F1B,vpp", "--pp", "4",
                       "--vpp", "2", "-m", "8", "--cost", "1,2,1,1", "--comm", "0.1")
    assert rc == 0, err
    rows = [l.split() for l in out.splitlines()[3:]]
    assert [r[0] for r in rows] == ["1F1B", "VPP"]
    for row in rows:
        assert float(row[2]) >= 1.0  # never below the lower bound
        assert row[3].endswith("%")


@needs("1F1B")
def test_trace_and_plot_write_files(capsys, tmp_path):
    trace = tmp_path / "t.json"
    rc, out, err = run(capsys, "schedule", "trace", "-s", "1F1B", "--pp", "4", "-m", "4",
                       "-o", str(trace))
    assert rc == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["tid"] for e in events if e["ph"] == "X"} == {0, 1, 2, 3}
    assert len([e for e in events if e["ph"] == "X"]) == 32
    import matplotlib  # noqa: F401
    png = tmp_path / "t.png"
    rc, out, err = run(capsys, "schedule", "plot", "-s", "1F1B", "--pp", "4", "-m", "4",
                       "-o", str(png))
    assert rc == 0, err
    assert png.stat().st_size > 1000


@needs("1F1B")
def test_trace_to_stdout(capsys):
    rc, out, err = run(capsys, "schedule", "trace", "-s", "1F1B", "--pp", "2", "-m", "2")
    assert rc == 0
    assert json.loads(out)["traceEvents"]


def test_list(capsys):
    rc, out, err = run(capsys, "schedule", "list")
    assert rc == 0
    for name in schedule_names():
        assert name in out


BAD_ARGS = [
    ["schedule", "show", "--schedule", "NoSuchSchedule"],
    ["schedule", "show", "--schedule", "1F1B", "--pp", "0"],
    ["schedule", "show", "--schedule", "1F1B", "--pp", "x"],
    ["schedule", "show", "--schedule", "1F1B", "--cost", "1,x,1,1"],
    ["schedule", "show", "--schedule", "1F1B", "--cost", "1,2,3"],
    ["schedule", "show", "--schedule", "1F1B", "--comm", "-1"],
    ["schedule", "show", "--schedule", "1F1B", "--costs", "/nonexistent/costs.json"],
    ["schedule", "show", "--pp", "2"],
    ["schedule", "export", "--schedule", "1F1B", "--format", "xml"],
    ["schedule", "compare", "--schedules", "1F1B,Bogus"],
    ["schedule", "frobnicate"],
    ["schedule"],
    ["nonsense"],
    [],
]


@pytest.mark.parametrize("argv", BAD_ARGS, ids=[" ".join(a) or "empty" for a in BAD_ARGS])
def test_bad_arguments_give_one_line_error(capsys, argv):
    rc, out, err = run(capsys, *argv)
    assert rc != 0
    assert "Traceback" not in out + err
    if argv:  # no arguments at all prints the usage
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith("pipesplit: error: ")


def test_config_a_schedule_cannot_serve(capsys, monkeypatch):
    def picky(pp, vpp, m):
        """Picky: needs vpp == 2."""
        if vpp != 2:
            raise ValueError(f"vpp must be 2 for Picky, got {vpp}")
        return []

    with temporary_schedule("PickyTest", picky):
        rc, out, err = run(capsys, "schedule", "show", "-s", "PickyTest", "--pp", "2", "-m", "2")
        assert rc == 1
        assert err.strip() == "pipesplit: error: vpp must be 2 for Picky, got 1"
        rc, out, err = run(capsys, "schedule", "compare", "--schedules", "PickyTest", "--pp", "2")
        assert rc != 0
        assert "PickyTest: cannot serve this config: vpp must be 2 for Picky, got 1" in out


class temporary_schedule:
    """Register a generator for the duration of a ``with`` block, then remove it again."""

    def __init__(self, name, generator, **kwargs):
        self.name, self.generator, self.kwargs = name, generator, kwargs

    def __enter__(self):
        registry.register_schedule(self.name, **self.kwargs)(self.generator)

    def __exit__(self, *exc):
        registry._REGISTRY.pop(self.name, None)
        for key in [k for k, v in registry._LOOKUP.items() if v == self.name]:
            del registry._LOOKUP[key]


def test_costs_and_memory_limit_reach_only_generators_that_take_them(capsys):
    from pipesplit.job_list.ir import BACKWARD, FORWARD, Job

    seen = {}

    def gpipe(pp, vpp, m):
        """Plain: takes no options."""
        return [[Job(FORWARD, 0, b) for b in range(m)] + [Job(BACKWARD, 0, b) for b in range(m)]
                for _ in range(pp)]

    def tuned(pp, vpp, m, costs=None, memory_limit=None):
        """Tuned: takes costs and memory_limit."""
        seen.update(costs=costs, memory_limit=memory_limit)
        return gpipe(pp, vpp, m)

    assert accepts(tuned, "costs") and accepts(tuned, "memory_limit")
    assert not accepts(gpipe, "costs")
    assert accepts(lambda pp, vpp, m, **kw: None, "memory_limit")
    with temporary_schedule("PlainTest", gpipe), temporary_schedule("TunedTest", tuned):
        rc, out, err = run(capsys, "schedule", "show", "-s", "TunedTest", "--pp", "2", "-m", "2")
        assert rc == 0, err
        assert seen == {"costs": None, "memory_limit": None}  # nothing given, nothing passed
        rc, out, err = run(capsys, "schedule", "show", "-s", "TunedTest", "--pp", "2", "-m", "2",
                           "--cost", "1,2,1,1", "--memory-limit", "3")
        assert rc == 0, err
        assert seen["memory_limit"] == 3.0 and seen["costs"].backward == 2.0
        rc, out, err = run(capsys, "schedule", "show", "-s", "PlainTest", "--pp", "2", "-m", "2",
                           "--cost", "1,2,1,1", "--memory-limit", "3")
        assert rc == 0, err
        assert "does not take memory_limit" in err


def test_lazy_subcommands_dispatch(monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("pipesplit.tools.demo")
    fake.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "pipesplit.tools.demo", fake)
    assert main(["demo", "--schedule", "VPP", "-x"]) == 0
    assert calls == [["--schedule", "VPP", "-x"]]


def test_missing_lazy_subcommand_is_one_line(monkeypatch, capsys):
    import importlib

    real = importlib.import_module

    def fake_import(name, *args, **kwargs):
        if name == "pipesplit.tools.profile":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(cli.importlib, "import_module", fake_import)
    rc, out, err = run(capsys, "profile", "--whatever")
    assert rc == 2
    assert err.strip() == ("pipesplit: error: 'pipesplit profile' is not available "
                           "(pipesplit.tools.profile is not installed)")


@needs("1F1B")
def test_python_dash_m_and_no_paddle_import(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipesplit.tools.cli", "schedule", "show",
                           "--schedule", "1F1B", "--pp", "2", "-m", "2"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rank 1: 1F0 1B0 1F1 1B1" in proc.stdout and "makespan 9" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "pipesplit.tools.cli", "schedule", "show",
                          "--schedule", "Nope"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    code = ("import sys\nfrom pipesplit.tools.cli import main\n"
            "rc = main(['schedule', 'show', '--schedule', '1F1B', '--pp', '2', '-m', '2'])\n"
            "assert rc == 0\n"
            "assert not [m for m in sys.modules if m == 'paddle' or m.startswith('paddle.')], "
            "'schedule show imported paddle'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_bench_schedules_small_grid(tmp_path, capsys):
    from pipesplit.tools.bench import bench_schedules

    path = tmp_path / "bench.json"
    rc = bench_schedules.main(["--pp", "2", "--vpp", "1,2", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Best schedule per configuration" in out
    data = json.loads(path.read_text())
    rows = data["rows"]
    configs = {(r["pp"], r["vpp"], r["m"], r["cost"]) for r in rows}
    assert len(configs) == 2 * 5 * 3
    assert len(data["best"]) == len(configs) or not schedule_names()
    for r in rows:
        if "error" not in r:
            assert r["makespan"] >= r["lower_bound"] - 1e-9
    assert bench_schedules.closed_form(4, 1, 8, 1, 2) == 33
    assert bench_schedules.closed_form(4, 2, 8, 1, 2) == 57


@pytest.mark.slow
def test_bench_schedules_full_grid(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "pipesplit.tools.bench.bench_schedules", "--json", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wins:" in proc.stdout
    data = json.loads(out.read_text())
    configs = {(r["pp"], r["vpp"], r["m"], r["cost"]) for r in data["rows"]}
    assert len(configs) == 3 * 3 * 5 * 3
    for r in data["rows"]:
        if "error" not in r:
            assert r["makespan"] >= r["lower_bound"] - 1e-9

"""Bad input never crashes the process or trains silently wrong (issue 14).

Cases that reach Paddle run in child processes (``_bad_input_cases.py``, all in one process,
restarted after a case that dies), so a regression to a segfault fails its case instead of
killing the test run.  Each must end in a ``ValueError`` / ``TypeError`` whose first line names
the parameter and the constraint, with the input programs unchanged.  The schedule layer's
cases are pure Python and run here.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

from _bad_input_cases import CASES, EXPECTED
from pipesplit.job_list import Costs, build_schedule, views
from pipesplit.job_list.validate import ScheduleError, validate
from _paths import TESTS

HERE = os.path.join(str(TESTS), "helpers")
CHILD_TIMEOUT_S = 300


def run_children(names):
    """case -> result dict; a case whose child died gets ``{"died": returncode}``."""
    results, pending = {}, list(names)
    while pending:
        proc = subprocess.run([sys.executable, os.path.join(HERE, "_bad_input_cases.py"),
                               *pending], capture_output=True, text=True, cwd=HERE,
                              timeout=CHILD_TIMEOUT_S)
        started = None
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                started = line[len("START "):]
            elif line.startswith("{"):
                result = json.loads(line)
                results[result["case"]] = result
                started = None
        if started is not None:  # died inside this case: record it, go on after it
            results[started] = {"died": proc.returncode, "stderr": proc.stderr[-2000:]}
        elif proc.returncode != 0:
            raise AssertionError(f"case runner failed outside a case:\n{proc.stderr[-2000:]}")
        pending = [n for n in pending if n not in results]
    return results


@pytest.fixture(scope="module")
def child_results():
    return run_children(list(CASES))


def test_every_case_has_an_expectation():
    assert set(CASES) == set(EXPECTED)


@pytest.mark.parametrize("case", list(CASES))
def test_paddle_case(child_results, case):
    result = child_results[case]
    if "died" in result:
        code = result["died"]
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        pytest.fail(f"{case} killed the process ({how}):\n{result['stderr']}")
    kind, fragments = EXPECTED[case]
    assert result["type"] == kind, result
    for fragment in fragments:
        assert fragment in result["first_line"], result
    assert len(result["first_line"]) <= 300, result
    assert result["unchanged"], f"{case} modified its input program"


# --------------------------------------------------------------------------- pure Python

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("field,value", [
    ("forward", NAN), ("backward", INF), ("backward_b", [1.0, NAN]), ("backward_w", -INF),
    ("comm", NAN), ("comm", INF), ("w_memory", NAN), ("comm", True), ("forward", []),
])
def test_costs_are_finite_numbers(field, value):
    with pytest.raises(ValueError, match=rf"^costs\.{field} must be"):
        Costs(**{field: value})


def test_costs_from_dict_wants_a_dict():
    with pytest.raises(TypeError, match="^costs must be a dict"):
        Costs.from_dict([1, 2, 3])


@pytest.mark.parametrize("text,expect", [
    ("[1, 2]", "the top level must be a JSON object"),
    ('{"costs": null}', "'costs' must be a JSON object of cost fields, got null"),
    ('{"costs": [1]}', "'costs' must be a JSON object of cost fields, got a list"),
    ('{"forward": NaN, "backward_b": 1, "backward_w": 1}', "costs.forward must be finite"),
    ('{"costs": {"forward": 1, "backward_b": 1, "backward_w": Infinity}}',
     "costs.backward_w must be finite"),
    ('{"forward": "1", "backward_b": 1, "backward_w": 1}', "costs.forward must be finite"),
])
def test_cost_files_of_the_wrong_shape(tmp_path, text, expect):
    path = tmp_path / "costs.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        Costs.load(str(path))
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"cost file {path}") and expect in first


def test_simulate_checks_its_arguments():
    from pipesplit.job_list import simulate

    schedule = build_schedule("1F1B", 2, 1, 2)
    with pytest.raises(TypeError, match="^costs must be a Costs, got dict"):
        simulate(schedule, {"forward": 1})
    with pytest.raises(TypeError, match="^schedule must be a Schedule"):
        simulate("1F1B")


@pytest.mark.parametrize("limit", [NAN, INF])
def test_auto_memory_limit_is_finite(limit):
    with pytest.raises(ValueError, match="^memory_limit must be a finite number"):
        build_schedule("auto", 2, 1, 4, memory_limit=limit)


def test_fixed_schedules_refuse_memory_limit():
    with pytest.raises(TypeError, match="takes no option.*memory_limit"):
        build_schedule("1F1B", 4, 1, 8, memory_limit=1)


@pytest.mark.parametrize("text", ["", "\n", ",,\n"])
def test_empty_csv(text):
    with pytest.raises(ValueError, match="^CSV text has no jobs"):
        views.from_csv(text)


def test_csv_must_be_text():
    with pytest.raises(TypeError, match="^from_csv text must be a str"):
        views.from_csv(None)


def test_duplicated_job_names_its_rank_and_positions():
    schedule = views.from_csv("0F0,0F0,0B0\n1F0,1B0\n")
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    assert str(info.value).startswith("job 0F0 appears 2 times (rank 0 job #0, rank 0 job #1)")


@pytest.mark.parametrize("text,expect", [
    ("[]", "schedule JSON must be an object"),
    ("null", "schedule JSON must be an object"),
    ('{"pp": 1, "vpp": 1, "m": 1, "ranks": 5}', "schedule JSON 'ranks' must be a list"),
    ('{"pp": 1, "vpp": 1, "m": 1, "ranks": [[0]]}', "schedule JSON 'ranks' must be a list"),
    ('{"pp": 1, "vpp": 1, "m": 1, "ranks": [["0F0", "0B0"]], "options": 5}',
     "schedule JSON 'options' must be an object"),
])
def test_bad_schedule_json(text, expect):
    with pytest.raises(ValueError, match="^" + expect.replace("[", r"\[")):
        views.from_json(text)


def test_simulated_costs_stay_finite_through_the_cli(tmp_path, capsys):
    from pipesplit.tools.cli import main

    bad = tmp_path / "costs.json"
    bad.write_text('{"forward": 1, "backward_b": 1, "backward_w": 1, "comm": NaN}')
    assert main(["schedule", "show", "--schedule", "1F1B", "--pp", "2", "-m", "2",
                 "--costs", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "costs.comm must be a finite number" in err and "Traceback" not in err
    assert main(["schedule", "show", "--schedule", "auto", "--pp", "2", "-m", "2",
                 "--memory-limit", "inf"]) != 0
    err = capsys.readouterr().err
    assert "memory_limit must be a finite number" in err and "Traceback" not in err

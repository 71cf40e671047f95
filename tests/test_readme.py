"""README's examples are what the commands print now: every ``$ pipesplit schedule ...`` and
``$ pipesplit demo`` (without ``--profile``, whose numbers are measured times) shown in README is
run and its output compared with the block, line for line; README's Python blocks that are
whole programs run as they are."""
import shlex
import shutil
from pathlib import Path

import pytest

from pipesplit.tools.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
#: commands whose output is shown verbatim (the others print measured times)
VERBATIM = ("pipesplit schedule ", "pipesplit demo")
#: Python blocks that are whole programs, by their first line
PROGRAMS = ("from pipesplit.job_list import build_schedule", "import pipesplit.passes as pipesplit")


def _blocks(language=""):
    """The text of README's fenced blocks opened with ```` ```language ````."""
    blocks, current = [], None
    for line in README.read_text().splitlines():
        if current is None and line.startswith("```"):
            current = [] if line[3:].strip() == language else False
        elif current is not None and line.startswith("```"):
            if current is not False:
                blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None and current is not False:
            current.append(line)
    return blocks


def shown_commands():
    """(command, printed output) for every ``$ `` line of README's unlabelled blocks."""
    found = []
    for block in _blocks():
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                i += 1
                continue
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            i += 1
            output = []
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            while output and not output[-1].strip():
                output.pop()
            found.append((" ".join(command.split()), "\n".join(output)))
    return found


VERBATIM_COMMANDS = [(c, o) for c, o in shown_commands()
                     if c.startswith(VERBATIM) and "--profile" not in c]


def test_readme_shows_the_schedule_commands():
    names = [c for c, _ in VERBATIM_COMMANDS]
    assert sum(c.startswith("pipesplit schedule ") for c in names) >= 7, names
    assert "pipesplit demo" in names


@pytest.mark.parametrize("command,expected", VERBATIM_COMMANDS, ids=[c for c, _ in VERBATIM_COMMANDS])
def test_readme_output_is_what_the_command_prints(command, expected, tmp_path, monkeypatch,
                                                  capsys):
    monkeypatch.chdir(tmp_path)  # trace / plot write their files here
    if "tests/data/" in command:  # shown as run from the clone's root: its cost files
        shutil.copytree(README.parent / "tests" / "data", tmp_path / "tests" / "data")
    assert main(shlex.split(command)[1:]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    assert out.splitlines() == expected.splitlines()


@pytest.mark.parametrize("first_line", PROGRAMS)
def test_readme_python_programs_run(first_line, tmp_path, monkeypatch):
    blocks = [b for b in _blocks("python") if b.startswith(first_line)]
    assert len(blocks) == 1, first_line
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], f"README.md: {first_line}", "exec"), {"__name__": "readme"})

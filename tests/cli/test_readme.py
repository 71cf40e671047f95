"""The documentation's examples are what the commands print now.

Every markdown page of the documentation -- README.md and docs/*.md -- is read.  Every
``$ pipesplit schedule ...`` and ``$ pipesplit demo`` shown in a page's unlabelled fenced blocks
(without ``--profile``, whose numbers are measured times) is run and its output compared with
the block, line for line; the Python blocks that are whole programs run as they are.  Test ids
name the page and the command.

How outputs are compared (``output_difference``): the same number of lines; each line is cut
into numbers and the text around them.

* Text is compared exactly (spaces and punctuation included), and both lines must hold the
  same count of numbers.
* Two integers (written without point or exponent) must be equal.
* Other numbers a, b are equal when |a - b| <= max(ABS_TOL, REL_TOL * max(|a|, |b|)), with
  REL_TOL = ABS_TOL = 1e-6: an fp32 loss may differ in its last printed digit between machines
  of the same kind (``3.9600377`` / ``3.9600378``).
* Numbers that are both below FLOOR = 1e-5 in magnitude are equal: such values are themselves
  differences of two runs (the ``max |diff|`` columns), rounding noise that reads ``2.38e-07``
  on one machine and ``0.00e+00`` on another.
"""
import re
import shlex
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from pipesplit.tools.cli import main
from _paths import REPO

ROOT = REPO
README = ROOT / "README.md"
#: every page whose examples are tested: README first, then docs/ by name
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
#: commands whose output is shown verbatim (the others print measured times)
VERBATIM = ("pipesplit schedule ", "pipesplit demo")
#: Python blocks that are whole programs, by their first line
PROGRAMS = ("from pipesplit.job_list import build_schedule", "import pipesplit.passes as pipesplit")

REL_TOL = 1e-6
ABS_TOL = 1e-6
FLOOR = 1e-5
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_INTEGER = re.compile(r"[-+]?\d+")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _tokens(line: str) -> Tuple[List[str], List[str]]:
    """(text parts, numbers) of one line; text parts are one more than numbers."""
    text, numbers, pos = [], [], 0
    for match in _NUMBER.finditer(line):
        text.append(line[pos:match.start()])
        numbers.append(match.group())
        pos = match.end()
    text.append(line[pos:])
    return text, numbers


def same_number(a: str, b: str) -> bool:
    """Two numbers as printed, equal under the module's tolerance (see its docstring)."""
    if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
        return int(a) == int(b)
    x, y = float(a), float(b)
    if abs(x) < FLOOR and abs(y) < FLOOR:
        return True
    return abs(x - y) <= max(ABS_TOL, REL_TOL * max(abs(x), abs(y)))


def line_difference(got: str, expected: str) -> Optional[str]:
    """None when the two lines are the same under the tolerance, else what differs."""
    got_text, got_numbers = _tokens(got)
    expected_text, expected_numbers = _tokens(expected)
    if got_text != expected_text:
        return "the text differs"
    for a, b in zip(got_numbers, expected_numbers):
        if not same_number(a, b):
            return f"{a} differs from {b} beyond the tolerance"
    return None


def output_difference(got: str, expected: str) -> Optional[str]:
    """None when ``got`` is ``expected`` under the tolerance, else the first difference."""
    got_lines, expected_lines = got.splitlines(), expected.splitlines()
    for i, (g, e) in enumerate(zip(got_lines, expected_lines), 1):
        why = line_difference(g, e)
        if why:
            return f"line {i}: {why}\n  printed: {g!r}\n  shown:   {e!r}"
    if len(got_lines) != len(expected_lines):
        return f"{len(got_lines)} lines printed, {len(expected_lines)} shown"
    return None


def _blocks(page: Path, language=""):
    """The text of a page's fenced blocks opened with ```` ```language ````."""
    blocks, current = [], None
    for line in page.read_text().splitlines():
        if current is None and line.startswith("```"):
            current = [] if line[3:].strip() == language else False
        elif current is not None and line.startswith("```"):
            if current is not False:
                blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None and current is not False:
            current.append(line)
    return blocks


def shown_commands(page: Path):
    """(command, printed output) for every ``$ `` line of a page's unlabelled blocks."""
    found = []
    for block in _blocks(page):
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


#: (page, command, shown output) of every command whose output is shown verbatim
VERBATIM_COMMANDS = [(_name(page), c, o) for page in PAGES for c, o in shown_commands(page)
                     if c.startswith(VERBATIM) and "--profile" not in c]


def test_the_pages_show_the_schedule_commands():
    names = [c for _, c, _ in VERBATIM_COMMANDS]
    assert sum(c.startswith("pipesplit schedule ") for c in names) >= 8, names
    in_readme = [c for page, c, _ in VERBATIM_COMMANDS if page == "README.md"]
    assert "pipesplit demo" in in_readme
    assert any(c.startswith("pipesplit schedule show ") for c in in_readme), in_readme
    assert {"docs/schedules.md", "docs/measurements.md"} <= {p for p, _, _ in VERBATIM_COMMANDS}


@pytest.mark.parametrize("page,command,expected", VERBATIM_COMMANDS,
                         ids=[f"{p}: {c}" for p, c, _ in VERBATIM_COMMANDS])
def test_readme_output_is_what_the_command_prints(page, command, expected, tmp_path, monkeypatch,
                                                  capsys):
    monkeypatch.chdir(tmp_path)  # trace / plot write their files here
    if "tests/data/" in command:  # shown as run from the clone's root: its cost files
        shutil.copytree(ROOT / "tests" / "data", tmp_path / "tests" / "data")
    assert main(shlex.split(command)[1:]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    difference = output_difference(out, expected)
    assert difference is None, f"{page}: {command}\n{difference}"


def _programs(first_line):
    """(page, block) of every Python block that starts with ``first_line``: one is expected."""
    return [(page, b) for page in PAGES for b in _blocks(page, "python") if b.startswith(first_line)]


@pytest.mark.parametrize("first_line", PROGRAMS, ids=[
    f"{'+'.join(_name(p) for p, _ in _programs(f)) or 'nowhere'}: {f}" for f in PROGRAMS])
def test_readme_python_programs_run(first_line, tmp_path, monkeypatch):
    found = _programs(first_line)
    assert len(found) == 1, (first_line, [_name(p) for p, _ in found])
    page, block = found[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"{_name(page)}: {first_line}", "exec"), {"__name__": "readme"})


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = heading.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=[_name(p) for p in PAGES])
def test_links_between_the_pages_resolve(page):
    text = page.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{_name(page)}: broken links {broken}"


def test_the_comparer_allows_rounding_and_nothing_else():
    shown = "   1         3.9600378        3.9600377           2.38e-07"
    assert output_difference("   1         3.9600377        3.9600377           0.00e+00",
                             shown) is None  # last fp32 digit; a difference below the floor
    assert same_number("3.9600377", "3.9600378")
    assert same_number("2.38e-07", "0.00e+00") and same_number("-4.0e-06", "9.5e-06")
    assert not same_number("3.96", "3.97")
    assert not same_number("21", "22") and not same_number("2.0e-05", "0.00e+00")
    assert output_difference("makespan 21  bubble 14.3%", "makespan 21  bubble 14.3%") is None
    assert "text" in output_difference("makespan 21  bubbles 14.3%", "makespan 21  bubble 14.3%")
    assert "3.97" in output_difference("loss 3.97", "loss 3.96")
    assert "text" in output_difference("rank 0 |0F0 1F0", "rank 0 |0F0 1B0")
    assert "lines" in output_difference("a\nb", "a\nb\nc")

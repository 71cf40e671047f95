"""Run pipesplit's tests against one PaddlePaddle release, in a virtual environment of its own.

    python tools/check_paddle_release.py 3.2.2                  # the CI subset (as .ci/run)
    python tools/check_paddle_release.py 3.1.1 --full           # the whole suite
    python tools/check_paddle_release.py 3.3.0 --tests tests/engine/test_strategy.py
    python tools/check_paddle_release.py 3.4.0 --untested       # a release not yet supported
    python tools/check_paddle_release.py 3.2.2 --prepare        # only make the environment

The environment (``--venv``, default ``/tmp/pipesplit-paddle-VERSION``) gets
``paddlepaddle==VERSION``, the other pins of ``requirements.txt`` (and protobuf 6 for the
releases that need it, ``NEEDS_PROTOBUF_LABEL``) and, where its trainer runs (the releases
``passes/_paddle.py`` lists in ``PADDLEFORMERS_RELEASES``), PaddleFormers from
``requirements-nodeps.txt`` (``--no-deps``, as README installs it), then this checkout
(``pip install .``).  An environment already there with that release is reused, the same
installs run in it again (``--fresh`` makes it anew).  The tests run from the checkout's root, as README and ``.ci/run`` run them;
the last line says the release, the part run and pytest's counts (passed / skipped / failed),
and the exit status is pytest's (3: the environment could not be made).

The supported releases are read from ``passes/_paddle.py`` (the one gate, read as a file: no
Paddle is needed here).  A release it does not list is refused before anything is made, unless
``--untested`` is given: the tests then run with ``PIPESPLIT_UNTESTED_PADDLE=VERSION``, which
lets exactly that release through the gate (with a warning); every Paddle name pipesplit
patches is still checked by the door, so what a new release lacks is named.

Standard library only.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]

#: what .ci/run runs on each release beside the pinned one: the tests of the Paddle internals
#: pipesplit relies on (the gate, the patched names, the passes, the strategy and its checks,
#: misconfigured pipelines through the engine), one engine launch with a V schedule (ZBV then
#: 1F1B models trained in turn by one process pair, each equal to its reference) and one on a
#: hybrid mesh (dp2 x pp2, ZBV, two launchers joined as two nodes)
CI_SUBSET = (
    "tests/engine/test_paddle_releases.py",
    "tests/engine/test_paddle_patches.py",
    "tests/builders/test_passes.py",
    "tests/engine/test_strategy.py",
    "tests/engine/test_strategy_checks.py",
    "tests/multiprocess/test_engine_bad_input.py",
    "tests/multiprocess/test_several_models.py",
    "tests/multiprocess/test_user_conventions.py::test_two_launchers_joined_as_two_nodes",
)

_VERSION = re.compile(r"^\d+\.\d+\.\d+((a|b|rc)\d+|\.post\d+)?$")
_COUNT = re.compile(r"(\d+) (passed|skipped|failed|errors?|xfailed|xpassed|deselected)\b")


def _gate():
    """``passes/_paddle.py`` as a module of its own (it imports Paddle only when called)."""
    spec = importlib.util.spec_from_file_location("paddle_release_gate",
                                                  REPO / "passes" / "_paddle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    gate = _gate()
    parser = argparse.ArgumentParser(
        prog="check_paddle_release.py",
        description="Run pipesplit's tests against one PaddlePaddle release in a virtual "
                    f"environment of its own (supported: {gate.supported_text()}).")
    parser.add_argument("version", help="the PaddlePaddle release, e.g. 3.2.2")
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--ci-subset", action="store_true",
                      help="the tests .ci/run runs on each release beside the pinned one "
                           "(the default)")
    part.add_argument("--full", action="store_true", help="the whole suite (tests/)")
    part.add_argument("--tests", nargs="+", metavar="PATH",
                      help="these test files, folders or node ids")
    part.add_argument("--prepare", action="store_true",
                      help="make the environment and stop (a later run reuses it)")
    parser.add_argument("-k", dest="keyword", help="pytest's -k expression")
    parser.add_argument("-m", dest="markers", help="pytest's -m expression (e.g. 'not slow')")
    parser.add_argument("--venv", type=Path,
                        help="the virtual environment (default /tmp/pipesplit-paddle-VERSION)")
    parser.add_argument("--fresh", action="store_true",
                        help="make the environment again even if it is there")
    parser.add_argument("--untested", action="store_true",
                        help="run on a release passes/_paddle.py does not list, the gate opened "
                             "for it alone (PIPESPLIT_UNTESTED_PADDLE)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that makes the environment")
    args = parser.parse_args(argv)
    if not _VERSION.match(args.version):
        parser.error(f"{args.version!r} is not a PaddlePaddle release number (MAJOR.MINOR.PATCH, "
                     "e.g. 3.2.2)")
    if args.version not in gate.SUPPORTED_PADDLE_VERSIONS and not args.untested:
        parser.error(f"PaddlePaddle {args.version} is not a release pipesplit supports "
                     f"({', '.join(gate.SUPPORTED_PADDLE_VERSIONS)}; passes/_paddle.py); to try "
                     "it with the gate opened for it, add --untested")
    if args.tests:
        missing = [t for t in args.tests if not (REPO / t.split("::")[0]).exists()]
        if missing:
            parser.error(f"no such test path in {REPO}: {', '.join(missing)}")
    if args.venv is None:
        args.venv = Path("/tmp") / f"pipesplit-paddle-{args.version}"
    args.gate = gate
    args.with_paddleformers = args.version in gate.PADDLEFORMERS_RELEASES
    return args


def selected_tests(args: argparse.Namespace) -> List[str]:
    if args.full:
        return ["tests"]
    if args.tests:
        return list(args.tests)
    return list(CI_SUBSET)


def _pinned(name: str) -> List[str]:
    """The requirement lines of ``name`` (comments and blank lines left out)."""
    lines = (REPO / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def install_commands(args: argparse.Namespace) -> List[List[str]]:
    """The commands that fill the environment (after ``python -m venv``)."""
    pip = [str(args.venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    others = [r for r in _pinned("requirements.txt") if not r.startswith("paddlepaddle")]
    if args.version in args.gate.NEEDS_PROTOBUF_LABEL:
        others.append(args.gate.PROTOBUF_PIN)
    commands = [pip + [f"paddlepaddle=={args.version}", *others]]
    if args.with_paddleformers:
        commands.append(pip + ["--no-deps", "-r", str(REPO / "requirements-nodeps.txt")])
    commands.append(pip + [str(REPO)])
    return commands


def _installed_paddle(venv: Path) -> Optional[str]:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                            "print(m.version('paddlepaddle'))"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def make_environment(args: argparse.Namespace) -> None:
    """The environment with the release and this checkout (a ``RuntimeError`` if pip fails)."""
    if args.fresh or _installed_paddle(args.venv) != args.version:
        print(f"making {args.venv} with paddlepaddle=={args.version}", flush=True)
        subprocess.run([args.python, "-m", "venv", "--clear", str(args.venv)], check=True)
    else:  # (pip leaves what is there; the pins and this checkout are installed again)
        print(f"reusing {args.venv} (paddlepaddle=={args.version})", flush=True)
    for command in install_commands(args):
        done = subprocess.run(command, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode})")


def counts(text: str) -> dict:
    """pytest's counts from its last summary line: {"passed": n, "skipped": n, ...}."""
    summary = [line for line in text.splitlines() if _COUNT.search(line)]
    found = {}
    if summary:
        for number, word in _COUNT.findall(summary[-1]):
            found["errors" if word.startswith("error") else word] = int(number)
    return found


def run_tests(args: argparse.Namespace) -> tuple:
    """(pytest's exit status, its output), printed as it comes."""
    command = [str(args.venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
               *selected_tests(args)]
    if args.keyword:
        command += ["-k", args.keyword]
    if args.markers:
        command += ["-m", args.markers]
    env = {**os.environ, "VIRTUAL_ENV": str(args.venv),
           "PATH": f"{args.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    if args.untested:
        env["PIPESPLIT_UNTESTED_PADDLE"] = args.version
    lines = []
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
    sys.stdout.flush()
    return proc.returncode, "".join(lines)


def summary(args: argparse.Namespace, found: dict, seconds: float, status: int) -> str:
    part = "full suite" if args.full else ("tests " + " ".join(args.tests) if args.tests
                                           else "CI subset")
    if args.keyword:
        part += f" -k {args.keyword!r}"
    if args.markers:
        part += f" -m {args.markers!r}"
    shown = ", ".join(f"{found.get(w, 0)} {w}" for w in ("passed", "skipped", "failed"))
    extra = ", ".join(f"{n} {w}" for w, n in found.items() if w not in ("passed", "skipped",
                                                                      "failed"))
    return (f"paddlepaddle=={args.version}: {part}: {shown}{', ' + extra if extra else ''} "
            f"in {seconds:.0f} s (pytest exit {status}; environment {args.venv})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    try:
        make_environment(args)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(f"paddlepaddle=={args.version}: the environment could not be made: {error}",
              file=sys.stderr)
        return 3
    if args.prepare:
        print(f"paddlepaddle=={args.version}: environment {args.venv} ready in "
              f"{time.monotonic() - start:.0f} s")
        return 0
    tests_start = time.monotonic()
    status, output = run_tests(args)
    now = time.monotonic()
    print(f"(environment {tests_start - start:.0f} s, tests {now - tests_start:.0f} s)")
    print(summary(args, counts(output), now - start, status))
    return status


if __name__ == "__main__":
    sys.exit(main())

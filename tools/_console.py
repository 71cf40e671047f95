"""What every command does for its console: quiet Paddle, one-line errors, progress on stderr,
output paths checked before the work starts, a quiet exit when the reader of stdout goes away."""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import sys
import time
import warnings
from typing import Callable, Iterator, Optional, Sequence, TextIO

#: grid width when stdout is not a terminal (pipes, files, README blocks)
DEFAULT_WIDTH = 160


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, except the ones that mean "not given"."""

    def _get_help_string(self, action):
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def quiet_paddle() -> None:
    """Keep Paddle's C++ info logs and its import / PIR warnings out of the command's output
    (call before importing paddle; ``GLOG_minloglevel`` set by the user wins)."""
    os.environ.setdefault("GLOG_minloglevel", "2")
    warnings.filterwarnings("ignore", message="No ccache found")
    # (3.3's wording, then 3.1's and 3.2's)
    warnings.filterwarnings("ignore", message="(Tensor|Value) do not have 'place'")


def run_reporting_errors(command: str, body: Callable[[], int]) -> int:
    """``body()``, with a ValueError / TypeError turned into one line on stderr and exit code 2
    (``PIPESPLIT_DEBUG=1`` shows the traceback instead), and a closed stdout pipe into a quiet
    exit (see :func:`exit_quietly_on_closed_pipe`)."""
    try:
        with exit_quietly_on_closed_pipe():
            return body()
    except (ValueError, TypeError) as exc:
        if os.environ.get("PIPESPLIT_DEBUG") == "1":
            raise
        print(f"{command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def exit_quietly_on_closed_pipe() -> Iterator[None]:
    """``pipesplit ... | head`` closes stdout early: stop without a traceback or an error line.
    stdout is pointed at devnull so the interpreter's final flush does not fail again."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(0) from None


def grid_width(width: Optional[int] = None) -> int:
    """``width`` if given, else the terminal's width when stdout is a terminal, else
    :data:`DEFAULT_WIDTH`."""
    if width is not None:
        return width
    if sys.stdout.isatty():
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return DEFAULT_WIDTH


def prepare_output(path: Optional[str], option: str) -> Optional[str]:
    """Create the parent folders of an output file before the work starts, so a long run does
    not fail at its end; a path that cannot be written is a ValueError naming ``option``."""
    if path in (None, "", "-"):
        return path
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot create folder {parent}: "
                         f"{exc.strerror or exc}") from None
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a folder, expected a file path")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{option} {path}: folder {parent} is not writable")
    return path


class Progress:
    """Progress of long work on stderr: one line per item (``[3/12] ZBH1 ...``) and the elapsed
    time.  Silent with ``quiet`` or when stderr is not a terminal (logs, pipes, tests), so the
    command's stdout is the same either way."""

    def __init__(self, what: str, total: Optional[int] = None, quiet: bool = False,
                 stream: Optional[TextIO] = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _is_terminal(self.stream)
        self.what, self.total, self.done = what, total, 0
        self.started = time.monotonic()

    def step(self, item: str) -> None:
        """Say that ``item`` is starting (or done, for work finishing out of order)."""
        self.done += 1
        if self.enabled:
            count = f"{self.done}/{self.total}" if self.total else str(self.done)
            print(f"{self.what} [{count}] {item}  ({time.monotonic() - self.started:.0f} s)",
                  file=self.stream, flush=True)

    def note(self, text: str) -> None:
        if self.enabled:
            print(f"{self.what}: {text}", file=self.stream, flush=True)

    def log(self, text: str) -> None:
        """A ``log=`` callback for library functions that report per-item lines."""
        self.step(text.strip())


def write_json(path: str, data) -> None:
    """Write a benchmark's result as indented JSON (numpy scalars as floats) and say so."""
    import json

    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=float)
    print(f"wrote {path}")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def add_quiet_option(parser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (they are shown only on a terminal)")


def quiet_pipe_main(main: Callable[..., int]) -> Callable[..., int]:
    """Decorator for a ``main(argv)``: a closed stdout pipe ends it quietly with status 0."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        with exit_quietly_on_closed_pipe():
            return main(*args, **kwargs)
    return wrapped


def checked_args(tool: str, argv: Sequence[str], parser: argparse.ArgumentParser,
                 check: Callable[[argparse.Namespace], None]) -> Optional[argparse.Namespace]:
    """A benchmark's ``argv`` parsed and ``check``ed; None where a value is refused, the
    ``ValueError`` printed as ``tool``'s usage error (the caller exits 2)."""
    args = parser.parse_args(argv)
    try:
        check(args)
    except ValueError as exc:
        print(f"{tool}: error: {exc}", file=sys.stderr)
        return None
    return args

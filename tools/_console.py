"""What every Paddle-side command does for its console: quiet Paddle, one-line errors."""
from __future__ import annotations

import os
import sys
import warnings
from typing import Callable


def quiet_paddle() -> None:
    """Keep Paddle's C++ info logs and its import / PIR warnings out of the command's output
    (call before importing paddle; ``GLOG_minloglevel`` set by the user wins)."""
    os.environ.setdefault("GLOG_minloglevel", "2")
    warnings.filterwarnings("ignore", message="No ccache found")
    warnings.filterwarnings("ignore", message="Tensor do not have 'place'")


def run_reporting_errors(command: str, body: Callable[[], int]) -> int:
    """``body()``, with a ValueError / TypeError turned into one line on stderr and exit code 2
    (``PIPESPLIT_DEBUG=1`` shows the traceback instead)."""
    try:
        return body()
    except (ValueError, TypeError) as exc:
        if os.environ.get("PIPESPLIT_DEBUG") == "1":
            raise
        print(f"{command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2

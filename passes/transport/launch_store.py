"""The launcher's TCP store, which every process of a job reaches: the one place pipesplit's
exchanges (transfer shapes, lockstep gathers, measured costs) take their keys from.

Each exchange needs a key no earlier exchange used and every process agrees on.  Every process
runs the same exchanges in the same order (the pass is called the same number of times on each,
the measured step is the same), so a process's own count of its exchanges of one ``purpose``
is that key; the count lives in the store (one counter per purpose and process), not in
pipesplit's modules.
"""
from __future__ import annotations


def launch_store():
    """The launcher's TCP store (Paddle creates it once per process)."""
    from paddle.base import core

    return core.create_or_get_global_tcp_store()


def next_round(purpose: str, rank: int, store=None) -> int:
    """This process's next exchange number for ``purpose`` (0, 1, 2 ...): the same on every
    process at the same exchange."""
    store = store if store is not None else launch_store()
    return int(store.add(f"pipesplit/rounds/{purpose}/{rank}", 1)) - 1


def round_key(purpose: str, rank: int, store=None) -> str:
    """A fresh key for the next exchange of ``purpose``: ``pipesplit/<purpose>/<round>``."""
    return f"pipesplit/{purpose}/{next_round(purpose, rank, store)}"

"""All processes of a launch at one point, and a value of each on every process, through the
launcher's TCP store (:mod:`.launch_store`), within a bound of pipesplit's own.

:func:`share` gives every process's value to every process, once all have given theirs;
:func:`rendezvous` waits until all processes arrive at a key, polling
(``$PIPESPLIT_REPLAN_TIMEOUT_S`` bounds the wait): the set-up, exchange and search of one
process can then never run a peer into gloo's 30-second transfer timeout.  A measured re-plan
(:class:`pipesplit.passes.engine.replanning.Measurement`) meets its processes here, through
its engine's :class:`~pipesplit.passes.transport.base.Transport`.
"""
from __future__ import annotations

import json
from typing import List, Optional

from pipesplit.passes.transport.launch_store import launch_store


def share(measurement: dict, key: str, store=None) -> List[dict]:
    """Every process's ``measurement`` (this one's included), in process order, through the
    launcher's TCP store under ``key`` (unique per exchange; each process's value is JSON),
    once all have given theirs (:func:`rendezvous`: a slow process is named, not a hang)."""
    import paddle.distributed as dist

    store = store if store is not None else launch_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    store.set(f"{key}/{rank}", json.dumps(measurement, sort_keys=True).encode())
    rendezvous(f"{key}/given", "the exchange of the measured costs", rank, world, store)
    return [measurement if r == rank else json.loads(bytes(store.get(f"{key}/{r}")).decode())
            for r in range(world)]


#: how long (seconds) each process waits at a re-plan's rendezvous for the others; a CPU user
#: sets it in the environment (gloo's own transfer timeout, about 30 s, cannot be set)
TIMEOUT_ENV = "PIPESPLIT_REPLAN_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
_POLL_S = 0.01


def rendezvous_timeout() -> float:
    """The rendezvous bound: ``$PIPESPLIT_REPLAN_TIMEOUT_S`` or :data:`DEFAULT_TIMEOUT_S`."""
    import os

    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return value


def rendezvous(key: str, phase: str, rank: int, world: int, store=None,
               timeout_s: Optional[float] = None) -> float:
    """Wait until all ``world`` processes have reached ``key`` (one arrival counter per process
    in the launcher's TCP store, polled: nothing blocks past the bound).  Returns the seconds
    this process waited.  A process missing after ``timeout_s`` (default
    :func:`rendezvous_timeout`) is a ``RuntimeError`` naming it and ``phase``, on every process
    that waited; pipesplit's own work (profiling, the exchange, the search) then never leaves a
    peer in a gloo transfer that times out after 30 s."""
    import time

    store = store if store is not None else launch_store()
    bound = rendezvous_timeout() if timeout_s is None else timeout_s
    store.add(f"{key}/{rank}", 1)
    started = time.monotonic()
    waiting = [r for r in range(world) if r != rank]
    while waiting:
        waiting = [r for r in waiting if store.add(f"{key}/{r}", 0) == 0]
        if not waiting:
            break
        if time.monotonic() - started > bound:
            raise RuntimeError(
                f"pipesplit: rank {rank} waited {bound:g} s at the rendezvous before {phase}; "
                f"rank(s) {waiting} of {world} did not arrive (they are slower, stopped or "
                f"failed: see their logs; {TIMEOUT_ENV} sets the bound)")
        time.sleep(_POLL_S)
    return time.monotonic() - started

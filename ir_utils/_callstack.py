"""Skip the Python call stack Paddle records for every op created from Python.

Paddle 3.3.1 calls ``traceback.extract_stack()`` each time Python creates a PIR op, to attach
the creation site to the op for error messages.  For the few hundred ops a pass adds
(accumulators, decomposed grads, p2p) that is a quarter of the pass time, and the frames would
point into pipesplit anyway.  ``FLAGS_call_stack_level`` does not turn it off, so the function is
swapped out while our surgery runs.
"""
from __future__ import annotations

import contextlib
import traceback


def _empty_stack(*args, **kwargs):
    return traceback.StackSummary()


@contextlib.contextmanager
def without_op_callstacks():
    """Within the block, ops created from Python carry no creation call stack."""
    original = traceback.extract_stack
    traceback.extract_stack = _empty_stack
    try:
        yield
    finally:
        traceback.extract_stack = original

"""The measuring core of profiling: allocator statistics, a serial executor, runs behind the
executor's garbage collector, timed plan runs.

:mod:`pipesplit.passes.measure.profile` builds on these to measure per-job costs and whole steps.

Allocator statistics: ``host_memory_stat_*("Allocated", 0)`` on CPU, ``device_memory_stat_*``
on GPU (process RSS hides the allocator's caching).

Memory figures are repeatable (the same bytes in every run, however busy the machine): the
executor runs serially while measuring (:func:`serial_executor`), live bytes are read once its
garbage-collector thread has caught up (:meth:`MemoryStats.settled_current`), and a step whose
peak is measured runs behind that thread (:func:`run_behind_gc`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import statistics
import sys
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

import paddle
from paddle.base import core

from .runner import as_tensor, make_plan

T = TypeVar("T")
#: how :meth:`MemoryStats.settled_current` waits for the executor's GC thread: the live bytes
#: must stay unchanged, with no other thread runnable, for SETTLE_POLLS polls SETTLE_POLL_S
#: apart; other threads busy for SETTLE_TIMEOUT_S seconds is an error
SETTLE_POLL_S = 0.002
SETTLE_POLLS = 10
SETTLE_TIMEOUT_S = 30.0
#: whole-step runs whose smallest allocator peak is a schedule's measured peak (the GC thread
#: lagging behind only ever raises a peak, so the minimum is the repeatable value)
PEAK_RUNS = 3


# --------------------------------------------------------------------------- allocator stats

class MemoryStats:
    """Current / peak allocated bytes of Paddle's allocator for ``place`` (host or device)."""

    def __init__(self, place=None):
        self.place = place if place is not None else paddle.CPUPlace()
        if isinstance(self.place, paddle.CPUPlace):
            self.device_id = 0
            self._cur = core.host_memory_stat_current_value
            self._peak = core.host_memory_stat_peak_value
            self._reset = core.host_memory_stat_reset_peak_value
        else:
            self.device_id = self.place.get_device_id()
            self._cur = core.device_memory_stat_current_value
            self._peak = core.device_memory_stat_peak_value
            self._reset = core.device_memory_stat_reset_peak_value

    def current(self) -> int:
        return int(self._cur("Allocated", self.device_id))

    def peak(self) -> int:
        return int(self._peak("Allocated", self.device_id))

    def reset_peak(self) -> None:
        self._reset("Allocated", self.device_id)

    def settled_current(self, poll_s: float = SETTLE_POLL_S, polls: int = SETTLE_POLLS,
                        timeout_s: float = SETTLE_TIMEOUT_S) -> int:
        """:meth:`current` once the executor's garbage collector has caught up.

        On CPU Paddle's executor frees dead tensors on a garbage-collector thread of its own
        (the interpreter's event GC), so right after ``run`` returns some frees may still be
        queued, more of them the busier the machine.  Every allocation of the run is done by
        then, so the value is read once the live bytes have not changed for ``polls``
        consecutive polls while no other thread of the process was runnable (a GC thread with
        frees queued is runnable even while the machine's load keeps it off the CPU, which a
        fixed quiet period alone cannot tell from a finished one).  Raises ``RuntimeError``
        naming the threads when they stay busy for ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        last, quiet = self.current(), 0
        while True:
            time.sleep(poll_s)
            busy = _busy_threads()
            now = self.current()
            quiet = quiet + 1 if not busy and now == last else 0
            if quiet >= polls:
                return now
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"memory measurement: threads {busy} of this process stayed runnable for "
                    f"{timeout_s} s after an executor run, so the executor's garbage collector "
                    "cannot be seen to have caught up; measure memory in a process that runs "
                    "nothing else meanwhile")
            last = now


def _busy_threads() -> List[int]:
    """Threads of this process, other than the calling one, that are runnable or in an
    uninterruptible wait (``/proc`` state R or D)."""
    own = threading.get_native_id()
    busy = []
    for tid in _threads():
        if tid == own:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        if state in (b"R", b"D"):
            busy.append(tid)
    return busy


@contextlib.contextmanager
def serial_executor(enabled: bool = True):
    """Run Paddle's executor on one thread, ops in program order, while measuring memory: the
    order in which a job's ops allocate and free is then the program's, the same every run.
    (What still varies is how far the GC thread lags behind; see
    :meth:`MemoryStats.settled_current` and :data:`PEAK_RUNS`.)"""
    flags = ("FLAGS_new_executor_serial_run", "FLAGS_new_executor_sequential_run")
    if not enabled:
        yield
        return
    old = paddle.get_flags(list(flags))
    paddle.set_flags({f: True for f in flags})
    try:
        yield
    finally:
        paddle.set_flags(old)


def run_behind_gc(fn: Callable[[], T], cpu: Optional[int] = None) -> T:
    """``fn()`` with every thread of the process on one CPU and the executor's garbage-collector
    thread ahead of the caller, so that it runs as soon as it has tensors to free, before the
    step allocates anything more.  ``cpu``: that CPU (default the lowest the caller may use);
    processes measured side by side (the ranks of a launch) each need one of their own, or one
    process's real-time threads keep the other's GC thread waiting (a rank's peak then read up
    to twice its program's).

    On CPU, Paddle's executor frees dead tensors on that thread, asynchronously; it can fall
    several ops behind, the more the busier the machine, and every tensor it has not freed yet
    adds to the allocator's peak: peaks of one step varied by 5-20% between runs.  On one CPU
    the GC thread cannot run beside the step, only instead of it; and when it is ahead of the
    caller, it runs the moment it is woken: the peak is then the one the program's order of
    allocations and frees gives, the same in every run.

    How the GC thread is put ahead (:func:`gc_priority`): where the process may use real-time
    scheduling (root, or ``CAP_SYS_NICE``), every other thread of the process runs
    ``SCHED_FIFO`` meanwhile, which preempts any normal thread of any process, so even a busy
    machine cannot delay a free (24 of 24 runs gave the same peak under a load of 4 on 2
    cores).  Otherwise ``fn`` runs on a thread of the idle class (``SCHED_IDLE``), which a
    woken normal thread preempts; other processes' threads can then still delay the GC thread,
    and on a busy machine about one run in five reads a higher peak (hence :data:`PEAK_RUNS`).
    (Scheduling classes and affinities are Linux features; elsewhere ``fn`` runs on the calling
    thread.)"""
    if not sys.platform.startswith("linux"):
        return fn()
    with _on_one_cpu(cpu):
        if gc_priority() == "realtime":
            with _other_threads_realtime():
                return fn()
        return _on_idle_thread(fn)


@functools.lru_cache(maxsize=None)
def gc_priority() -> str:
    """How :func:`run_behind_gc` puts the GC thread ahead here: ``"realtime"`` where this process
    may use ``SCHED_FIFO``, else ``"idle"`` (see there).  Probed once."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return "realtime"
    except (PermissionError, OSError, AttributeError):
        return "idle"


@contextlib.contextmanager
def _other_threads_realtime():
    """Every thread of the process but the caller on ``SCHED_FIFO`` for the block (normal
    scheduling restored after it)."""
    own = threading.get_native_id()
    raised = []
    try:
        for tid in _threads():
            if tid != own:
                try:
                    os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
                    raised.append(tid)
                except ProcessLookupError:  # the thread ended meanwhile
                    pass
        yield
    finally:
        for tid in raised:
            try:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            except ProcessLookupError:
                pass


def _on_idle_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a new thread of the idle scheduling class; its result or exception here."""
    result = {}

    def body():
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        try:
            result["value"] = fn()
        except BaseException as exc:  # re-raised on the calling thread
            result["error"] = exc

    thread = threading.Thread(target=body, name="pipesplit-memory-measurement")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


@contextlib.contextmanager
def _on_one_cpu(cpu: Optional[int] = None):
    """Every thread of the process on CPU ``cpu`` (default the caller's lowest) for the block
    (the old affinities restored after it): the GC thread cannot run beside the measuring
    thread, only instead of it."""
    caller = os.sched_getaffinity(0)
    if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int)):
        raise TypeError(f"cpu must be an int (a CPU number) or None, got {cpu!r}")
    if cpu is not None and cpu not in caller:
        raise ValueError(f"cpu must be one of the CPUs this process may use {sorted(caller)}, "
                         f"got {cpu}")
    tasks = {}
    for tid in _threads():
        try:
            tasks[tid] = os.sched_getaffinity(tid)
        except ProcessLookupError:  # the thread ended between listing and asking
            pass
    cpu = min(caller) if cpu is None else cpu
    try:
        for tid in tasks:
            _set_affinity(tid, {cpu})
        yield
    finally:  # threads started meanwhile get the caller's CPUs
        for tid in _threads():
            _set_affinity(tid, tasks.get(tid, caller))


def _threads() -> List[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def _set_affinity(tid: int, cpus) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except ProcessLookupError:  # the thread ended meanwhile
        pass


def _sync(place) -> None:
    if not isinstance(place, paddle.CPUPlace) and paddle.is_compiled_with_cuda():
        paddle.device.cuda.synchronize()


# --------------------------------------------------------------------------- plans and timed runs

def plan_with_gc_of(prefix_len: int, full_order: Sequence[Tuple[str, int]], programs,
                    num_micro_batches: int):
    """``core.Plan`` of the first ``prefix_len`` jobs of ``full_order`` whose skip-gc sets are
    those of the whole order: values a later job would read stay alive after the plan ends."""
    full_order = list(full_order)
    return make_plan(full_order[:prefix_len], programs, num_micro_batches, gc_order=full_order)


class TimedExecutor:
    """One plan on its own executor and scope, fed with one fixed batch; runs timed or with
    the allocator measured."""

    def __init__(self, plan, scope, feed, place):
        self.plan, self.scope, self.feed, self.place = plan, scope, feed, place
        self.exe = None

    def set_feed(self):
        for name, arr in self.feed.items():
            core.set_feed_variable(self.scope, as_tensor(arr, self.place), name, 0)

    def run(self) -> float:
        """Seconds of one executor run (feed set before the clock starts)."""
        self.set_feed()
        if self.exe is None:
            self.exe = paddle.base.executor._StandaloneExecutor(self.place, self.plan, self.scope)
        _sync(self.place)
        t0 = time.perf_counter()
        self.exe.run(list(self.feed))
        _sync(self.place)
        return time.perf_counter() - t0

    def run_measured(self, stats: MemoryStats) -> Tuple[int, int]:
        """(live bytes after, peak bytes during) one run, both relative to just before it,
        with the executor's garbage collector caught up before and after."""
        self.set_feed()
        if self.exe is None:
            self.exe = paddle.base.executor._StandaloneExecutor(self.place, self.plan, self.scope)
        _sync(self.place)
        before = stats.settled_current()
        stats.reset_peak()
        self.exe.run(list(self.feed))
        _sync(self.place)
        return stats.settled_current() - before, stats.peak() - before


def median_time_difference(base: TimedExecutor, probe: TimedExecutor, repeats: int) -> float:
    """Median over ``repeats`` pairs of (probe run - base run) in seconds, after one warm-up
    run each; the pairs alternate which plan runs first."""
    base.run()
    probe.run()
    diffs = []
    for i in range(repeats):
        if i % 2:
            tb = base.run()
            diffs.append(probe.run() - tb)
        else:
            tp = probe.run()
            diffs.append(tp - base.run())
    return statistics.median(diffs)

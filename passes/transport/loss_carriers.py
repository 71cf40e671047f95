"""What carries a step's loss from the process that computes it to the one that returns it
(:func:`pipesplit.passes.engine.loss_location.hand_the_loss_on`); the engine's
:class:`~pipesplit.passes.transport.base.Transport` picks one
(:meth:`~pipesplit.passes.transport.base.Transport.loss_carrier`).

* :class:`GatheredLoss` (gloo, CPU): a world gather of one small vector that every process
  joins, a static program run after the step (about a millisecond);
* :class:`StoredLoss` (NCCL, whose world ring the engine need not have): the launcher's TCP
  store, only the giver and the taker acting.  It would cost ~130 ms a step on CPU (each store
  round trip waits ~40 ms on delayed acknowledgements, a blocking ``get`` wakes ~90 ms late),
  which is why it carries the loss only where no gather is built for it.

A carrier has ``give(value, process, taker)``, ``stand_by(process)`` (a process that neither
gives nor takes) and ``take(process, giver)``.
"""
from __future__ import annotations

import io
from typing import Optional

import numpy as np

from pipesplit.passes.transport.launch_store import launch_store, round_key

#: the dtypes a gathered loss keeps (by their index in the packed vector's header)
_DTYPES = ("float32", "float64", "float16")
_MAX_DIMS = 4
_HEADER = 2 + _MAX_DIMS  # dtype index, ndim, dims


class StoredLoss:
    """The loss through the launcher's TCP store: only the giver and the taker act."""

    def __init__(self, store=None):
        self.store = store

    def _key(self, process: int, taker: int) -> str:
        # (the giver and the taker count the same steps: one key for each step's loss)
        if self.store is None:
            self.store = launch_store()
        return f"{round_key('loss', process, self.store)}/{taker}"

    def give(self, value: np.ndarray, process: int, taker: int) -> None:
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        key = self._key(process, taker)
        self.store.set(key, buffer.getvalue())

    def stand_by(self, process: int) -> None:
        return None

    def take(self, process: int, giver: int) -> np.ndarray:
        return np.load(io.BytesIO(bytes(self.store.get(self._key(process, process)))),
                       allow_pickle=False)


def pack(value: np.ndarray, capacity: int) -> np.ndarray:
    """``value`` as the gathered float64 vector: dtype, ndim, dims, then up to ``capacity``
    values (float64 holds float32 / float16 values exactly)."""
    dtype = str(value.dtype)
    if dtype not in _DTYPES or value.ndim > _MAX_DIMS or value.size > capacity:
        raise RuntimeError(f"pipesplit: the step's loss ({dtype}, shape {list(value.shape)}) "
                           f"does not fit the loss hand-off ({_DTYPES}, at most {_MAX_DIMS} "
                           f"dims and {capacity} values)")
    out = np.zeros(_HEADER + capacity, np.float64)
    out[0], out[1] = _DTYPES.index(dtype), value.ndim
    out[2:2 + value.ndim] = value.shape
    out[_HEADER:_HEADER + value.size] = value.reshape(-1)
    return out


def unpack(vector: np.ndarray) -> np.ndarray:
    ndim = int(vector[1])
    shape = [int(d) for d in vector[2:2 + ndim]]
    size = int(np.prod(shape)) if shape else 1
    return vector[_HEADER:_HEADER + size].astype(_DTYPES[int(vector[0])]).reshape(shape)


class GatheredLoss:
    """The loss in a world gather every process joins after the step (CPU): each process
    contributes a vector (the giver its packed loss, the others zeros) to a static program's
    ``all_gather`` on ring 0, and each taker keeps its giver's row."""

    OUT, IN = "pipesplit_loss_out", "pipesplit_loss_in"

    def __init__(self, world: int, capacity: int):
        self.world, self.capacity = world, capacity
        self._programs = {}  # the giver's process (None: keep nothing) -> program

    def _program(self, row: Optional[int]):
        if row not in self._programs:
            import paddle

            from pipesplit.passes.transport.step_exchange import scope_variable
            from pipesplit.passes.transport.world_ring import gather_rows

            program = paddle.pir.Program()
            with paddle.static.program_guard(program):
                block = program.global_block()
                typed = paddle.full([_HEADER + self.capacity], 0.0, "float64").type()
                rows = gather_rows(scope_variable(block, self.OUT, typed), self.world)
                if row is not None:
                    paddle._C_ops.assign_out_(rows[row], scope_variable(block, self.IN, typed))
            self._programs[row] = program
        return self._programs[row]

    def _run(self, vector: np.ndarray, row: Optional[int]) -> Optional[np.ndarray]:
        import paddle

        scope, place = paddle.static.global_scope(), paddle.CPUPlace()
        with paddle.base.framework._dygraph_guard(None):
            program = self._program(row)
            scope.var(self.OUT).get_tensor().set(vector, place)
            if row is not None and scope.find_var(self.IN) is None:
                scope.var(self.IN).get_tensor().set(np.zeros_like(vector), place)
            paddle.static.Executor(place).run(program, scope=scope, fetch_list=[])
        return None if row is None else np.array(scope.find_var(self.IN).get_tensor())

    def give(self, value: np.ndarray, process: int, taker: int) -> None:
        self._run(pack(value, self.capacity), None)

    def stand_by(self, process: int) -> None:
        self._run(np.zeros(_HEADER + self.capacity, np.float64), None)

    def take(self, process: int, giver: int) -> np.ndarray:
        return unpack(self._run(np.zeros(_HEADER + self.capacity, np.float64), giver))

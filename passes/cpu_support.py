"""Testing aid: let ``paddle.distributed.to_static`` pipelines start on a CPU build of Paddle.

Paddle 3.3.1's auto-parallel engine assumes a GPU (or XPU) build in three places that a pipeline
run on CPU processes (gloo) reaches before the first step; :func:`enable` patches exactly those,
and only where the process runs on the CPU (:func:`needed`: its transport,
:class:`~pipesplit.passes.transport.gloo.GlooTransport`, says so; on a CUDA build with a GPU it
does nothing):

* ``ProcessGroup.instantiate`` asserts ``No CUDA device found``: a gloo comm context is
  registered for the group's ring instead (ring 0 is the global group: the script's
  ``dist.init_parallel_env()``, or the one ``DistModel`` creates when the script made none).
* ``core.reshard`` of a parameter whose mesh excludes this rank crashes (SIGSEGV) when the
  tensor holds no data: such a tensor is returned unchanged, which is what the engine's
  parameter set-up does with it anyway (it drops it).  A replicated parameter that moves to
  another mesh (the engine's VPP chunk completion re-places blocks) crashes too (p2p on CPU):
  it is broadcast from its source rank over the gloo world group instead.
* The engine's ``barrier`` op needs an NCCL context: on ring 0 it becomes
  ``paddle.distributed.barrier()`` over the gloo group.
* ``DistModel`` calls ``fleet.init`` under the launcher, whose hybrid gloo groups the engine
  does not need: skipped; the global group it would create is created instead when the script
  has not (Paddle's own scripts never call ``dist.init_parallel_env()``).
* Every gloo group ``paddle.distributed.new_group`` creates (``fleet.init``'s hybrid groups:
  a trainer's, such as PaddleFormers' ``TrainingArguments`` under ``enable_auto_parallel``)
  rendezvous in a TCP store of its own, served by its first member.  Paddle's
  ``ProcessGroupGloo.create`` connects the group's gloo context under the bare keys ``"0"``,
  ``"1"`` ... of the store it is given, which the global group wrote first and every group
  writes again: in the launcher's store a member read a peer's address left by an earlier
  group, or by a group created at the same time (pipe groups [0, 1] and [2, 3]), and with
  four processes ``fleet.init`` failed in nearly every launch (gloo ``connect ...: Connection
  refused`` on one rank, ``TIMEOUT`` on another).

* Paddle's own pipeline plans (FThenB, 1F1B, VPP through the engine) carry ``send_v2`` /
  ``recv_v2``, whose CPU kernels are stubs: when the engine hands the plan to its executor
  (``Executor._set_plan``) they become gloo broadcasts on ring 0, rooted at the sender.

pipesplit's own engine path (:mod:`pipesplit.passes.engine.engine_rank`) builds its gloo
transfers itself.
Paddle's own passes run on two CPU ranks (one usable communicator per process); pipesplit's
serve more (the world ring, :mod:`pipesplit.passes.transport.lockstep`).
The hook bodies are :mod:`pipesplit.passes.engine.cpu_hooks`; the names are replaced (and given
back by :func:`disable`) only by :mod:`pipesplit.passes.engine.paddle_patches`, group ``"cpu"``.

Order: call :func:`enable` before ``dist.to_static``.  Under the launcher ``DistModel`` runs
``fleet.init`` at once, so with ``enable_strategy()`` on and this off, ``to_static`` is refused
(``RuntimeError`` saying so) rather than left to fail in gloo.  Without the launcher an
:func:`enable` after ``to_static`` is still in time: the engine prepares its programs,
communicators and parameters at the first ``train()`` / step.
"""
from __future__ import annotations

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.passes.engine import paddle_patches
from pipesplit.passes.transport.devices import needs_cpu_support as needed

require_supported_paddle()

__all__ = ["disable", "enable", "is_enabled", "needed"]

_GROUP = "cpu"


def enable() -> bool:
    """Patch the engine's CPU gaps (idempotent).  Returns True if anything was patched (False
    on a device whose transport needs nothing: a CUDA build with a GPU)."""
    if not needed():
        return False
    paddle_patches.enable(_GROUP)
    return True


def disable() -> None:
    """Undo :func:`enable`."""
    paddle_patches.disable(_GROUP)


def is_enabled() -> bool:
    return paddle_patches.is_enabled(_GROUP)

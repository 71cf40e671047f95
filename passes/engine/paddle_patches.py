"""The one door to Paddle's internals: every Paddle name pipesplit replaces is listed here.

A :class:`Patch` names a Paddle owner (module or class, by import path), an attribute, a
wrapper factory (Paddle's function -> the function installed in its place) and the feature
group it belongs to:

* ``"engine"`` - :func:`pipesplit.passes.strategy.enable_strategy` (hook bodies in
  :mod:`pipesplit.passes.engine.hooks`);
* ``"cpu"`` - :func:`pipesplit.passes.cpu_support.enable` (hook bodies in
  :mod:`pipesplit.passes.engine.cpu_hooks`).

:func:`enable` checks first that every name of the group exists in this Paddle (a
:class:`PaddleMismatchError` naming each missing one), then patches all of them.  A name that
several enabled groups wrap (``DistModel.__init__``) is installed ONCE, as Paddle's function
wrapped by each group's factory in table order (an earlier patch is the inner one), whatever
order the groups were enabled in; :func:`disable` composes again from Paddle's function, which
comes back (the same object) when no group wraps it.  :func:`list_patches` lists them all.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Tuple

from pipesplit.passes._paddle import SUPPORTED_PADDLE_VERSIONS, require_supported_paddle
from pipesplit.passes.engine import cpu_hooks, hooks as engine_hooks

paddle = require_supported_paddle()

GROUPS = ("engine", "cpu")
_ENGINE = "paddle.distributed.auto_parallel.static.engine"
_PIR_PASS = "paddle.distributed.auto_parallel.static.pir_pass"


class PaddleMismatchError(RuntimeError):
    """This Paddle lacks a name pipesplit patches (another release than the supported ones)."""


@dataclass(frozen=True)
class Patch:
    owner: str     # import path of a module, or of a class inside one
    name: str      # the attribute replaced on the owner
    wrap: Callable[[Callable], Callable]  # Paddle's function (or the inner wrapper) -> its stand-in
    group: str

    @property
    def path(self) -> str:
        return f"{self.owner}.{self.name}"


class PatchState(NamedTuple):
    owner: str
    name: str
    group: str
    enabled: bool


def _replace_with(function):
    """A factory for a stand-in that does not call Paddle's function."""
    return lambda original: function


_Key = Tuple[str, str]


class PatchDoor:
    """Patches grouped by feature; each (owner, name) installed once, composed."""

    def __init__(self, patches):
        unknown = sorted({p.group for p in patches} - set(GROUPS))
        if unknown:
            raise ValueError(f"unknown patch group(s) {unknown}; groups are {list(GROUPS)}")
        self.patches: Tuple[Patch, ...] = tuple(patches)
        self._enabled: set = set()
        #: (owner, name) -> (owner object, Paddle's value, whether the owner itself held it)
        self._originals: Dict[_Key, tuple] = {}

    def enable(self, group: str) -> None:
        """Patch every name of ``group`` (idempotent), or none if one is missing."""
        self._check_group(group)
        if group in self._enabled:
            return
        self.check_names(group)
        self._enabled.add(group)
        try:
            self._install(self._keys(group))
        except BaseException:
            self._enabled.discard(group)  # _install set nothing
            raise

    def disable(self, group: str) -> None:
        """Undo :meth:`enable` for ``group``; names another enabled group wraps stay wrapped
        by that group only."""
        self._check_group(group)
        if group not in self._enabled:
            return
        self._enabled.discard(group)
        self._install(self._keys(group))

    def is_enabled(self, group: str) -> bool:
        self._check_group(group)
        return group in self._enabled

    def list_patches(self) -> List[PatchState]:
        return [PatchState(p.owner, p.name, p.group, p.group in self._enabled)
                for p in self.patches]

    def check_names(self, group: str) -> None:
        """A :class:`PaddleMismatchError` naming every Paddle name of ``group`` this Paddle
        does not have."""
        missing = [p.path for p in self.patches
                   if p.group == group and not _has(p.owner, p.name)]
        if missing:
            raise PaddleMismatchError(
                f"pipesplit needs {', '.join(missing)}, which this Paddle ({paddle.__version__}) "
                f"does not have; supported: {', '.join(SUPPORTED_PADDLE_VERSIONS)}")

    def _check_group(self, group: str) -> None:
        if group not in GROUPS:
            raise ValueError(f"unknown patch group {group!r}; groups are {list(GROUPS)}")

    def _keys(self, group: str) -> List[_Key]:
        return list(dict.fromkeys((p.owner, p.name) for p in self.patches if p.group == group))

    def _install(self, keys: List[_Key]) -> None:
        """Compose every name in ``keys`` first, then set them all (all or nothing)."""
        installs = []
        for key in keys:
            if key not in self._originals:
                owner = _resolve(key[0])
                self._originals[key] = (owner, getattr(owner, key[1]), key[1] in vars(owner))
            owner, value, owned = self._originals[key]
            active = [p for p in self.patches if (p.owner, p.name) == key
                      and p.group in self._enabled]
            for patch in active:
                value = patch.wrap(value)
            installs.append((key, owner, value, owned, bool(active)))
        for key, owner, value, owned, patched in installs:
            if patched or owned:
                setattr(owner, key[1], value)
            else:  # Paddle's value was inherited: inherit it again
                delattr(owner, key[1])
            if not patched:
                del self._originals[key]


def _resolve(path: str):
    """The module or class named by ``path`` (``pkg.module.Class``)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(f"cannot import {path}")


def _has(owner: str, name: str) -> bool:
    try:
        return hasattr(_resolve(owner), name)
    except (ImportError, AttributeError):
        return False


_DIST_MODEL = "paddle.distributed.auto_parallel.api.DistModel"
_PROCESS_GROUP = "paddle.distributed.auto_parallel.static.process_group.ProcessGroup"

PATCHES = (
    # the engine's pipeline step (pir_pass's, and the name the engine module imported)
    Patch(_PIR_PASS, "pipeline_pass", _replace_with(engine_hooks.pipeline_pass), "engine"),
    Patch(_ENGINE, "pipeline_pass", _replace_with(engine_hooks.pipeline_pass), "engine"),
    Patch(_PIR_PASS, "get_pp_stage_by_process_mesh", engine_hooks.stage_by_mesh, "engine"),
    Patch(_ENGINE, "complete_chunk_id", engine_hooks.complete_chunk_id, "engine"),
    Patch(_ENGINE, "check_chunk_id", engine_hooks.check_chunk_id, "engine"),
    Patch(f"{_ENGINE}.Engine", "__init__", engine_hooks.engine_init, "engine"),
    Patch(f"{_ENGINE}.Engine", "_prepare_program", engine_hooks.keep_plan_per_mode, "engine"),
    Patch(f"{_ENGINE}.Engine", "to_mode", engine_hooks.switch_to_the_mode_plan, "engine"),
    # the re-plan inside: a failure while measuring is named too
    Patch(f"{_ENGINE}.Engine", "run", engine_hooks.measure_and_replan, "engine"),
    Patch(f"{_ENGINE}.Engine", "run", engine_hooks.name_a_failed_step, "engine"),
    Patch(f"{_ENGINE}.Engine", "prepare", engine_hooks.whole_batch_spec, "engine"),
    Patch(f"{_ENGINE}.Engine", "_build", engine_hooks.name_the_prediction, "engine"),
    Patch(f"{_ENGINE}.Engine", "_prepare_data_spec_from_dataloader",
          engine_hooks.note_a_sharded_loader, "engine"),
    # inside the cpu group's wrapper of the same name (the earlier patch in this table is
    # the inner one), so it sees whether cpu_support skips DistModel's fleet.init
    Patch(_DIST_MODEL, "__init__", engine_hooks.cpu_support_first, "engine"),
    Patch(_DIST_MODEL, "__init__", engine_hooks.check_the_loader, "engine"),
    # a CPU build's gaps in the engine
    Patch(_PROCESS_GROUP, "instantiate", _replace_with(cpu_hooks.instantiate_gloo), "cpu"),
    Patch("paddle.base.core", "reshard", cpu_hooks.reshard, "cpu"),
    Patch("paddle._legacy_C_ops", "barrier", cpu_hooks.barrier, "cpu"),
    Patch("paddle.base.executor.Executor", "_set_plan", cpu_hooks.set_plan, "cpu"),
    Patch(_DIST_MODEL, "__init__", cpu_hooks.dist_model_init, "cpu"),
)

DOOR = PatchDoor(PATCHES)
enable = DOOR.enable
disable = DOOR.disable
is_enabled = DOOR.is_enabled
list_patches = DOOR.list_patches
check_names = DOOR.check_names

"""The mechanism of the one door to Paddle's internals (the table of what goes through it is
:mod:`pipesplit.passes.engine.paddle_patches`).

A :class:`Patch` names a Paddle owner (module or class, by import path), an attribute, a
wrapper factory (Paddle's function -> the function installed in its place) and the feature
group it belongs to.  :meth:`PatchDoor.enable` checks first that every name of the group exists
in this Paddle (a :class:`PaddleMismatchError` naming each missing one), then patches all of
them.  A name that several enabled groups wrap (``DistModel.__init__``) is installed ONCE, as
Paddle's function wrapped by each group's factory in table order (an earlier patch is the inner
one), whatever order the groups were enabled in; :meth:`PatchDoor.disable` composes again from
Paddle's function, which comes back (the same object) when no group wraps it, as does the
composition of the groups still on (built once per set of groups: a group enabled then disabled
leaves the very object that was there, e.g. the ``"schedule_names"`` guard that is on from
``pipesplit.passes.strategy``'s import).  A group can be
*held* by live objects (:meth:`PatchDoor.hold`): :meth:`PatchDoor.release` then leaves it
installed.
"""
from __future__ import annotations

import gc
import importlib
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, List, NamedTuple, Tuple

from pipesplit.passes._paddle import SUPPORTED_PADDLE_VERSIONS, require_supported_paddle

paddle = require_supported_paddle()

GROUPS = ("engine", "engine_routes", "cpu", "schedule_names")


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


_Key = Tuple[str, str]


class PatchDoor:
    """Patches grouped by feature; each (owner, name) installed once, composed."""

    def __init__(self, patches=()):
        self.patches: Tuple[Patch, ...] = ()
        self._enabled: set = set()
        #: (owner, name) -> (owner object, Paddle's value, whether the owner itself held it)
        self._originals: Dict[_Key, tuple] = {}
        #: group -> the live objects that need it installed (see :meth:`hold`)
        self._holders: Dict[str, weakref.WeakSet] = {}
        #: (owner, name, active patches) -> (Paddle's value, its composition): the same groups
        #: on give the same object back (a group enabled and disabled leaves what was there)
        self._composed: Dict[tuple, tuple] = {}
        self.add_patches(patches)

    def add_patches(self, patches) -> None:
        """Add ``patches`` to the table (before any of their groups is enabled)."""
        patches = tuple(patches)
        unknown = sorted({p.group for p in patches} - set(GROUPS))
        if unknown:
            raise ValueError(f"unknown patch group(s) {unknown}; groups are {list(GROUPS)}")
        if {p.group for p in patches} & self._enabled:
            raise ValueError("patches of an enabled group cannot be added")
        self.patches += patches

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

    def hold(self, group: str, holder) -> None:
        """Keep ``group`` installed while ``holder`` lives (see :meth:`release`)."""
        self._check_group(group)
        self._holders.setdefault(group, weakref.WeakSet()).add(holder)

    def holders(self, group: str) -> list:
        """The live holders of ``group`` (collected garbage no longer holds it)."""
        self._check_group(group)
        gc.collect()
        return list(self._holders.get(group, ()))

    def release(self, group: str) -> bool:
        """:meth:`disable` ``group`` unless a live holder needs it; whether it was disabled."""
        if self.holders(group):
            return False
        self.disable(group)
        return True

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

    def _compose(self, key: _Key, original, active: tuple):
        """``original`` wrapped by each of ``active`` in table order, built once per set of
        active patches (a later call with the same set returns the same object)."""
        cached = self._composed.get((key, active))
        if cached is not None and cached[0] is original:
            return cached[1]
        value = original
        for patch in active:
            value = patch.wrap(value)
        if active:
            self._composed[(key, active)] = (original, value)
        return value

    def _install(self, keys: List[_Key]) -> None:
        """Compose every name in ``keys`` first, then set them all (all or nothing)."""
        installs = []
        for key in keys:
            if key not in self._originals:
                owner = _resolve(key[0])
                self._originals[key] = (owner, getattr(owner, key[1]), key[1] in vars(owner))
            owner, value, owned = self._originals[key]
            active = tuple(p for p in self.patches if (p.owner, p.name) == key
                           and p.group in self._enabled)
            value = self._compose(key, value, active)
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


#: this process's door (its table: :data:`pipesplit.passes.engine.paddle_patches.PATCHES`)
DOOR = PatchDoor()

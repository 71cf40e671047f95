"""The one door to Paddle's internals (``pipesplit.passes.engine.paddle_patches``): each group patches
all its names or none, disabling gives Paddle's own objects back, and a name two groups wrap
is composed the same way whatever order they are enabled and disabled in."""
from __future__ import annotations

import re

import paddle
import pytest
from paddle.distributed.auto_parallel.static.engine import Engine

from pipesplit.passes import cpu_support
from pipesplit.passes.split import registration
from pipesplit.passes.engine import paddle_patches
from pipesplit.passes import strategy as ps_strategy
from pipesplit.passes.engine.door import _resolve
from pipesplit.passes.engine.paddle_patches import GROUPS, PATCHES, Patch, PaddleMismatchError, PatchDoor


def _current(group):
    """(owner, name) -> what the owner holds now (None: absent)."""
    return {(p.owner, p.name): getattr(_resolve(p.owner), p.name, None)
            for p in PATCHES if p.group == group}


#: enabled by the import of pipesplit.passes.strategy (above), and left so by each test
ON_AT_IMPORT = "schedule_names"


@pytest.fixture(autouse=True)
def nothing_left_enabled():
    assert paddle_patches.is_enabled(ON_AT_IMPORT)
    paddle_patches.disable(ON_AT_IMPORT)
    assert not any(paddle_patches.is_enabled(g) for g in GROUPS)
    yield
    for group in GROUPS:
        paddle_patches.disable(group)
    paddle_patches.enable(ON_AT_IMPORT)


@pytest.mark.parametrize("group", GROUPS)
def test_enable_patches_every_name_and_disable_gives_each_original_back(group):
    before = _current(group)
    paddle_patches.enable(group)
    assert all(now is not before[key] for key, now in _current(group).items())
    assert all(state.enabled == (state.group == group) for state in paddle_patches.list_patches())
    paddle_patches.enable(group)  # idempotent
    paddle_patches.disable(group)
    assert all(now is before[key] for key, now in _current(group).items())
    assert not any(state.enabled for state in paddle_patches.list_patches())


def test_both_groups_together_then_apart():
    before = {**_current("engine"), **_current("cpu")}
    paddle_patches.enable("engine")
    paddle_patches.enable("cpu")
    paddle_patches.disable("engine")
    shared = _current("engine").keys() & _current("cpu").keys()  # DistModel.__init__
    assert shared and all((now is before[key]) == (key not in shared)
                          for key, now in _current("engine").items())
    paddle_patches.disable("cpu")
    assert {**_current("engine"), **_current("cpu")} == before


def test_the_public_switches_go_through_the_door():
    was = registration.is_enabled()
    ps_strategy.enable_strategy()
    assert paddle_patches.is_enabled("engine") and ps_strategy.is_strategy_enabled()
    assert paddle_patches.is_enabled("engine_routes")
    ps_strategy.disable_strategy()  # (no engine built with pipesplit holds the routes)
    assert not paddle_patches.is_enabled("engine") and registration.is_enabled() == was
    assert not paddle_patches.is_enabled("engine_routes")
    assert cpu_support.enable() == cpu_support.needed()
    assert paddle_patches.is_enabled("cpu") == cpu_support.needed() == cpu_support.is_enabled()
    cpu_support.disable()
    assert not paddle_patches.is_enabled("cpu")


def test_a_missing_name_is_named_and_nothing_is_patched(monkeypatch):
    monkeypatch.delattr(Engine, "_prepare_program")
    before = _current("engine")
    was = registration.is_enabled()
    message = (f"pipesplit needs paddle.distributed.auto_parallel.static.engine.Engine."
               f"_prepare_program, which this Paddle ({paddle.__version__}) does not have; "
               f"supported: ")
    with pytest.raises(PaddleMismatchError, match=re.escape(message)):
        ps_strategy.enable_strategy()
    assert not paddle_patches.is_enabled("engine") and registration.is_enabled() == was
    assert not paddle_patches.is_enabled("engine_routes")
    assert _current("engine") == before


def test_a_missing_cpu_name_patches_nothing(monkeypatch):
    monkeypatch.delattr(paddle.base.executor.Executor, "_set_plan")
    before = _current("cpu")
    with pytest.raises(PaddleMismatchError, match=r"paddle\.base\.executor\.Executor\._set_plan"):
        paddle_patches.enable("cpu")
    assert not paddle_patches.is_enabled("cpu")
    assert _current("cpu") == before


def test_a_held_group_stays_installed_until_its_holders_are_gone():
    class Holder:
        pass

    before = _current("engine_routes")
    holder = Holder()
    paddle_patches.enable("engine_routes")
    paddle_patches.hold("engine_routes", holder)
    assert not paddle_patches.release("engine_routes")
    assert paddle_patches.is_enabled("engine_routes")
    del holder
    assert paddle_patches.release("engine_routes")
    assert not paddle_patches.is_enabled("engine_routes")
    assert _current("engine_routes") == before


def test_listing_names_owner_name_group_and_state():
    listed = paddle_patches.list_patches()
    assert [(s.owner, s.name, s.group) for s in listed] == \
        [(p.owner, p.name, p.group) for p in PATCHES]
    assert ("paddle.distributed.auto_parallel.static.engine.Engine", "_prepare_program",
            "engine_routes", False) in listed
    assert ("paddle.distributed.auto_parallel.static.engine.Engine", "__init__",
            "engine", False) in listed
    assert ("paddle.base.core", "reshard", "cpu", False) in listed
    assert {s.group for s in listed} == set(GROUPS)


def test_an_unknown_group_is_refused():
    with pytest.raises(ValueError, match="unknown patch group 'gpu'"):
        paddle_patches.enable("gpu")


class Owner:
    def shared(self):
        return ["paddle"]


class Heir(Owner):
    pass


def _tag(tag):
    def wrap(original):
        def shared(self):
            return original(self) + [tag]
        return shared
    return wrap


def _shared_door(owner):
    path = f"{__name__}.{owner.__name__}"
    return PatchDoor([Patch(path, "shared", _tag("engine"), "engine"),
                      Patch(path, "shared", _tag("cpu"), "cpu")])


@pytest.mark.parametrize("enable_order", [("engine", "cpu"), ("cpu", "engine")])
@pytest.mark.parametrize("disable_order", [("engine", "cpu"), ("cpu", "engine")])
def test_a_name_two_groups_wrap_is_composed_in_any_order(enable_order, disable_order):
    door, original = _shared_door(Owner), Owner.shared
    for group in enable_order:
        door.enable(group)
    assert Owner().shared() == ["paddle", "engine", "cpu"]  # table order, not enable order
    door.disable(disable_order[0])
    assert Owner().shared() == ["paddle", disable_order[1]]
    door.disable(disable_order[1])
    assert Owner.shared is original


def test_an_inherited_name_is_inherited_again():
    door = _shared_door(Heir)
    door.enable("cpu")
    assert Heir().shared() == ["paddle", "cpu"] and Owner().shared() == ["paddle"]
    door.disable("cpu")
    assert "shared" not in vars(Heir) and Heir.shared is Owner.shared


@pytest.mark.skipif(not cpu_support.needed(), reason="a GPU build needs no cpu_support")
def test_to_static_before_cpu_support_under_the_launcher_is_refused(monkeypatch):
    from paddle.distributed.auto_parallel.api import DistModel

    monkeypatch.setenv("POD_NAME", "launched")
    ps_strategy.enable_strategy()
    with pytest.raises(RuntimeError, match=re.escape("call pipesplit.passes.cpu_support.enable() "
                                                     "before dist.to_static")):
        DistModel(None, None)  # refused before Paddle's own __init__ reads anything
    ps_strategy.disable_strategy()

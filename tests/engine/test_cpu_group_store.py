"""cpu_support's store of its own for each gloo group ``new_group`` creates
(:func:`pipesplit.passes.engine.cpu_hooks.gloo_group_store`), in one process; the four-process
``fleet.init`` it is for is ``tests/multiprocess/test_fleet_groups.py``."""
from __future__ import annotations

import socket

import paddle
import pytest

from pipesplit.passes import cpu_support
from pipesplit.passes.engine import cpu_hooks, paddle_patches
from pipesplit.passes.transport import GLOO, NCCL

_IMPL = ("paddle.distributed.collective", "_new_process_group_impl")


def _paddles_impl(backend, store, rank, world_size, group_name, pg_options, group_id=0,
                  nccl_comm_init_option=0, nccl_config=None):
    """The signature of Paddle 3.3.1's ``_new_process_group_impl``; returns what it was given."""
    return dict(backend=backend, store=store, rank=rank, world_size=world_size,
                group_name=group_name, group_id=group_id)


def test_the_patch_is_in_the_cpu_group_and_given_back():
    import paddle.distributed.collective as collective

    assert (*_IMPL, "cpu") in [(p.owner, p.name, p.group) for p in paddle_patches.list_patches()]
    before = collective._new_process_group_impl
    enabled = cpu_support.is_enabled()
    cpu_support.enable()
    assert (collective._new_process_group_impl is not before) == cpu_support.needed()
    if not enabled:
        cpu_support.disable()
        assert collective._new_process_group_impl is before


def test_other_backends_keep_the_store_they_were_given():
    impl = cpu_hooks.gloo_group_store(_paddles_impl)
    store = object()
    assert impl(NCCL, store, 1, 2, "_default_pg10", None, group_id=10)["store"] is store


def test_a_gloo_group_gets_its_own_store(monkeypatch):
    """As ``new_group`` calls it (positional, then keywords): only the store is replaced."""
    asked = []
    own = object()
    monkeypatch.setattr(cpu_hooks, "group_store",
                        lambda store, rank, gid: asked.append((store, rank, gid)) or own)
    impl = cpu_hooks.gloo_group_store(_paddles_impl)
    launcher = object()
    got = impl(GLOO, launcher, 1, 2, "_default_pg11", pg_options=None, group_id=11,
               nccl_comm_init_option=0, nccl_config=None)
    assert asked == [(launcher, 1, 11)]
    assert got == dict(backend=GLOO, store=own, rank=1, world_size=2,
                       group_name="_default_pg11", group_id=11)


def _libuv_flag():
    """Paddle's ``FLAGS_tcp_store_using_libuv``, or None where the release has no libuv store
    and cannot read the flag (3.1, 3.2: ``ValueError: Flag ... cannot get its value``)."""
    flag = "FLAGS_tcp_store_using_libuv"
    try:
        return paddle.get_flags(flag)[flag]
    except ValueError:
        return None


def test_the_group_store_serves_on_a_free_port_and_leaves_the_flag_as_it_was():
    before = _libuv_flag()
    master, port = cpu_hooks._serve_store(30)
    assert _libuv_flag() == before
    client = paddle.base.core.TCPStore("127.0.0.1", port, False, 0, 30)
    master.set("k", b"v")
    assert bytes(client.get("k")) == b"v"


def test_a_port_taken_in_between_is_given_up_for_another(monkeypatch):
    """The free port found is taken before the store binds it: the next one is tried (Paddle's
    libuv server would abort the process there)."""
    taken = socket.socket()
    taken.bind(("", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    real = socket.socket
    probes = []

    class Probe(real):
        def getsockname(self):
            probes.append(1)
            return ("0.0.0.0", busy) if len(probes) == 1 else super().getsockname()

    monkeypatch.setattr(socket, "socket", Probe)
    try:
        master, port = cpu_hooks._serve_store(30)
    finally:
        taken.close()
    assert len(probes) == 2 and port != busy
    monkeypatch.setattr(socket, "socket", real)
    master.set("k", b"v")
    assert bytes(paddle.base.core.TCPStore("127.0.0.1", port, False, 0, 30).get("k")) == b"v"


@pytest.mark.skipif(cpu_support.needed(), reason="on a CPU build the group is enabled")
def test_nothing_is_patched_on_a_gpu_build():
    assert cpu_support.enable() is False

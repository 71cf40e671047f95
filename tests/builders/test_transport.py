"""The transport (``passes/transport/``): one class per device type, chosen once through the
registry (``devices.py``), its way chosen per plan (``Transport.for_plan``); and
``docs/design.md``'s example of a new device type, run as the page writes it."""
import inspect
import re
from dataclasses import dataclass

import paddle
import pytest

from _paths import REPO
from pipesplit.passes.transport import (BROADCAST, GLOO, LOCKSTEP, NCCL, NCCL_ON_COMPUTE_STREAM,
                                       WORLD_RING, devices)
from pipesplit.passes.transport.devices import (DEVICE_TRANSPORTS, DEVICES, resolve_device,
                                                transport_for)
from pipesplit.passes.transport.gloo import GlooTransport
from pipesplit.passes.transport.lockstep import lockstep_jobs
from pipesplit.passes.transport.loss_carriers import GatheredLoss, StoredLoss
from pipesplit.passes.transport.nccl import NcclTransport
from pipesplit.passes.transport.rank_comm import own_jobs, own_jobs_on_streams
from pipesplit.passes.transport.ring_order import world_ring_jobs


def test_the_registry_has_a_class_per_device_type():
    assert DEVICES == ("auto", "cpu", "gpu")
    assert type(transport_for("cpu")) is GlooTransport
    assert type(transport_for("gpu")) is NcclTransport
    assert (GlooTransport.backend, NcclTransport.backend) == (GLOO, NCCL)
    with pytest.raises(ValueError, match=r"device must be one of \('auto', 'cpu', 'gpu'\), "
                                         r"got 'tpu'"):
        transport_for("tpu")


@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="the rule of a CPU build")
def test_a_cpu_build_runs_on_the_cpu_with_the_cpu_stand_ins():
    from pipesplit.passes import cpu_support

    assert resolve_device("auto") == "cpu" and type(transport_for()) is GlooTransport
    assert cpu_support.needed()


@pytest.mark.parametrize("world,pp,exchanges,way", [
    (2, 2, False, BROADCAST), (2, 2, True, BROADCAST), (4, 4, False, WORLD_RING),
    (4, 4, True, LOCKSTEP), (4, 2, False, LOCKSTEP), (8, 4, False, LOCKSTEP)])
def test_the_way_of_a_plan(world, pp, exchanges, way):
    planned = transport_for("cpu").for_plan(world, pp, exchanges)
    assert (type(planned), planned.way, planned.world) == (GlooTransport, way, world)
    assert transport_for("cpu").way is None  # (the device's transport is left as it was)
    assert transport_for("gpu").for_plan(world, pp, exchanges).way == NCCL


def test_what_each_device_decides():
    cpu, gpu = transport_for("cpu"), transport_for("gpu")
    assert (cpu.comm_mode, gpu.comm_mode) == ("rendezvous", "latency")
    assert (cpu.counts_progress, gpu.counts_progress) == (True, False)
    # one handler per way of the device's (gloo's three, NCCL's one: sends / recvs tied to
    # their producers / consumers by stream events)
    assert dict(cpu.RANK_COMM) == {BROADCAST: own_jobs, WORLD_RING: world_ring_jobs,
                                   LOCKSTEP: lockstep_jobs}
    assert dict(gpu.RANK_COMM) == {NCCL: own_jobs_on_streams, NCCL_ON_COMPUTE_STREAM: own_jobs}
    assert (cpu.needs_cpu_support, gpu.needs_cpu_support) == (True, False)
    assert (cpu.program_style, gpu.program_style) == (GLOO, NCCL)
    assert isinstance(cpu.loss_carrier(4, 2), GatheredLoss)
    assert isinstance(gpu.loss_carrier(4, 2), StoredLoss)
    assert cpu.p2p_rings(None) == {} and cpu.reduce_ring(4) is None
    assert isinstance(cpu.device_place(), paddle.CPUPlace)
    assert isinstance(cpu.rank_place([]), paddle.CPUPlace)


def test_a_step_program_needs_the_plans_way():
    with pytest.raises(ValueError, match="no plan's way chosen yet"):
        transport_for("cpu").step_program([], 0)


def _design_example():
    """The code blocks of docs/design.md's "A new device type": the registry as it is, the
    new class's file, its import and its registration line."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text[text.index("**A new device type**"):
                   text.index("**A collective the CPU build lacks**")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


class _Place:
    """A place of the example's device (a CPU build cannot make an ``XPUPlace``)."""

    def __init__(self, device_id=0):
        self.device_id = device_id


def test_the_design_pages_new_device_type_is_one_class_and_one_line(monkeypatch):
    registry, module, registration = _design_example()
    assert registry.strip() in inspect.getsource(devices)  # the page shows the registry as it is
    namespace = {}
    exec(compile(module, "passes/transport/xpu.py", "exec"), namespace)
    xpu = namespace["XpuTransport"]
    import_line, entry = registration.strip().splitlines()
    assert import_line == "from pipesplit.passes.transport.xpu import XpuTransport"
    for device, transport in eval("{" + entry + "}", namespace).items():
        monkeypatch.setitem(DEVICE_TRANSPORTS, device, transport)

    assert type(transport_for("xpu")) is xpu and transport_for("xpu").backend == "bkcl"
    planned = transport_for("xpu").for_plan(2, 2)
    assert planned.way == NCCL and planned.program_style == NCCL
    assert planned.RANK_COMM[planned.way] is own_jobs_on_streams
    # "auto": an XPU place names the device; a place of no device leaves the CPU
    monkeypatch.setattr(paddle, "XPUPlace", _Place, raising=False)
    monkeypatch.setattr(paddle.framework, "_current_expected_place", lambda: _Place())
    monkeypatch.setattr(paddle.distributed, "ParallelEnv", lambda: _Place(3))
    assert resolve_device("auto") == "xpu" and planned.device_place().device_id == 3
    if not (paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu()):
        monkeypatch.setattr(paddle.framework, "_current_expected_place", lambda: object())
        assert resolve_device("auto") == "cpu"


def test_a_way_without_its_handler_is_refused():
    @dataclass(frozen=True)
    class HalfDone(NcclTransport):
        def pick(self, world, pp, optimizer_exchanges):
            return BROADCAST

    with pytest.raises(ValueError, match=r"gave 'broadcast', which its RANK_COMM has no "
                                         r"handler for \(it has \['nccl', "
                                         r"'nccl_on_compute_stream'\]\)"):
        HalfDone().for_plan(2, 2)

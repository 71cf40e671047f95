"""The device types and their transports: the registry, and the one rule that names the device
a process runs on.

A new device type is one :class:`~pipesplit.passes.transport.base.Transport` subclass in this
package and its line in :data:`DEVICE_TRANSPORTS` (docs/design.md shows one).
"""
from __future__ import annotations

from typing import Tuple

import paddle

from pipesplit.passes.transport.base import Transport
from pipesplit.passes.transport.gloo import GlooTransport
from pipesplit.passes.transport.nccl import NcclTransport

#: device type -> its transport class (``resolve_device``'s answers)
DEVICE_TRANSPORTS = {
    GlooTransport.device: GlooTransport,
    NcclTransport.device: NcclTransport,
}
#: the device a process takes when Paddle's place names none and no other is present
DEFAULT_DEVICE = GlooTransport.device
#: what a plan builder's ``device`` takes: "auto" asks Paddle (:func:`resolve_device`)
DEVICES: Tuple[str, ...] = ("auto",) + tuple(sorted(DEVICE_TRANSPORTS))


def resolve_device(device: str = "auto") -> str:
    """A registered device type: ``device`` itself, or for "auto" the one whose place is
    Paddle's current expected place (when the place names none: a device the build and
    machine have, else :data:`DEFAULT_DEVICE`)."""
    if device != "auto" and device not in DEVICE_TRANSPORTS:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device != "auto":
        return device
    place = paddle.framework._current_expected_place()
    for name, transport in DEVICE_TRANSPORTS.items():
        if transport.holds(place):
            return name
    return next((name for name, transport in DEVICE_TRANSPORTS.items()
                 if name != DEFAULT_DEVICE and transport.present()), DEFAULT_DEVICE)


def transport_for(device: str = "auto") -> Transport:
    """The transport of ``device`` (:func:`resolve_device`), before any plan's way is chosen
    (:meth:`~pipesplit.passes.transport.base.Transport.for_plan`)."""
    return DEVICE_TRANSPORTS[resolve_device(device)]()


def rank_plan_transport(device: str, pp: int, overlap: bool = True) -> Transport:
    """The transport of a per-rank plan of a launch that runs one process per pipeline rank
    (:func:`pipesplit.passes.split.per_rank.build_rank_plan`): ``device``'s
    (:func:`transport_for`), transfers overlapping compute or not (``overlap``), its way
    chosen for ``pp`` processes and ``pp`` ranks."""
    return transport_for(device).with_overlap(overlap).for_plan(pp, pp)


def measured_on_host() -> bool:
    """Whether this process's jobs are measured by their host times and the host allocator
    (:attr:`~pipesplit.passes.transport.base.Transport.measured_on_host`: a CPU build)."""
    return transport_for("auto").measured_on_host


def needs_cpu_support() -> bool:
    """Whether this process's device (:func:`resolve_device`) has a transport that cannot start
    the engine's pipeline without pipesplit's stand-ins for the collectives the build lacks
    (:mod:`pipesplit.passes.cpu_support`: a CPU build, gloo)."""
    return transport_for("auto").needs_cpu_support

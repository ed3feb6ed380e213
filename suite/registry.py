"""Plugin discovery through entry points.

Built-in plugins register exactly like external ones, in ``pyproject.toml``:
``suite.workloads`` maps a workload name to its :class:`~suite.workload.Workload` class and
``suite.devices`` maps a device name to its :class:`~suite.devices.base.DeviceAdapter` class.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from suite.errors import SuiteError, UnknownPluginError

if TYPE_CHECKING:
    from suite.decoders.base import Decoder
    from suite.devices.base import DeviceAdapter
    from suite.workload import Workload

WORKLOADS_GROUP = "suite.workloads"
DEVICES_GROUP = "suite.devices"
DECODERS_GROUP = "suite.decoders"


def _group(group: str) -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        other = found.get(ep.name)
        if other is not None and other.value != ep.value:
            raise SuiteError(
                f"two plugins claim the name {ep.name!r} in {group}: {other.value} and {ep.value}; "
                "uninstall one of them"
            )
        found[ep.name] = ep
    return found


def workload_names() -> list[str]:
    return sorted(_group(WORKLOADS_GROUP))


def device_names() -> list[str]:
    return sorted(_group(DEVICES_GROUP))


def _load(group: str, kind: str, name: str) -> type:
    eps = _group(group)
    if name not in eps:
        valid = ", ".join(sorted(eps)) or "none installed"
        raise UnknownPluginError(f"unknown {kind} {name!r}; valid {kind}s: {valid}")
    return eps[name].load()


def load_workload(name: str) -> type["Workload"]:
    """The workload class registered as ``name``; raises :class:`UnknownPluginError` listing valid names."""
    return _load(WORKLOADS_GROUP, "workload", name)


def load_device(name: str) -> type["DeviceAdapter"]:
    """The device adapter class registered as ``name``; raises :class:`UnknownPluginError` listing names."""
    return _load(DEVICES_GROUP, "device", name)


def load_decoder(name: str) -> type["Decoder"]:
    """The image decoder registered as ``name``; raises :class:`UnknownPluginError` listing names."""
    return _load(DECODERS_GROUP, "decoder", name)


def default_workload() -> str:
    """The workload ``suite`` runs when none is named: the one this distribution ships (its ``suite.workloads`` entry
    point), else the only one installed; :class:`UnknownPluginError` where that leaves a choice or nothing."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        own = [ep.name for ep in distribution("suite-bench").entry_points if ep.group == WORKLOADS_GROUP]
    except PackageNotFoundError:
        own = []
    names = own or workload_names()
    if len(names) != 1:
        raise UnknownPluginError(f"name a workload (--workload); installed: {', '.join(workload_names()) or 'none'}")
    return names[0]

"""``libhlml.so`` (Habana's driver library, which habana-pyhlml 1.24 opens with ctypes in ``pyhlml/hlml_lib.py``),
replaced so that the REAL pyhlml package runs here: each method fills the very ctypes structure pyhlml passes
(``c_hlml_memory``: free/total/used in bytes; ``c_hlml_utilization.aip``; power in milliwatts; module id a
``c_uint``; ``c_hlml_pci_info.bus_id`` a ``char[19]``, per pyhlml's docstrings and ``pyhlml_types_generated.py``) and
returns an HLML status code, so pyhlml's own error handling runs. Cards are ``0x1000 + index`` handles; each has a
module id (default: its index), a PCI bus id and its used and total memory."""

from __future__ import annotations

from typing import Any, Sequence

from pyhlml import hlml_lib, hlml_types  # the real package (test extra)

GiB = 2**30


class FakeLibHLML:
    """libhlml.so, as pyhlml 1.24 calls it: ``fn(device, byref(struct))`` and an HLML_RETURN status."""

    def __init__(self, devices: int = 2, failing: set[str] = frozenset(), module_ids: Sequence[int] | None = None,
                 used_bytes: Sequence[int] | None = None, total_bytes: int = 96 * GiB) -> None:
        self.devices, self.failing = devices, set(failing)
        self.module_ids = list(module_ids) if module_ids is not None else list(range(devices))
        self.used_bytes = list(used_bytes) if used_bytes is not None else [24 * GiB] * devices
        self.total_bytes = total_bytes
        self.calls: list[str] = []

    def _status(self, name: str) -> int:
        self.calls.append(name)
        codes = hlml_types.HLML_RETURN
        return codes.HLML_ERROR_TIMEOUT if name in self.failing else codes.HLML_SUCCESS

    @staticmethod
    def _index(device: Any) -> int:
        return int(device.value) - 0x1000

    def hlml_init(self):
        return self._status("hlml_init")

    def hlml_shutdown(self):
        return self._status("hlml_shutdown")

    def hlml_device_get_count(self, count):
        count._obj.value = self.devices
        return self._status("hlml_device_get_count")

    def hlml_device_get_handle_by_index(self, index, device):
        device._obj.value = 0x1000 + index
        return self._status("hlml_device_get_handle_by_index")

    def hlml_device_get_module_id(self, device, module_id):
        module_id._obj.value = self.module_ids[self._index(device)]
        return self._status("hlml_device_get_module_id")

    def hlml_device_get_pci_info(self, device, pci_info, size):
        pci_info._obj.bus_id = f"0000:{0x19 + self._index(device):02x}:00.0".encode()
        return self._status("hlml_device_get_pci_info")

    def hlml_get_driver_version(self, version, length):
        version.value = b"1.24.1-a4f9d3c"
        return self._status("hlml_get_driver_version")

    def hlml_get_firmware_fit_version(self, device, version, length):
        version.value = b"hl-gaudi2-1.24.1-fw-58.1.0-sec-9"
        return self._status("hlml_get_firmware_fit_version")

    def hlml_device_get_memory_info(self, device, memory):
        memory._obj.total, memory._obj.used = self.total_bytes, self.used_bytes[self._index(device)]
        memory._obj.free = memory._obj.total - memory._obj.used
        return self._status("hlml_device_get_memory_info")

    def hlml_device_get_utilization_rates(self, device, utilization):
        utilization._obj.aip = 80 if device.value == 0x1000 else 40
        return self._status("hlml_device_get_utilization_rates")

    def hlml_device_get_power_usage(self, device, power):
        power._obj.value = 350_000  # mW
        return self._status("hlml_device_get_power_usage")


def install(monkeypatch: Any, lib: FakeLibHLML) -> FakeLibHLML:
    """Make the real pyhlml open ``lib`` instead of libhlml.so (undone by ``monkeypatch``)."""

    def load(self: Any) -> None:
        self.lib = lib
    monkeypatch.setattr(hlml_lib.LibHLML, "_load_lib", load)
    return lib

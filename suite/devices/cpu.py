"""The CPU adapter: the embedded default, runs anywhere.

On CPU the "device" memory is host memory, so the peak reported as ``device_peak_memory_bytes`` is the
training process's resident high-water mark (``VmHWM`` in ``/proc/self/status``, Linux), loader workers
excluded (they are in the host RAM figures). The window is reset by writing ``5`` to
``/proc/self/clear_refs``; where that is not possible, the figure is absent rather than wrong.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from suite.devices.base import Availability, DeviceAdapter, DeviceTraits
from suite.devices.interfaces import DeviceMemory, MemoryMeter, Numerics

#: What "device peak memory" means on a CPU, said wherever the figure is shown (tables, plots, the report).
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _read_vm_hwm_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        return None
    return None


def cpu_model_name() -> str:
    """The CPU model as the OS reports it (``/proc/cpuinfo`` on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CPUNumerics(Numerics):
    def supported(self) -> tuple[str, ...]:
        return ("fp32", "bf16")


class CPUMemory(MemoryMeter):
    """The training process's resident high-water mark, its window reset through ``/proc/self/clear_refs``."""

    def __init__(self, adapter: DeviceAdapter) -> None:
        super().__init__(adapter)
        self._hwm_resettable = False

    def reset_peak(self) -> None:
        try:
            _CLEAR_REFS.write_text("5")
            self._hwm_resettable = True
        except OSError:
            self._hwm_resettable = False

    def peak(self) -> DeviceMemory | None:
        hwm = _read_vm_hwm_bytes()
        if hwm is None or not self._hwm_resettable:
            return None
        return DeviceMemory(peak_bytes=hwm, source="VmHWM of the training process (host memory)",
                            host_memory=True)


class CPUAdapter(DeviceAdapter):
    name = "cpu"
    #: DALI's CPU pipeline serves the dali loader; availability asks torch only: nothing is opened
    traits = DeviceTraits("Host CPU (PyTorch CPU backend); the embedded default", "gloo",
                          decoders={"device": "pillow", "dali": "dali"}, probe_claims_device=False)

    def __init__(self, local_rank: int = 0) -> None:
        super().__init__(local_rank)
        self._numerics, self._memory = CPUNumerics(self), CPUMemory(self)

    @classmethod
    def availability(cls) -> Availability:
        try:
            import torch  # noqa: F401
        except ImportError as exc:  # pragma: no cover - torch is a core dependency
            return Availability(False, f"torch is not importable: {exc}")
        return Availability(True, "", {"cpu_model": cpu_model_name(), "logical_cores": os.cpu_count()})

    def open_device(self) -> Any:
        import torch

        return torch.device("cpu")

    def synchronize(self) -> None:
        """CPU kernels run synchronously: nothing is queued."""

    def memory(self) -> MemoryMeter:
        return self._memory

    def facts(self) -> dict[str, Any]:
        import psutil
        import torch

        return {
            "device_name": cpu_model_name(),
            "device_count": 1,
            "logical_cores": psutil.cpu_count(logical=True),
            "physical_cores": psutil.cpu_count(logical=False),
            "memory_total_bytes": psutil.virtual_memory().total,
            "torch_num_threads": torch.get_num_threads(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            # No trustworthy peak bf16 FLOP/s figure for an arbitrary CPU: left out, never guessed.
        }

"""NVIDIA GPUs: one CUDA implementation, three registered adapters.

* ``cuda`` - any NVIDIA GPU (the card is recorded; peak FLOP/s only for the cards of :data:`KNOWN_CARDS`);
* ``h100`` and ``a100`` - the same code, but available only when the card *is* one of that family's products,
  matched by the exact name CUDA reports (``torch.cuda.get_device_name``): an H200, an "RTX A1000" or an unknown
  variant is refused with the name seen, never benchmarked under the wrong name or with the wrong peak.

Timing synchronizes with ``torch.cuda.synchronize``; device memory is the caching allocator's peak
(``torch.cuda.max_memory_allocated``, plus ``max_memory_reserved`` and, with nvidia-ml-py, the driver's view, each
under its own name); the ``device`` loader decodes with nvJPEG and ``dali`` with DALI (:mod:`suite.decoders`).
nvidia-ml-py comes with the ``cuda`` extra and is imported only here.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from suite.devices.base import Availability, DeviceAdapter, DeviceTraits, driver_text
from suite.devices.interfaces import DeviceMemory, MemoryMeter, Numerics
from suite.errors import SuiteError


@dataclass(frozen=True)
class CudaCard:
    family: str  # the adapter that claims it: H100, H200, A100
    variant: str
    peak_bf16_flops: float  # dense (no sparsity) bf16 tensor-core peak, from NVIDIA's data sheets


#: NVIDIA cards by the exact name CUDA reports. Dense bf16 peaks: H100 SXM5 989.4, PCIe 756, NVL 835 TFLOP/s (the
#: data sheets' 1979 / 1513 / 1671 "with sparsity", halved); H200 SXM 989.4, H200 NVL 835; A100 312 (SXM4, PCIe).
KNOWN_CARDS: dict[str, CudaCard] = {
    "NVIDIA H100 80GB HBM3": CudaCard("H100", "SXM5 80GB", 989.4e12),
    "NVIDIA H100 PCIe": CudaCard("H100", "PCIe 80GB", 756e12),
    "NVIDIA H100 NVL": CudaCard("H100", "NVL 94GB", 835e12),
    "NVIDIA H200": CudaCard("H200", "SXM 141GB", 989.4e12),
    "NVIDIA H200 NVL": CudaCard("H200", "NVL 141GB", 835e12),
    "NVIDIA A100-SXM4-80GB": CudaCard("A100", "SXM4 80GB", 312e12),
    "NVIDIA A100-SXM4-40GB": CudaCard("A100", "SXM4 40GB", 312e12),
    "NVIDIA A100 80GB PCIe": CudaCard("A100", "PCIe 80GB", 312e12),
    "NVIDIA A100-PCIE-40GB": CudaCard("A100", "PCIe 40GB", 312e12),
}

#: cuBLAS needs this for deterministic results (set before the first cuBLAS call).
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def known_card(device_name: str) -> CudaCard | None:
    """The card of this exact name (whitespace normalized), or ``None``."""
    return KNOWN_CARDS.get(" ".join(device_name.split()))


def peak_bf16_flops(device_name: str) -> float | None:
    card = known_card(device_name)
    return card.peak_bf16_flops if card else None


def _nvml() -> Any | None:
    """pynvml (nvidia-ml-py), initialized; ``None`` where it is not installed or finds no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError and friends: no driver view, not a failure
        return None
    return pynvml


class CudaNumerics(Numerics):
    """CUDA without TF32, cuDNN deterministic and cuBLAS's workspace set: fp32 means fp32, twice the same."""

    def supported(self) -> tuple[str, ...]:
        import torch

        return ("fp32", "bf16") if torch.cuda.is_bf16_supported() else ("fp32",)

    def seed_device(self, seed: int) -> None:
        import torch

        torch.cuda.manual_seed_all(seed)

    def make_deterministic(self) -> None:
        import torch

        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: TF32 would change the numerics
        torch.backends.cudnn.allow_tf32 = False
        super().make_deterministic()

    def lowest_precisions(self, precision: str) -> dict[str, str]:
        """As the base, but fp32 matmuls are TF32 where torch allows it (the suite switches it off)."""
        import torch

        lowest = super().lowest_precisions(precision)
        if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
            lowest["linear"] = lowest["attn"] = "tf32"
        return lowest

    def run_params(self) -> dict[str, str]:
        import torch

        return {"cuda.deterministic": "cudnn.deterministic+use_deterministic_algorithms",
                "cuda.tf32": str(torch.backends.cuda.matmul.allow_tf32).lower(),
                "cuda.cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
                "cuda.visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "all")}


class CudaMemory(MemoryMeter):
    """torch's allocator peak, with the driver's view (NVML) beside it."""

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.adapter.torch_device)

    def peak(self) -> DeviceMemory | None:
        import torch

        device = self.adapter.torch_device
        extra = {"reserved_peak": int(torch.cuda.max_memory_reserved(device))}
        driver, how = self._driver_memory()
        extra.update(driver)
        return DeviceMemory(peak_bytes=int(torch.cuda.max_memory_allocated(device)),
                            source=f"torch.cuda.max_memory_allocated; driver view: {how}", extra=extra)

    def current_bytes(self) -> int | None:
        import torch

        return int(torch.cuda.memory_allocated(self.adapter.torch_device))  # the allocator's count: no sync

    def _driver_memory(self) -> tuple[dict[str, int], str]:
        """The driver's view (NVML has no peak: read at the end): this process's memory; where NVML cannot match the
        process (a container's PIDs are not the host's), the device's used memory, named as such; and what was read
        or why nothing was."""
        nvml = _nvml()
        if nvml is None:
            return {}, "not read: nvidia-ml-py absent or no driver"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(physical_index(self.adapter.local_rank))
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == os.getpid() and process.usedGpuMemory is not None:
                    return {"nvml_process_used_at_end": int(process.usedGpuMemory)}, "NVML, this process"
            used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception as exc:  # noqa: BLE001 - no driver view, not a failure: recorded why
            return {}, f"not read: NVML failed ({type(exc).__name__}: {' '.join(str(exc).split())})"
        return ({"nvml_device_used_at_end": used},
                "NVML lists no process with this PID (in a container PIDs differ from the host's): the whole "
                "device's used memory instead, every process on it included")


def physical_index(local_rank: int) -> int:
    """The GPU index NVML knows this rank's device by (``CUDA_VISIBLE_DEVICES`` renumbers them for torch)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if local_rank < len(entries) and entries[local_rank].isdigit():
            return int(entries[local_rank])
    return local_rank


class CUDAAdapter(DeviceAdapter):
    name: ClassVar[str] = "cuda"
    #: the CUDA driver reserves address space of about twice the GPU memory: no --memory-limit
    traits = DeviceTraits("Any NVIDIA GPU (CUDA), identified in the records", "nccl",
                          decoders={"device": "nvjpeg", "dali": "dali"}, address_space_limit_ok=False,
                          one_device_variable="CUDA_VISIBLE_DEVICES")
    #: The card family this adapter claims (the exact names of :data:`KNOWN_CARDS`); None: any card.
    family: ClassVar[str | None] = None

    def __init__(self, local_rank: int = 0) -> None:
        super().__init__(local_rank)
        self._numerics, self._memory = CudaNumerics(self), CudaMemory(self)

    @classmethod
    def availability(cls) -> Availability:
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a core dependency
            return Availability(False, f"torch is not importable: {exc}")
        if torch.version.cuda is None:
            return Availability(False, f"no CUDA device: torch {torch.__version__} is a build without CUDA")
        try:
            if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
                return Availability(False, "no CUDA device")
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
            return Availability(False, f"CUDA is not usable: {' '.join(str(exc).split())}")
        details: dict[str, Any] = {"device_name": names[0], "device_count": len(names)}
        if cls.family is not None:
            card = known_card(names[0])
            if card is None or card.family != cls.family:
                known = ", ".join(n for n, c in KNOWN_CARDS.items() if c.family == cls.family)
                return Availability(False, f"device is {names[0]}, not a known {cls.family} (known: {known})",
                                    details)
            details["variant"] = card.variant
        return Availability(True, "", details)

    def open_device(self) -> Any:
        import torch

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
        if self.local_rank >= torch.cuda.device_count():
            raise SuiteError(f"local rank {self.local_rank} has no GPU: {torch.cuda.device_count()} visible")
        device = torch.device("cuda", self.local_rank)
        torch.cuda.set_device(device)
        return device

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.torch_device)

    def memory(self) -> MemoryMeter:
        return self._memory

    def facts(self) -> dict[str, Any]:
        import torch

        device = self.torch_device
        props = torch.cuda.get_device_properties(device)
        info: dict[str, Any] = {
            "device_name": props.name,
            "device_count": torch.cuda.device_count(),
            "compute_capability": f"{props.major}.{props.minor}",
            "memory_total_bytes": int(props.total_memory),
            "cuda_runtime": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
        try:
            info["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL: absent, not invented
            pass
        nvml = _nvml()
        if nvml is not None:
            try:
                info["driver_version"] = driver_text(nvml.nvmlSystemGetDriverVersion())
            except Exception:  # noqa: BLE001
                pass
        card = known_card(props.name)
        if card is not None:
            info["variant"] = card.variant
            info["peak_bf16_flops"] = card.peak_bf16_flops
        return info


class H100Adapter(CUDAAdapter):
    name = "h100"
    traits = dataclasses.replace(CUDAAdapter.traits,
                                 description="NVIDIA H100 (SXM5, PCIe, NVL; CUDA); refuses any other card")
    family = "H100"


class A100Adapter(CUDAAdapter):
    name = "a100"
    traits = dataclasses.replace(CUDAAdapter.traits,
                                 description="NVIDIA A100 (SXM4, PCIe; CUDA); refuses any other card")
    family = "A100"

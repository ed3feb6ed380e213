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
    peak_fp32_flops: float  # FP32 (CUDA cores; the suite switches TF32 off, so fp32 runs at this peak)

    def peak_flops(self) -> dict[str, float]:
        """The dense peak of each precision the suite runs, FLOP/s."""
        return {"bf16": self.peak_bf16_flops, "fp32": self.peak_fp32_flops}


#: NVIDIA cards by the exact name CUDA reports. Dense bf16 peaks: H100 SXM5 989.4, PCIe 756, NVL 835 TFLOP/s (the
#: data sheets' 1979 / 1513 / 1671 "with sparsity", halved); H200 SXM 989.4, H200 NVL 835; A100 312 (SXM4, PCIe).
#: FP32: H100 SXM5 66.9, PCIe 51.2, NVL 60; H200 66.9 / 60; A100 19.5 TFLOP/s. "NVIDIA A100-SXM-80GB" is how some
#: drivers name the SXM4 80 GB card (DGX A100 systems).
KNOWN_CARDS: dict[str, CudaCard] = {
    "NVIDIA H100 80GB HBM3": CudaCard("H100", "SXM5 80GB", 989.4e12, 66.9e12),
    "NVIDIA H100 PCIe": CudaCard("H100", "PCIe 80GB", 756e12, 51.2e12),
    "NVIDIA H100 NVL": CudaCard("H100", "NVL 94GB", 835e12, 60e12),
    "NVIDIA H200": CudaCard("H200", "SXM 141GB", 989.4e12, 66.9e12),
    "NVIDIA H200 NVL": CudaCard("H200", "NVL 141GB", 835e12, 60e12),
    "NVIDIA A100-SXM4-80GB": CudaCard("A100", "SXM4 80GB", 312e12, 19.5e12),
    "NVIDIA A100-SXM-80GB": CudaCard("A100", "SXM4 80GB", 312e12, 19.5e12),
    "NVIDIA A100-SXM4-40GB": CudaCard("A100", "SXM4 40GB", 312e12, 19.5e12),
    "NVIDIA A100 80GB PCIe": CudaCard("A100", "PCIe 80GB", 312e12, 19.5e12),
    "NVIDIA A100-PCIE-40GB": CudaCard("A100", "PCIe 40GB", 312e12, 19.5e12),
}
#: The oldest Linux driver that runs each CUDA major (NVIDIA's minor-version compatibility: any 12.x on >= 525.60.13,
#: any 13.x on >= 580.65.06; CUDA Toolkit release notes, table 3).
DRIVER_FOR_CUDA_MAJOR = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}

#: cuBLAS needs this for deterministic results (set before the first cuBLAS call).
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def known_card(device_name: str) -> CudaCard | None:
    """The card of this exact name (whitespace normalized), or ``None``."""
    return KNOWN_CARDS.get(" ".join(device_name.split()))


def peak_flops(device_name: str, precision: str) -> float | None:
    """The card's dense peak for ``precision`` (``bf16``, ``fp32``), FLOP/s; ``None`` for a card not in
    :data:`KNOWN_CARDS` (no MFU, never a guess)."""
    card = known_card(device_name)
    return card.peak_flops().get(precision) if card else None


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version (``/proc/driver/nvidia/version``, else NVML); ``None`` where no driver is
    loaded. Read without CUDA: it is said even where torch cannot open a device."""
    import re

    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as fh:
            found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", fh.read())
        if found:
            return found.group(1)
    except OSError:
        pass
    nvml = _nvml()
    if nvml is not None:
        try:
            return driver_text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - no version, said as such
            return None
    return None


def driver_note(torch_cuda: str | None) -> str:
    """What a "device unavailable" reason adds: the driver's version, and where torch's CUDA build needs a newer
    driver than this one, which."""
    version = driver_version()
    if version is None:
        return "no NVIDIA driver loaded (/proc/driver/nvidia/version absent)"
    note = f"NVIDIA driver {version}"
    major = int(torch_cuda.split(".")[0]) if torch_cuda and torch_cuda.split(".")[0].isdigit() else None
    needed = DRIVER_FOR_CUDA_MAJOR.get(major) if major is not None else None
    have = tuple(int(p) for p in version.split(".") if p.isdigit())
    if needed is not None and have < needed:
        note += (f", older than the {'.'.join(map(str, needed))} that torch's CUDA {torch_cuda} build needs: install "
                 f"a torch built for the CUDA this driver runs, or a newer driver")
    return note


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
        """fp32, and bf16 where the card computes it natively (Ampere and later): torch's plain
        ``is_bf16_supported()`` also says yes for older cards, through emulation at a fraction of the speed."""
        import torch

        try:
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # a torch older than the parameter (2.3): it checked the compute capability itself
            native = torch.cuda.is_bf16_supported()
        return ("fp32", "bf16") if native else ("fp32",)

    def seed_device(self, seed: int) -> None:
        import torch

        torch.cuda.manual_seed_all(seed)

    def pin_numerics(self) -> None:
        """fp32 means fp32, deterministic or not: TF32 would change the numerics."""
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def make_deterministic(self) -> None:
        import torch

        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
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

        return {**super().run_params(), "cuda.cudnn_deterministic": str(torch.backends.cudnn.deterministic).lower(),
                "cuda.tf32": str(torch.backends.cuda.matmul.allow_tf32).lower(),
                "cuda.cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
                "cuda.visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "all")}


class CudaMemory(MemoryMeter):
    """torch's allocator peak, with the driver's view (NVML) beside it: this process's used memory sampled through the
    measured window (what the allocator does not see: DALI's and nvJPEG's own buffers, the CUDA context), its peak
    recorded as ``nvml_process_used_peak``."""

    #: How often NVML is asked for this process's memory during the window, seconds.
    SAMPLE_S = 0.2

    def __init__(self, adapter: DeviceAdapter) -> None:
        super().__init__(adapter)
        self._sampler: Any = None

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.adapter.torch_device)
        self._stop_sampling()
        self._sampler = _NvmlProcessSampler(self.adapter, self.SAMPLE_S)
        self._sampler.start()

    def peak(self) -> DeviceMemory | None:
        import torch

        device = self.adapter.torch_device
        extra = {"reserved_peak": int(torch.cuda.max_memory_reserved(device))}
        sampled = self._stop_sampling()
        driver, how = self._driver_memory()
        extra.update(driver)
        if sampled is not None:
            extra["nvml_process_used_peak"] = sampled
            how += f"; this process's peak sampled every {self.SAMPLE_S:g} s over the measured window"
        return DeviceMemory(peak_bytes=int(torch.cuda.max_memory_allocated(device)),
                            source=f"torch.cuda.max_memory_allocated; driver view: {how}", extra=extra)

    def current_bytes(self) -> int | None:
        import torch

        return int(torch.cuda.memory_allocated(self.adapter.torch_device))  # the allocator's count: no sync

    def _stop_sampling(self) -> int | None:
        sampler, self._sampler = self._sampler, None
        return sampler.stop() if sampler is not None else None

    def _driver_memory(self) -> tuple[dict[str, int], str]:
        """The driver's view at the end: this process's memory; where NVML cannot match the process (a container's
        PIDs are not the host's), the device's used memory, named as such; and what was read or why nothing was."""
        nvml = _nvml()
        if nvml is None:
            return {}, "not read: nvidia-ml-py absent or no driver"
        try:
            handle = nvml_handle(nvml, self.adapter)
            used_by_us = process_used(nvml, handle)
            if used_by_us is not None:
                return {"nvml_process_used_at_end": used_by_us}, "NVML, this process"
            used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception as exc:  # noqa: BLE001 - no driver view, not a failure: recorded why
            return {}, f"not read: NVML failed ({type(exc).__name__}: {' '.join(str(exc).split())})"
        return ({"nvml_device_used_at_end": used},
                "NVML lists no process with this PID (in a container PIDs differ from the host's): the whole "
                "device's used memory instead, every process on it included")


def process_used(nvml: Any, handle: Any) -> int | None:
    """This process's used memory on the card, as NVML lists it (``None`` where it does not list this PID)."""
    for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if process.pid == os.getpid() and process.usedGpuMemory is not None:
            return int(process.usedGpuMemory)
    return None


class _NvmlProcessSampler:
    """A thread reading :func:`process_used` every ``interval_s`` until stopped; its peak (``None`` where NVML could
    not be asked or never listed this process)."""

    def __init__(self, adapter: DeviceAdapter, interval_s: float) -> None:
        import threading

        self._adapter, self._interval = adapter, interval_s
        self._peak: int | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="suite-nvml-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _sample(self) -> None:
        nvml = _nvml()
        if nvml is None:
            return
        try:
            handle = nvml_handle(nvml, self._adapter)
            while True:
                used = process_used(nvml, handle)
                if used is not None:
                    self._peak = max(self._peak or 0, used)
                if self._halt.wait(self._interval):
                    return
        except Exception:  # noqa: BLE001 - no sampled view: the end-of-run reading says why
            return

    def stop(self) -> int | None:
        self._halt.set()
        self._thread.join(timeout=5)
        return self._peak


def nvml_handle(nvml: Any, adapter: DeviceAdapter) -> Any:
    """NVML's handle of the card torch calls this rank's device: found by the UUID torch reports for it (right
    whatever ``CUDA_VISIBLE_DEVICES`` holds: indices, ``GPU-...`` UUIDs, MIG ids), else by the PCI bus id, else by
    the index ``CUDA_VISIBLE_DEVICES`` names (:func:`physical_index`)."""
    import torch

    props = torch.cuda.get_device_properties(adapter.torch_device)
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        return nvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{device:02x}.0")
    return nvml.nvmlDeviceGetHandleByIndex(physical_index(adapter.local_rank))


def physical_index(local_rank: int) -> int:
    """The GPU index NVML knows this rank's device by where ``CUDA_VISIBLE_DEVICES`` lists indices (it renumbers
    them for torch); a UUID there is not an index: :func:`nvml_handle` finds the card by UUID first."""
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
            return Availability(False, f"no CUDA device: torch {torch.__version__} is a build without CUDA "
                                       f"({driver_note(None)})")
        try:
            if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
                return Availability(False, f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}; "
                                           f"{driver_note(torch.version.cuda)})")
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
            return Availability(False, f"CUDA is not usable: {' '.join(str(exc).split())} "
                                       f"({driver_note(torch.version.cuda)})")
        details: dict[str, Any] = {"device_name": names[0], "device_count": len(names)}
        if cls.family is not None:
            card = known_card(names[0])
            if card is None or card.family != cls.family:
                known = ", ".join(n for n, c in KNOWN_CARDS.items() if c.family == cls.family)
                return Availability(False, f"device is {names[0]}, not a known {cls.family} (known: {known}; "
                                           f"{driver_note(torch.version.cuda)})", details)
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
            info["peak_flops"] = card.peak_flops()
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

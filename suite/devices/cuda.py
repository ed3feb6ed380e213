"""NVIDIA GPUs: one CUDA implementation, three registered adapters.

* ``cuda`` - any NVIDIA GPU (the card is recorded; peak FLOP/s only for cards in :data:`PEAK_BF16_FLOPS`);
* ``h100`` and ``a100`` - the same code, but available only when the card *is* that model: an H200 or an
  A100 is never benchmarked under the name ``h100``.

Timing synchronizes with ``torch.cuda.synchronize``; device memory is the caching allocator's peak
(``torch.cuda.max_memory_allocated``, plus ``max_memory_reserved`` and, with nvidia-ml-py, the driver's
view of this process's memory, each under its own name); the ``device`` loader decodes JPEGs with nvJPEG
through ``torchvision.io.decode_jpeg(..., device="cuda")``, a whole batch per call. torchvision and
nvidia-ml-py come with the ``cuda`` extra and are imported only here.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Sequence

from suite.devices.base import Availability, DeviceAdapter, DeviceMemory
from suite.errors import SuiteError

#: Dense (no sparsity) bf16 tensor-core peak per card, FLOP/s, from NVIDIA's data sheets. Matched in order
#: against the device name (``torch.cuda.get_device_name``); unknown cards get no MFU.
PEAK_BF16_FLOPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H100", "PCIe"), 756e12),
    (("H100", "NVL"), 835e12),
    (("H100",), 989.4e12),  # SXM5
    (("H200",), 989.4e12),
    (("A100",), 312e12),  # SXM4 and PCIe alike
)

#: cuBLAS needs this for deterministic results (set before the first cuBLAS call).
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def peak_bf16_flops(device_name: str) -> float | None:
    for needles, flops in PEAK_BF16_FLOPS:
        if all(n.lower() in device_name.lower() for n in needles):
            return flops
    return None


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


class CUDAAdapter(DeviceAdapter):
    name: ClassVar[str] = "cuda"
    description: ClassVar[str] = "Any NVIDIA GPU (CUDA), identified in the records"
    distributed_backend: ClassVar[str] = "nccl"
    #: Substring the device name must contain for this adapter to claim the card (None: any card).
    required_model: ClassVar[str | None] = None

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
        details = {"device_name": names[0], "device_count": len(names)}
        if cls.required_model and cls.required_model.lower() not in names[0].lower():
            return Availability(False, f"device is {names[0]}, not {cls.required_model}", details)
        return Availability(True, "", details)

    def _create_device(self) -> Any:
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

    def _seed_device(self, seed: int) -> None:
        import torch

        torch.cuda.manual_seed_all(seed)

    def configure_determinism(self) -> None:
        import torch

        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") is None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: TF32 would change the numerics
        torch.backends.cudnn.allow_tf32 = False
        super().configure_determinism()

    def run_params(self) -> dict[str, str]:
        import torch

        return {"cuda.deterministic": "cudnn.deterministic+use_deterministic_algorithms",
                "cuda.tf32": str(torch.backends.cuda.matmul.allow_tf32).lower(),
                "cuda.cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")}

    def supported_precisions(self) -> tuple[str, ...]:
        import torch

        return ("fp32", "bf16") if torch.cuda.is_bf16_supported() else ("fp32",)

    def numerics(self, precision: str) -> dict[str, str]:
        """As the base, but fp32 matmuls are TF32 where torch allows it (the suite switches it off)."""
        import torch

        numerics = super().numerics(precision)
        if precision == "fp32":
            if torch.backends.cuda.matmul.allow_tf32:
                numerics["linear"] = "tf32"
                numerics["attn"] = "tf32"
        return numerics

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.torch_device)

    def peak_memory(self) -> DeviceMemory | None:
        import torch

        extra = {"reserved_peak": int(torch.cuda.max_memory_reserved(self.torch_device))}
        driver = self._driver_process_memory()
        if driver is not None:
            extra["nvml_process_used_at_end"] = driver
        return DeviceMemory(peak_bytes=int(torch.cuda.max_memory_allocated(self.torch_device)),
                            source="torch.cuda.max_memory_allocated", extra=extra)

    def _driver_process_memory(self) -> int | None:
        """This process's device memory as the driver sees it (NVML has no peak: read at the end)."""
        nvml = _nvml()
        if nvml is None:
            return None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(self._physical_index())
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == os.getpid() and process.usedGpuMemory is not None:
                    return int(process.usedGpuMemory)
        except Exception:  # noqa: BLE001 - no driver view, not a failure
            return None
        return None

    def _physical_index(self) -> int:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            entries = [v.strip() for v in visible.split(",") if v.strip()]
            if self.local_rank < len(entries) and entries[self.local_rank].isdigit():
                return int(entries[self.local_rank])
        return self.local_rank

    def decode_images(self, encoded: Sequence[bytes]) -> list[Any]:
        """nvJPEG on the GPU, one call per batch; JPEG only (anything else is an error naming it)."""
        import torch

        try:
            from torchvision.io import ImageReadMode, decode_jpeg
        except ImportError as exc:
            raise SuiteError("the device loader on CUDA needs torchvision (nvJPEG): "
                             f"pip install 'suite-bench[cuda]' ({exc})") from exc
        for index, data in enumerate(encoded):
            if not data.startswith(b"\xff\xd8"):
                raise SuiteError(f"nvJPEG decodes JPEG only; image {index} of the batch is not a JPEG")
        tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in encoded]
        images = list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.torch_device))
        self.decoded_by = "nvjpeg"
        return images

    def dali_device_id(self) -> int | None:
        return self.torch_device.index if self.torch_device.index is not None else 0

    def device_info(self) -> dict[str, Any]:
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
        nvml = _nvml()
        if nvml is not None:
            try:
                info["driver_version"] = _text(nvml.nvmlSystemGetDriverVersion())
            except Exception:  # noqa: BLE001
                pass
        peak = peak_bf16_flops(props.name)
        if peak is not None:
            info["peak_bf16_flops"] = peak
        return info


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class H100Adapter(CUDAAdapter):
    name = "h100"
    description = "NVIDIA H100 (CUDA); refuses any other card"
    required_model = "H100"


class A100Adapter(CUDAAdapter):
    name = "a100"
    description = "NVIDIA A100 (CUDA); refuses any other card"
    required_model = "A100"

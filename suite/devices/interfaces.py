"""The small interfaces a device adapter hands out (as Lightning's accelerators leave precision to precision plugins):

* :class:`Numerics` (``adapter.numerics()``): the precisions the device runs, autocast, the lowest precisions
  disclosed to MLPerf, deterministic kernels and seeding;
* :class:`TrainingOps` (``adapter.training()``): preparing the framework, placing the model and tensors, the
  optimizer and gradient clipping (Habana's fused ones on Gaudi2), the step boundary (HPU lazy mode's mark_step);
* :class:`MemoryMeter` (``adapter.memory()``): the peak device memory of a window;
* :class:`DeviceDecoders` (``adapter.decoders``): the on-device image decoders built for the configuration.

Each holds the adapter it serves (``self.adapter``) for its torch device, name and local rank. An adapter with its
own behaviour subclasses the interface and returns its subclass.
"""

from __future__ import annotations

import contextlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Iterable

from suite.errors import ConfigError
from suite.registry import load_decoder

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter


def seed_everything(seed: int) -> None:
    """Seed the host's RNGs as every run does: Python, NumPy, torch (CPU and, where present, CUDA)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Numerics:
    """How a device computes: its precisions, autocast, what MLPerf asks to disclose, determinism, seeding."""

    def __init__(self, adapter: "DeviceAdapter") -> None:
        self.adapter = adapter

    def supported(self) -> tuple[str, ...]:
        """Precisions this device runs (a subset of :data:`suite.config.PRECISIONS`)."""
        return ("fp32",)

    def autocast(self, precision: str) -> ContextManager[Any]:
        """The autocast context for ``precision``; an unsupported precision is an error, never a swap."""
        import torch

        name = self.adapter.name
        if precision not in self.supported():
            raise ConfigError(f"precision {precision!r} is not supported on {name}; "
                              f"supported: {', '.join(self.supported())}")
        if precision == "fp32":
            return contextlib.nullcontext()
        if precision == "bf16":
            return torch.autocast(device_type=self.adapter.torch_device.type, dtype=torch.bfloat16)
        raise ConfigError(f"precision {precision!r} has no autocast rule on {name}")

    def precision_in_force(self, parameters: Iterable[Any]) -> str:
        """The precision a forward pass runs in, read from torch while it runs (never the request): ``bf16`` under
        bfloat16 autocast, ``fp32`` without autocast over float32 parameters; anything else as torch holds it
        (``autocast float16``, ``parameters bfloat16``)."""
        import torch

        device_type = self.adapter.torch_device.type
        try:
            autocast_on = torch.is_autocast_enabled(device_type)
            autocast_dtype = torch.get_autocast_dtype(device_type) if autocast_on else None
        except (TypeError, AttributeError):  # torch < 2.4: one switch and one dtype per CPU / GPU
            on_cpu = device_type == "cpu"
            autocast_on = torch.is_autocast_cpu_enabled() if on_cpu else torch.is_autocast_enabled()
            autocast_dtype = (torch.get_autocast_cpu_dtype() if on_cpu else torch.get_autocast_gpu_dtype()) \
                if autocast_on else None
        if autocast_dtype is not None:
            return "bf16" if autocast_dtype == torch.bfloat16 else f"autocast {str(autocast_dtype)[6:]}"
        dtypes = sorted({str(p.dtype)[6:] for p in parameters if p.is_floating_point()})  # "torch.float32"[6:]
        if dtypes == ["float32"]:
            return "fp32"
        return "parameters " + ", ".join(dtypes) if dtypes else "no floating-point parameters"

    def lowest_precisions(self, precision: str) -> dict[str, str]:
        """The lowest numerical precision of linear layers, attention and gradient communication when running
        ``precision`` (MLPerf's disclosures; its spelling: ``fp32``, ``bfloat16``...). bf16 autocast runs matmuls
        in bfloat16; gradients of fp32 parameters are reduced in fp32."""
        compute = "bfloat16" if precision == "bf16" else "fp32"
        return {"linear": compute, "attn": compute, "comm": "fp32"}

    def pin_numerics(self) -> None:
        """Fix what the device would otherwise choose for the precision asked (CUDA's TF32), whether or not the run
        is deterministic."""

    def make_deterministic(self) -> None:
        """Ask the framework for deterministic kernels (``torch.use_deterministic_algorithms``), without filling
        every uninitialized tensor (``torch.empty``) with NaN, which that switch also turns on: the results are
        deterministic either way, and the filling only costs time (issue 47 (8))."""
        import torch
        import torch.utils.deterministic

        torch.use_deterministic_algorithms(True, warn_only=False)
        setattr(torch.utils.deterministic, "fill_uninitialized_memory", False)  # a property of the module

    def seed(self, seed: int) -> None:
        """Seed every RNG involved: Python, NumPy, torch, and the device's own generators."""
        seed_everything(seed)
        self.seed_device(seed)

    def seed_device(self, seed: int) -> None:
        """Seed device-specific generators (torch.manual_seed already covers CPU and CUDA)."""

    def run_params(self) -> dict[str, str]:
        """How the device computes where it has a choice (e.g. CUDA's TF32 switch), recorded as MLflow params; the
        determinism switches as torch holds them (what ran, not what was asked)."""
        import torch
        import torch.utils.deterministic

        return {"deterministic_algorithms": str(torch.are_deterministic_algorithms_enabled()).lower(),
                "fill_uninitialized_memory": str(bool(getattr(torch.utils.deterministic,
                                                                   "fill_uninitialized_memory"))).lower()}


class TrainingOps:
    """What training does on the device: torch's AdamW and ``clip_grad_norm_`` here; a device with its own (Habana's
    fused ones, HPU lazy mode) returns a subclass from ``adapter.training()``."""

    def __init__(self, adapter: "DeviceAdapter") -> None:
        self.adapter = adapter

    def prepare_framework(self) -> None:
        """Called once before the workload builds its model (e.g. optimum-habana's ``adapt_transformers_to_gaudi``)."""

    def place_model(self, model: Any) -> Any:
        """Move a model to the device; a device may also wrap it (e.g. HPU graphs)."""
        return model.to(self.adapter.torch_device)

    def to_device(self, tensor: Any) -> Any:
        return tensor.to(self.adapter.torch_device, non_blocking=True)

    def make_optimizer(self, params: Any, lr: float, eps: float, weight_decay: float) -> tuple[Any, str]:
        """AdamW for ``params`` and a description of which implementation runs (recorded with the run)."""
        import torch

        optimizer = torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=weight_decay)
        return optimizer, f"torch.optim.AdamW(lr={lr}, eps={eps}, weight_decay={weight_decay})"

    def clip_grad_norm(self, params: Any, max_norm: float) -> None:
        """Clip the global gradient norm of ``params`` to ``max_norm``."""
        import torch

        torch.nn.utils.clip_grad_norm_(params, max_norm)

    def step_boundary(self) -> None:
        """Called once per training step after the optimizer step (e.g. HPU lazy-mode ``mark_step``)."""

    def run_params(self) -> dict[str, str]:
        """How training runs on the device (e.g. HPU lazy or eager mode, the fused optimizer), as MLflow params."""
        return {}


@dataclass(frozen=True)
class DeviceMemory:
    """Peak device memory since the last reset.

    ``peak_bytes`` is the figure reported as ``device_peak_memory_bytes``; ``source`` names how it was
    read (e.g. ``torch.cuda.max_memory_allocated``). ``extra`` holds other views under distinct names
    (e.g. the driver's), each in bytes. ``host_memory`` is true where the device has no memory of its own and the
    figure is the host's (a CPU: the same memory as the host RAM figures); readers caption it from the record's
    ``device_peak_memory_is_host``, never from the device's name.
    """

    peak_bytes: int
    source: str
    extra: dict[str, int] = field(default_factory=dict)
    host_memory: bool = False


class MemoryMeter(ABC):
    """The device's peak memory over a window (readings are never invented: absent where unreadable)."""

    def __init__(self, adapter: "DeviceAdapter") -> None:
        self.adapter = adapter

    @abstractmethod
    def reset_peak(self) -> None:
        """Start a new peak-memory window."""

    @abstractmethod
    def peak(self) -> DeviceMemory | None:
        """Peak device memory since :meth:`reset_peak`, or ``None`` if it cannot be read."""

    def current_bytes(self) -> int | None:
        """Device memory in use now (read after every measured step for the memory trend: it must not synchronize
        the device), or ``None`` where the device has no memory of its own or it cannot be read cheaply."""
        return None


class DeviceDecoders:
    """The decoders (``suite.decoders`` entry points) that serve the adapter's on-device loaders, one instance per
    configuration, built on first use and closed with the adapter."""

    def __init__(self, adapter: "DeviceAdapter") -> None:
        self.adapter = adapter
        self._built: dict[str, Any] = {}

    def for_loader(self, loader: str) -> Any:
        """The decoder that serves ``loader`` on this device."""
        names = self.adapter.traits.decoders
        if loader not in names:
            raise ConfigError(f"loader {loader!r} has no decoder on {self.adapter.name}; supported: "
                              f"{', '.join(self.adapter.traits.supported_loaders)}")
        if loader not in self._built:
            self._built[loader] = load_decoder(names[loader])(self.adapter)
        return self._built[loader]

    def builds(self) -> int:
        """Pipelines the decoders built so far (a step that builds one is timed with it)."""
        return sum(decoder.builds for decoder in self._built.values())

    def close(self) -> None:
        for decoder in self._built.values():
            decoder.close()
        self._built.clear()

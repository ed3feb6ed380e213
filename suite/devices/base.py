"""The device adapter interface.

One adapter per device kind (cpu, gaudi2, h100, a100, ...), each a small module registered in the
``suite.devices`` entry-point group. The runner talks to devices only through this interface, so timing,
seeding and memory accounting are the same code path on every device. An adapter keeps to what a device is:
availability with its reason, set-up and teardown, synchronization, memory, seeding, autocast, the distributed
backend and its facts. Image decoding on the device is a family of its own (:mod:`suite.decoders`): an adapter
only names the decoder of each loader kind (:attr:`DeviceAdapter.decoders`). A device's own optimizer and
gradient clipping (Habana's fused ones) sit behind one optional hook, :meth:`DeviceAdapter.training_ops`.

Rules every adapter follows:

* :meth:`DeviceAdapter.availability` never raises; it returns a precise reason when the device is
  absent ("no CUDA device", "habana_frameworks not installed", ...).
* An unavailable device is never replaced by another one: :meth:`DeviceAdapter.setup` raises
  :class:`~suite.errors.DeviceUnavailableError` and the run is recorded as FAILED with that reason.
* Readings are never invented: where a figure cannot be read, it is absent, not zero.
"""

from __future__ import annotations

import contextlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, ContextManager, Mapping

from suite.errors import ConfigError, DeviceUnavailableError, SuiteError

if TYPE_CHECKING:
    from suite.config import RunConfig


@dataclass(frozen=True)
class Availability:
    """Whether a device can be used here, and why not when it cannot."""

    available: bool
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceMemory:
    """Peak device memory since the last reset.

    ``peak_bytes`` is the figure reported as ``device_peak_memory_bytes``; ``source`` names how it was
    read (e.g. ``torch.cuda.max_memory_allocated``). ``extra`` holds other views under distinct names
    (e.g. the driver's), each in bytes.
    """

    peak_bytes: int
    source: str
    extra: dict[str, int] = field(default_factory=dict)


def driver_text(value: Any) -> str:
    """A string a driver library returns (NVML, HLML: bytes or str) as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def seed_everything(seed: int) -> None:
    """Seed the host's RNGs as every run does: Python, NumPy, torch (CPU and, where present, CUDA)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class TrainingOps:
    """The optimizer and the gradient clipping a device runs: torch's AdamW and ``clip_grad_norm_`` here; a device
    with its own (Habana's fused ones) returns another from :meth:`DeviceAdapter.training_ops`."""

    def make_optimizer(self, params: Any, lr: float, eps: float, weight_decay: float) -> tuple[Any, str]:
        """AdamW for ``params`` and a description of which implementation runs (recorded with the run)."""
        import torch

        optimizer = torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=weight_decay)
        return optimizer, f"torch.optim.AdamW(lr={lr}, eps={eps}, weight_decay={weight_decay})"

    def clip_grad_norm(self, params: Any, max_norm: float) -> None:
        """Clip the global gradient norm of ``params`` to ``max_norm``."""
        import torch

        torch.nn.utils.clip_grad_norm_(params, max_norm)


class DeviceAdapter(ABC):
    """Everything the suite needs from one kind of device."""

    #: Registered name, as used on the command line (``--device NAME``).
    name: ClassVar[str]
    #: One-line description for listings.
    description: ClassVar[str]
    #: torch.distributed backend for multi-device runs (gloo, nccl, hccl).
    distributed_backend: ClassVar[str]
    #: The decoder (``suite.decoders`` entry point) serving each on-device loader kind (``device``, ``dali``).
    decoders: ClassVar[Mapping[str, str]] = {}
    #: Loaders this device supports: the worker-side ones, and those it has a decoder for (derived).
    supported_loaders: ClassVar[tuple[str, ...]] = ("cpu", "cpu-fast")
    #: Whether ``--memory-limit`` (RLIMIT_AS) can apply: False where the device's driver reserves address space
    #: far beyond what the process uses (the CUDA driver maps about twice the GPU memory).
    address_space_limit_ok: ClassVar[bool] = True
    #: Whether asking :meth:`availability` opens the device (a CUDA context, Habana's bridge): then it is asked in a
    #: short-lived process (:mod:`suite.devices.probe`), never by a parent whose children need the device.
    probe_claims_device: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.supported_loaders = ("cpu", "cpu-fast", *cls.decoders)

    @classmethod
    def child_environment(cls, nproc_per_node: int) -> dict[str, str]:
        """Environment variables the configuration process needs, set by the runner before it starts (e.g. the one
        GPU a single-process configuration may see)."""
        return {}

    def __init__(self, local_rank: int = 0) -> None:
        self.local_rank = local_rank
        self._device: Any = None
        self._decoders: dict[str, Any] = {}

    # --- identity and availability -------------------------------------------------------
    @classmethod
    @abstractmethod
    def availability(cls) -> Availability:
        """Whether this device is usable here; never raises."""

    @abstractmethod
    def device_info(self) -> dict[str, Any]:
        """Facts for the manifest: device name, count, driver/runtime versions, memory, peak FLOP/s."""

    # --- lifecycle -------------------------------------------------------------------------
    def setup(self) -> Any:
        """Claim the device and return its ``torch.device``.

        Raises :class:`DeviceUnavailableError` (with the availability reason) when it is absent.
        """
        avail = self.availability()
        if not avail.available:
            raise DeviceUnavailableError(f"device {self.name!r} is not available: {avail.reason}")
        self._device = self._create_device()
        return self._device

    @abstractmethod
    def _create_device(self) -> Any:
        """Return the ``torch.device`` for this rank (called once the device is known available)."""

    @property
    def torch_device(self) -> Any:
        if self._device is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not been called")
        return self._device

    def teardown(self) -> None:
        """Release what :meth:`setup` claimed (and the decoders built since)."""
        for decoder in self._decoders.values():
            decoder.close()
        self._decoders.clear()

    # --- execution -------------------------------------------------------------------------
    @abstractmethod
    def synchronize(self) -> None:
        """Block until all queued work on the device is done (timers read the clock after this)."""

    def step_boundary(self) -> None:
        """Called once per training step after the optimizer step (e.g. HPU lazy-mode ``mark_step``)."""

    def prepare_framework(self) -> None:
        """Called once before the workload builds its model (e.g. optimum-habana's
        ``adapt_transformers_to_gaudi()``)."""

    def place_model(self, model: Any) -> Any:
        """Move a model to the device; adapters may also wrap it (e.g. HPU graphs)."""
        return model.to(self.torch_device)

    def training_ops(self) -> TrainingOps:
        """The optimizer and gradient clipping this device runs (torch's unless the device has its own)."""
        return TrainingOps()

    def run_params(self) -> dict[str, str]:
        """How the device runs (e.g. HPU lazy or eager mode), recorded as MLflow params of the run."""
        return {}

    def to_device(self, tensor: Any) -> Any:
        return tensor.to(self.torch_device, non_blocking=True)

    # --- numerics ---------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        """Seed every RNG involved: Python, NumPy, torch, and the device's own generators."""
        seed_everything(seed)
        self._seed_device(seed)

    def _seed_device(self, seed: int) -> None:
        """Seed device-specific generators (torch.manual_seed already covers CPU and CUDA)."""

    def configure_determinism(self) -> None:
        """Ask the framework for deterministic kernels (``torch.use_deterministic_algorithms``)."""
        import torch

        torch.use_deterministic_algorithms(True, warn_only=False)

    @abstractmethod
    def supported_precisions(self) -> tuple[str, ...]:
        """Precisions this device runs (a subset of :data:`suite.config.PRECISIONS`)."""

    def autocast(self, precision: str) -> ContextManager[Any]:
        """The autocast context for ``precision``; an unsupported precision is an error, never a swap."""
        import torch

        if precision not in self.supported_precisions():
            raise ConfigError(
                f"precision {precision!r} is not supported on {self.name}; "
                f"supported: {', '.join(self.supported_precisions())}"
            )
        if precision == "fp32":
            return contextlib.nullcontext()
        if precision == "bf16":
            return torch.autocast(device_type=self.torch_device.type, dtype=torch.bfloat16)
        raise ConfigError(f"precision {precision!r} has no autocast rule on {self.name}")

    def numerics(self, precision: str) -> dict[str, str]:
        """The lowest numerical precision of linear layers, attention and gradient communication when running
        ``precision`` (MLPerf's disclosures; its spelling: ``fp32``, ``bfloat16``...). bf16 autocast runs matmuls
        in bfloat16; gradients of fp32 parameters are reduced in fp32."""
        compute = "bfloat16" if precision == "bf16" else "fp32"
        return {"linear": compute, "attn": compute, "comm": "fp32"}

    # --- memory -----------------------------------------------------------------------------
    @abstractmethod
    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window."""

    @abstractmethod
    def peak_memory(self) -> DeviceMemory | None:
        """Peak device memory since :meth:`reset_peak_memory`, or ``None`` if it cannot be read."""

    # --- on-device image decoding -----------------------------------------------------------
    def decoder_builds(self) -> int:
        """Pipelines the decoders built so far (a step that builds one is timed with it)."""
        return sum(decoder.builds for decoder in self._decoders.values())

    def decoder_for(self, loader: str) -> Any:
        """The decoder (one instance per configuration) that serves ``loader`` on this device."""
        if loader not in self.decoders:
            raise ConfigError(f"loader {loader!r} has no decoder on {self.name}; supported: "
                              f"{', '.join(self.supported_loaders)}")
        if loader not in self._decoders:
            from suite.registry import load_decoder

            self._decoders[loader] = load_decoder(self.decoders[loader])(self)
        return self._decoders[loader]


def prepare_device(config: "RunConfig", adapter: Any) -> None:
    """Refuse a loader or precision the device does not run (never swap it), then make it deterministic
    and seed every RNG. Shared by the run process and the pytest plugin."""
    if config.loader not in adapter.supported_loaders:
        raise SuiteError(
            f"loader {config.loader!r} is not supported on {config.device}; "
            f"supported: {', '.join(adapter.supported_loaders)}"
        )
    adapter.autocast(config.precision)  # fails now, not mid-run, if the precision is unsupported
    adapter.configure_determinism()
    adapter.seed(config.seed)

"""The device adapter interface.

One adapter per device kind (cpu, gaudi2, h100, a100, ...), each a small module registered in the
``suite.devices`` entry-point group. The runner talks to devices only through this interface, so timing,
seeding and memory accounting are the same code path on every device. An adapter keeps to what a device is:
its traits, availability with its reason, set-up and teardown, synchronization and its facts; it hands out the
small interfaces of :mod:`.interfaces` for the rest: :meth:`~DeviceAdapter.numerics` (precisions, autocast,
determinism, seeding), :meth:`~DeviceAdapter.training` (model placement, optimizer, clipping, step boundary) and
:meth:`~DeviceAdapter.memory` (peak device memory). Image decoding on the device is a family of its own
(:mod:`suite.decoders`): an adapter only names the decoder of each loader kind (:attr:`DeviceTraits.decoders`) and
keeps those it built (``adapter.decoders``).

Rules every adapter follows:

* :meth:`DeviceAdapter.availability` never raises; it returns a precise reason when the device is
  absent ("no CUDA device", "habana_frameworks not installed", ...).
* An unavailable device is never replaced by another one: :meth:`DeviceAdapter.setup` raises
  :class:`~suite.errors.DeviceUnavailableError` and the run is recorded as FAILED with that reason.
* Readings are never invented: where a figure cannot be read, it is absent, not zero.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from suite.devices.interfaces import DeviceDecoders, MemoryMeter, Numerics, TrainingOps
from suite.errors import DeviceUnavailableError, SuiteError

if TYPE_CHECKING:
    from suite.config import RunConfig

#: Loaders every device runs: decoding and preprocessing in the DataLoader workers.
WORKER_LOADERS = ("cpu", "cpu-fast")


@dataclass(frozen=True)
class Availability:
    """Whether a device can be used here, and why not when it cannot."""

    available: bool
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceTraits:
    """What a kind of device is, known without opening it."""

    #: One-line description for listings.
    description: str
    #: torch.distributed backend for multi-device runs (gloo, nccl, hccl).
    distributed_backend: str
    #: The decoder (``suite.decoders`` entry point) serving each on-device loader kind (``device``, ``dali``).
    decoders: Mapping[str, str] = field(default_factory=dict)
    #: Whether ``--memory-limit`` (RLIMIT_AS) can apply: False where the device's driver reserves address space
    #: far beyond what the process uses (the CUDA driver maps about twice the GPU memory).
    address_space_limit_ok: bool = True
    #: Whether asking ``availability()`` opens the device (a CUDA context, Habana's bridge): then it is asked in a
    #: short-lived process (:mod:`suite.devices.probe`), never by a parent whose children need the device.
    probe_claims_device: bool = True
    #: The variable that narrows what a process sees to one device (``CUDA_VISIBLE_DEVICES``): a single-process
    #: configuration is given only the first device allowed, so that nothing in it spreads over the node (the
    #: transformers Trainer wraps a model in ``nn.DataParallel`` over every visible GPU). None: no such variable.
    one_device_variable: str | None = None
    #: Environment variables a configuration process gets unless the user set them: how the published method ran
    #: the device (Gaudi2: ``PT_HPU_LAZY_MODE=1``, the lazy mode the published benchmark measured, where the stack
    #: defaults to eager).
    child_defaults: Mapping[str, str] = field(default_factory=dict)

    @property
    def supported_loaders(self) -> tuple[str, ...]:
        """The worker-side loaders, and those the device has a decoder for."""
        return (*WORKER_LOADERS, *self.decoders)


def driver_text(value: Any) -> str:
    """A string a driver library returns (NVML, HLML: bytes or str) as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class DeviceAdapter(ABC):
    """Everything the suite needs from one kind of device (twelve members; the rest is handed out)."""

    #: Registered name, as used on the command line (``--device NAME``).
    name: ClassVar[str]
    #: What the device is, known without opening it.
    traits: ClassVar[DeviceTraits]

    def __init__(self, local_rank: int = 0) -> None:
        self.local_rank = local_rank
        self._device: Any = None
        self.decoders = DeviceDecoders(self)
        self._numerics, self._training = Numerics(self), TrainingOps(self)

    @classmethod
    @abstractmethod
    def availability(cls) -> Availability:
        """Whether this device is usable here; never raises."""

    def setup(self) -> Any:
        """Claim the device and return its ``torch.device`` (then also :attr:`torch_device`).

        Raises :class:`DeviceUnavailableError` (with the availability reason) when it is absent.
        """
        avail = self.availability()
        if not avail.available:
            raise DeviceUnavailableError(f"device {self.name!r} is not available: {avail.reason}")
        self._device = self.open_device()
        return self._device

    @property
    def torch_device(self) -> Any:
        """The ``torch.device`` :meth:`setup` claimed."""
        if self._device is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not been called")
        return self._device

    @abstractmethod
    def open_device(self) -> Any:
        """Return the ``torch.device`` for this rank (called once the device is known available)."""

    def teardown(self) -> None:
        """Release what :meth:`setup` claimed (and the decoders built since)."""
        self.decoders.close()

    @abstractmethod
    def synchronize(self) -> None:
        """Block until all queued work on the device is done (timers read the clock after this)."""

    @abstractmethod
    def facts(self) -> dict[str, Any]:
        """Facts for the manifest: device name, count, driver/runtime versions, memory, peak FLOP/s."""

    def numerics(self) -> Numerics:
        """Precisions, autocast, MLPerf's disclosures, determinism and seeding on this device."""
        return self._numerics

    def training(self) -> TrainingOps:
        """Model placement, the optimizer, gradient clipping and the step boundary on this device."""
        return self._training

    @abstractmethod
    def memory(self) -> MemoryMeter:
        """The device's peak-memory meter."""


def child_environment(adapter: type[DeviceAdapter], nproc_per_node: int) -> dict[str, str]:
    """Environment variables a configuration process on ``adapter``'s device needs, set by the runner before it
    starts: the adapter's defaults the user did not set (:attr:`DeviceTraits.child_defaults`), and the one device a
    single-process configuration may see (:attr:`DeviceTraits.one_device_variable`)."""
    environment = {name: value for name, value in adapter.traits.child_defaults.items() if name not in os.environ}
    variable = adapter.traits.one_device_variable
    if variable is None or nproc_per_node != 1:
        return environment
    allowed = [v.strip() for v in os.environ.get(variable, "").split(",") if v.strip()]
    return {**environment, variable: allowed[0] if allowed else "0"}


def run_params(adapter: DeviceAdapter) -> dict[str, str]:
    """How the device runs (numerics and training choices), recorded as MLflow params of the run."""
    return {**adapter.numerics().run_params(), **adapter.training().run_params()}


def prepare_device(config: "RunConfig", adapter: DeviceAdapter) -> None:
    """Refuse a loader or precision the device does not run (never swap it), then make it deterministic
    and seed every RNG. Shared by the run process and the pytest plugin."""
    loaders = adapter.traits.supported_loaders
    if config.loader not in loaders:
        raise SuiteError(f"loader {config.loader!r} is not supported on {config.device}; "
                         f"supported: {', '.join(loaders)}")
    numerics = adapter.numerics()
    numerics.autocast(config.precision)  # fails now, not mid-run, if the precision is unsupported
    numerics.pin_numerics()
    if config.deterministic:
        numerics.make_deterministic()
    numerics.seed(config.seed)

"""Intel Gaudi2 (HPU) through Habana's PyTorch bridge and optimum-habana.

``habana_frameworks`` comes with Habana's software stack (SynapseAI / Gaudi software), not from PyPI; the ``gaudi``
extra adds optimum-habana, habana-media-loader and habana-pyhlml. Everything is imported here, lazily: the CPU path
never needs it.

* Execution mode: current Habana stacks run eagerly unless told otherwise; older ones defaulted to lazy mode, and the
  published benchmark ran lazy. A configuration process runs lazy too (``PT_HPU_LAZY_MODE=1`` in its environment,
  :attr:`DeviceTraits.child_defaults`) unless the user set the variable; eager is then a recorded deviation from the
  published method. The mode is asked of the bridge itself (:func:`hpu_mode`:
  ``habana_frameworks.torch.utils.internal.is_lazy()``), never assumed from the variable, and recorded (run param
  ``run.hpu.mode``). Under torchrun with several ranks, each rank is bound to its card (Habana's HCCL module sets
  ``HLS_MODULE_ID``) before any HPU call acquires one (:func:`initialize_distributed`). In lazy mode
  ``htcore.mark_step()`` ends every optimizer step and precedes every clock read, followed by
  ``hpu.synchronize()``; in eager mode there is no mark_step.
* As the reference's ``Habana/clip`` Gaudi config: ``adapt_transformers_to_gaudi()`` before the model is built,
  Habana's fused AdamW (``hpex.optimizers.FusedAdamW``) and fused gradient clipping
  (``hpex.normalization.FusedClipNorm``) behind ``Gaudi2Adapter.training()``, torch autocast to bf16 when
  that precision is asked. Which optimizer ran is recorded.
* optimum-habana's ``GaudiTrainingArguments`` reads ``PT_HPU_LAZY_MODE`` itself, and an unset variable reads as lazy
  there (it raises for ``use_lazy_mode=False``): once the bridge has said which mode runs, the configuration's process
  sets ``PT_HPU_LAZY_MODE`` to match (:func:`export_mode`), and the value it found and the value set are recorded.
* Device memory: the HPU allocator's peak (``hpu.max_memory_allocated``) and, through habana-pyhlml, the driver's
  view of this process's card: the card is found by its module id (``HLS_MODULE_ID``, else this local rank's entry of
  ``HABANA_VISIBLE_MODULES``, else the only card), never by assuming the local rank is an HLML index. Its total memory
  is HLML's; the allocator's ``Limit`` is recorded under its own name, not as the card's memory.
* The ``device`` loader: habana-media-loader's media pipe on the HPU (:mod:`suite.decoders.habana_media`).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
from typing import Any, Mapping

from suite.devices.base import Availability, DeviceAdapter, DeviceTraits, driver_text
from suite.devices.interfaces import DeviceMemory, MemoryMeter, Numerics, TrainingOps
from suite.errors import SuiteError

#: Dense bf16 peak of one Gaudi2 (Intel's published matrix-engine figure), FLOP/s. Intel publishes no FP32 matrix
#: figure for Gaudi2: an fp32 run records no MFU, and says why.
GAUDI2_PEAK_BF16_FLOPS = 432e12


def _hpu() -> Any:
    return importlib.import_module("habana_frameworks.torch.hpu")


def hpu_mode() -> str:
    """``lazy`` or ``eager``, as the Habana bridge runs (``habana_frameworks.torch.utils.internal.is_lazy``); the
    one place the suite decides it. Raises :class:`SuiteError` where the bridge cannot say."""
    try:
        internal = importlib.import_module("habana_frameworks.torch.utils.internal")
        return "lazy" if internal.is_lazy() else "eager"
    except (ImportError, AttributeError) as exc:
        raise SuiteError(f"cannot ask the Habana bridge which execution mode runs (habana_frameworks.torch.utils."
                         f"internal.is_lazy): {exc}") from exc


def export_mode(mode: str) -> dict[str, str]:
    """Set ``PT_HPU_LAZY_MODE`` to the mode the bridge runs (``1`` lazy, ``0`` eager), for the libraries of this
    process that read it (optimum-habana); what it was before and what it is now."""
    before = os.environ.get("PT_HPU_LAZY_MODE")
    os.environ["PT_HPU_LAZY_MODE"] = "1" if mode == "lazy" else "0"
    return {"hpu.PT_HPU_LAZY_MODE": os.environ["PT_HPU_LAZY_MODE"],
            "hpu.PT_HPU_LAZY_MODE_found": "unset" if before is None else before}


def module_id_of(local_rank: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The module id of the card this process holds, as Habana's runtime chooses it: ``HLS_MODULE_ID``, else this
    local rank's entry of ``HABANA_VISIBLE_MODULES``; ``None`` where neither says."""
    env = os.environ if environ is None else environ
    if env.get("HLS_MODULE_ID", "").strip().isdigit():
        return int(env["HLS_MODULE_ID"])
    visible = [v.strip() for v in env.get("HABANA_VISIBLE_MODULES", "").split(",") if v.strip()]
    if local_rank < len(visible) and visible[local_rank].isdigit():
        return int(visible[local_rank])
    return None


def hlml_init(hlml: Any) -> None:
    """``hlmlInit()`` without pyhlml's own ``print("Failed to load libhlml")`` on stdout where the driver is absent
    (``pyhlml/hlml_lib.py``): that line would land in a command's ``--json`` output; the exception says it."""
    with contextlib.redirect_stdout(io.StringIO()):
        hlml.hlmlInit()


class HabanaTraining(TrainingOps):
    """Training on Gaudi2: optimum-habana adapts transformers first, Habana's fused AdamW and fused gradient clipping
    (the ``Habana/clip`` Gaudi config), and ``mark_step`` at each step boundary in lazy mode."""

    def __init__(self, adapter: "Gaudi2Adapter") -> None:
        super().__init__(adapter)
        self.gaudi = adapter
        self.optimizer = ""
        self._clipper: Any = None

    def prepare_framework(self) -> None:
        try:
            from optimum.habana.transformers.modeling_utils import adapt_transformers_to_gaudi
        except ImportError as exc:
            raise SuiteError(f"optimum-habana is needed on Gaudi2: pip install 'suite-bench[gaudi]' ({exc})") from exc
        adapt_transformers_to_gaudi()

    def make_optimizer(self, params: Any, lr: float, eps: float, weight_decay: float) -> tuple[Any, str]:
        try:
            fused = importlib.import_module("habana_frameworks.torch.hpex.optimizers").FusedAdamW
        except (ImportError, AttributeError) as exc:
            raise SuiteError(f"Habana's FusedAdamW is not available ({exc}); the Gaudi config (Habana/clip) "
                             "asks for it") from exc
        self.optimizer = (f"habana_frameworks.torch.hpex.optimizers.FusedAdamW(lr={lr}, eps={eps}, "
                          f"weight_decay={weight_decay})")
        return fused(params, lr=lr, eps=eps, weight_decay=weight_decay), self.optimizer

    def clip_grad_norm(self, params: Any, max_norm: float) -> None:
        if self._clipper is None:
            clip = importlib.import_module("habana_frameworks.torch.hpex.normalization").FusedClipNorm
            self._clipper = clip(params, max_norm)
        self._clipper.clip_norm(params)

    def step_boundary(self) -> None:
        self.gaudi.mark_step()

    def run_params(self) -> dict[str, str]:
        return {"hpu.mode": self.gaudi.mode, "hpu.optimizer": self.optimizer or "not created yet",
                "hpu.grad_clipping": "hpex.normalization.FusedClipNorm", "hpu.graphs": "off",
                **self.gaudi.mode_variable}


class HabanaNumerics(Numerics):
    def supported(self) -> tuple[str, ...]:
        return ("fp32", "bf16")

    def seed_device(self, seed: int) -> None:
        importlib.import_module("habana_frameworks.torch.hpu.random").manual_seed_all(seed)

    def make_deterministic(self) -> None:
        """HPU kernels are deterministic for a fixed graph; torch's switch covers the rest (without filling
        uninitialized memory, as on every device)."""
        import torch
        import torch.utils.deterministic

        torch.use_deterministic_algorithms(True, warn_only=True)  # strict mode rejects some HPU ops
        setattr(torch.utils.deterministic, "fill_uninitialized_memory", False)  # a property of the module


class HabanaMemory(MemoryMeter):
    """The HPU allocator's peak, with its limit and HLML's view of the card beside it."""

    def reset_peak(self) -> None:
        _hpu().reset_peak_memory_stats()

    def peak(self) -> DeviceMemory | None:
        hpu = _hpu()
        extra: dict[str, int] = {}
        stats = hpu.memory_stats()
        if isinstance(stats, dict) and "Limit" in stats:
            extra["allocator_limit"] = int(stats["Limit"])
        card = card_facts(self.adapter.local_rank)
        if card.get("used") is not None:
            extra["hlml_device_used_at_end"] = card["used"]
        return DeviceMemory(peak_bytes=int(hpu.max_memory_allocated()), source="habana hpu.max_memory_allocated",
                            extra=extra)


    def current_bytes(self) -> int | None:
        return int(_hpu().memory_allocated())


def card_facts(local_rank: int) -> dict[str, Any]:
        """HLML's view of this process's card (module id, PCI bus id, used and total bytes), or why there is none."""
        try:
            import pyhlml
        except ImportError:
            return {"hlml": "not read: habana-pyhlml is not installed"}
        try:
            hlml_init(pyhlml)
            count = int(pyhlml.hlmlDeviceGetCount())
            handles = [pyhlml.hlmlDeviceGetHandleByIndex(i) for i in range(count)]
            wanted = module_id_of(local_rank)
            if wanted is None and count != 1:
                return {"hlml": f"not read: {count} cards and neither HLS_MODULE_ID nor HABANA_VISIBLE_MODULES says "
                                "which one this process holds"}
            handle = handles[0] if wanted is None else next(
                (h for h in handles if int(pyhlml.hlmlDeviceGetModuleID(h)) == wanted), None)
            if handle is None:
                return {"hlml": f"not read: no card with module id {wanted} among HLML's {count}"}
            memory = pyhlml.hlmlDeviceGetMemoryInfo(handle)
            return {"module_id": int(pyhlml.hlmlDeviceGetModuleID(handle)), "used": int(memory.used),
                    "total": int(memory.total), "pci_bus_id": driver_text(pyhlml.hlmlDeviceGetPCIInfo(handle).bus_id),
                    "driver_version": driver_text(pyhlml.hlmlGetDriverVersion()),
                    "firmware_version": driver_text(pyhlml.hlmlDeviceGetFirmwareFITVersion(handle))}
        except Exception as exc:  # noqa: BLE001 - no driver view, not a failure: recorded why
            return {"hlml": f"not read: {type(exc).__name__}: {' '.join(str(exc).split())}"}


def initialize_distributed() -> None:
    """Bind this rank to its card before anything acquires one: importing Habana's HCCL module runs its
    ``initialize_distributed_hpu()``, which sets ``HLS_MODULE_ID`` from ``LOCAL_RANK`` when there are several ranks
    (bridge 1.19, ``habana_frameworks/torch/distributed/hccl/__init__.py``); a card acquired before that is acquired
    by type, may be another rank's, and cannot be found by module id as Habana's multi-node set-up requires."""
    try:
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
    except ImportError as exc:
        raise SuiteError(f"several ranks on Gaudi2 need Habana's HCCL module (habana_frameworks.torch.distributed."
                         f"hccl): {exc}") from exc


class Gaudi2Adapter(DeviceAdapter):
    name = "gaudi2"
    #: the published method (optimum-habana's GaudiTrainer, 2023) ran lazy mode: a configuration process runs it too
    #: unless PT_HPU_LAZY_MODE is set (eager is then recorded as a deviation from the published method)
    traits = DeviceTraits("Intel Gaudi2 HPU (habana_frameworks, optimum-habana); lazy mode, as the published "
                          "benchmark, unless PT_HPU_LAZY_MODE=0", "hccl", decoders={"device": "habana-media-pipe"},
                          child_defaults={"PT_HPU_LAZY_MODE": "1"})  # DALI is NVIDIA's

    def __init__(self, local_rank: int = 0) -> None:
        super().__init__(local_rank)
        self._numerics, self._memory = HabanaNumerics(self), HabanaMemory(self)
        self._training = HabanaTraining(self)
        self._mode: str | None = None
        self.mode_variable: dict[str, str] = {}  # PT_HPU_LAZY_MODE as exported, and as it was found

    def setup(self) -> Any:
        """As every adapter, but under torchrun with several ranks the rank is bound to its card first
        (:func:`initialize_distributed`): availability's first HPU call acquires a card."""
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            initialize_distributed()
        return super().setup()

    @classmethod
    def availability(cls) -> Availability:
        try:
            hpu = _hpu()
        except ImportError as exc:
            return Availability(False, f"habana_frameworks not installed ({exc}); it comes with Habana's "
                                       "software stack, not from PyPI")
        except Exception as exc:  # noqa: BLE001 - a broken install is a reason, not a crash
            return Availability(False, f"habana_frameworks does not load: {' '.join(str(exc).split())}")
        try:
            if not hpu.is_available() or hpu.device_count() == 0:
                return Availability(False, "no HPU device")
            name = str(hpu.get_device_name())
        except Exception as exc:  # noqa: BLE001
            return Availability(False, f"HPU is not usable: {' '.join(str(exc).split())}")
        details = {"device_name": name, "device_count": hpu.device_count()}
        if "gaudi2" not in name.lower():
            return Availability(False, f"device is {name}, not Gaudi2", details)
        return Availability(True, "", details)

    def open_device(self) -> Any:
        import torch

        importlib.import_module("habana_frameworks.torch.core")  # registers the hpu device with torch
        if torch.distributed.is_available():
            try:  # registers the hccl backend for the torchrun path
                importlib.import_module("habana_frameworks.torch.distributed.hccl")
            except ImportError:
                pass
        self._mode = hpu_mode()
        self.mode_variable = export_mode(self._mode)
        return torch.device("hpu")

    @property
    def mode(self) -> str:
        """``lazy`` or ``eager``: how the bridge runs (see :func:`hpu_mode`)."""
        if self._mode is None:
            self._mode = hpu_mode()
        return self._mode

    def mark_step(self) -> None:
        """In lazy mode, run the graph accumulated so far (``htcore.mark_step``)."""
        if self.mode == "lazy":
            importlib.import_module("habana_frameworks.torch.core").mark_step()

    def synchronize(self) -> None:
        self.mark_step()
        _hpu().synchronize()

    def memory(self) -> MemoryMeter:
        return self._memory

    def facts(self) -> dict[str, Any]:
        hpu = _hpu()
        info: dict[str, Any] = {"device_name": str(hpu.get_device_name()), "device_count": hpu.device_count(),
                                "peak_flops": {"bf16": GAUDI2_PEAK_BF16_FLOPS}, "hpu_mode": self.mode}
        stats = hpu.memory_stats()
        if isinstance(stats, dict) and "Limit" in stats:
            info["allocator_limit_bytes"] = int(stats["Limit"])  # what the allocator may use, not the card's memory
        card = card_facts(self.local_rank)
        if "total" in card:
            info.update(memory_total_bytes=card["total"], hlml_module_id=card["module_id"],
                        pci_bus_id=card["pci_bus_id"], driver_version=card["driver_version"],
                        firmware_version=card["firmware_version"])
        else:
            info["hlml"] = card["hlml"]
        try:
            info["habana_frameworks"] = importlib.import_module("habana_frameworks.torch").__version__
        except (ImportError, AttributeError):
            pass
        return info

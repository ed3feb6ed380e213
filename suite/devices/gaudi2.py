"""Intel Gaudi2 (HPU) through Habana's PyTorch bridge and optimum-habana.

``habana_frameworks`` comes with Habana's software stack (SynapseAI / Gaudi software), not from PyPI;
the ``gaudi`` extra adds optimum-habana, habana-media-loader and habana-pyhlml. Everything is imported
here, lazily: the CPU path never needs it.

* Lazy mode (``PT_HPU_LAZY_MODE=1``, the stack's classic default) accumulates a graph until
  ``htcore.mark_step()``: called after every optimizer step and before every clock read, followed by
  ``hpu.synchronize()``. Eager mode (``PT_HPU_LAZY_MODE=0``) needs no mark_step. The mode is a run param.
* As the reference's ``Habana/clip`` Gaudi config: ``adapt_transformers_to_gaudi()`` before the model is
  built, Habana's fused AdamW (``hpex.optimizers.FusedAdamW``), fused gradient clipping
  (``hpex.normalization.FusedClipNorm``), torch autocast to bf16. Which optimizer ran is recorded.
* Device memory: the HPU allocator's peak (``hpu.max_memory_allocated``) and, through habana-pyhlml, the
  driver's view of the card's used memory, under its own name.
* The ``device`` loader: habana-media-loader decodes the encoded JPEGs of each batch on the HPU, crops the
  center and resizes (bicubic) to the model's size and normalizes with the CLIP mean/std, as
  optimum-habana's media pipe for CLIP does. It is not bit-identical to the CPU path (the decoder crops
  before resizing); the records name the transform that ran.
"""

from __future__ import annotations

import importlib
import os
import queue
from typing import Any, Sequence

from suite.devices.base import Availability, DeviceAdapter, DeviceMemory
from suite.errors import SuiteError

#: Dense bf16 peak of one Gaudi2 (Intel's published matrix-engine figure), FLOP/s.
GAUDI2_PEAK_BF16_FLOPS = 432e12


def _hpu() -> Any:
    return importlib.import_module("habana_frameworks.torch.hpu")


def lazy_mode() -> bool:
    return os.environ.get("PT_HPU_LAZY_MODE", "1") == "1"


class Gaudi2Adapter(DeviceAdapter):
    name = "gaudi2"
    description = "Intel Gaudi2 HPU (habana_frameworks, optimum-habana); lazy or eager mode"
    distributed_backend = "hccl"
    supported_loaders = ("cpu", "cpu-fast", "device")  # DALI is NVIDIA's

    def __init__(self, local_rank: int = 0) -> None:
        super().__init__(local_rank)
        self._optimizer = ""
        self._media: Any = None
        self._clipper: Any = None

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

    def _create_device(self) -> Any:
        import torch

        importlib.import_module("habana_frameworks.torch.core")  # registers the hpu device with torch
        if torch.distributed.is_available():
            try:  # registers the hccl backend for the torchrun path
                importlib.import_module("habana_frameworks.torch.distributed.hccl")
            except ImportError:
                pass
        return torch.device("hpu")

    # --- execution -------------------------------------------------------------------------
    def _mark_step(self) -> None:
        if lazy_mode():
            importlib.import_module("habana_frameworks.torch.core").mark_step()

    def synchronize(self) -> None:
        self._mark_step()
        _hpu().synchronize()

    def step_boundary(self) -> None:
        self._mark_step()

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
        self._optimizer = f"habana_frameworks.torch.hpex.optimizers.FusedAdamW(lr={lr}, eps={eps}, " \
                          f"weight_decay={weight_decay})"
        return fused(params, lr=lr, eps=eps, weight_decay=weight_decay), self._optimizer

    def clip_grad_norm(self, params: Any, max_norm: float) -> None:
        if self._clipper is None:
            clip = importlib.import_module("habana_frameworks.torch.hpex.normalization").FusedClipNorm
            self._clipper = clip(params, max_norm)
        self._clipper.clip_norm(params)

    def run_params(self) -> dict[str, str]:
        return {"hpu.mode": "lazy" if lazy_mode() else "eager",
                "hpu.optimizer": self._optimizer or "not created yet",
                "hpu.grad_clipping": "hpex.normalization.FusedClipNorm",
                "hpu.graphs": "off"}

    # --- numerics ---------------------------------------------------------------------------
    def _seed_device(self, seed: int) -> None:
        importlib.import_module("habana_frameworks.torch.hpu.random").manual_seed_all(seed)

    def configure_determinism(self) -> None:
        """HPU kernels are deterministic for a fixed graph; torch's switch covers the rest."""
        import torch

        torch.use_deterministic_algorithms(True, warn_only=True)  # strict mode rejects some HPU ops

    def supported_precisions(self) -> tuple[str, ...]:
        return ("fp32", "bf16")

    # --- memory -----------------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        _hpu().reset_peak_memory_stats()

    def peak_memory(self) -> DeviceMemory | None:
        hpu = _hpu()
        extra: dict[str, int] = {}
        stats = hpu.memory_stats()
        if isinstance(stats, dict) and "Limit" in stats:
            extra["allocator_limit"] = int(stats["Limit"])
        driver = self._driver_used_memory()
        if driver is not None:
            extra["hlml_device_used_at_end"] = driver
        return DeviceMemory(peak_bytes=int(hpu.max_memory_allocated()), source="habana hpu.max_memory_allocated",
                            extra=extra)

    def _driver_used_memory(self) -> int | None:
        try:
            import pyhlml
        except ImportError:
            return None
        try:
            pyhlml.hlmlInit()
            handle = pyhlml.hlmlDeviceGetHandleByIndex(self.local_rank)
            return int(pyhlml.hlmlDeviceGetMemoryInfo(handle).used)
        except Exception:  # noqa: BLE001 - no driver view, not a failure
            return None

    # --- on-device decoding -----------------------------------------------------------------
    def decode_images(self, encoded: Sequence[bytes]) -> list[Any]:
        raise SuiteError("Gaudi2 decodes and preprocesses in one media pipe: use device_preprocess")

    def device_preprocess(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                          std: Sequence[float], loader: str = "device") -> Any:
        """The batch through a habana-media-loader pipe on the HPU: decode, center crop, bicubic resize to
        ``image_size``, normalize; a float32 ``(N, 3, size, size)`` HPU tensor."""
        if self._media is None or self._media.batch_size != len(encoded) or self._media.image_size != image_size:
            self._media = _MediaDecoder(len(encoded), image_size, mean, std)
        images = self._media(encoded)
        self.decoded_by = "habana-media-pipe"
        return images

    def device_info(self) -> dict[str, Any]:
        hpu = _hpu()
        info: dict[str, Any] = {"device_name": str(hpu.get_device_name()), "device_count": hpu.device_count(),
                                "peak_bf16_flops": GAUDI2_PEAK_BF16_FLOPS, "hpu_mode": "lazy" if lazy_mode() else "eager"}
        stats = hpu.memory_stats()
        if isinstance(stats, dict) and "Limit" in stats:
            info["memory_total_bytes"] = int(stats["Limit"])
        try:
            info["habana_frameworks"] = importlib.import_module("habana_frameworks.torch").__version__
        except (ImportError, AttributeError):
            pass
        return info


class _MediaDecoder:
    """A habana-media-loader pipe fed from memory: the batch's encoded bytes go in through an external
    queue (``ReadMediaDatasetFromExt``), normalized HPU tensors come out."""

    def __init__(self, batch_size: int, image_size: int, mean: Sequence[float], std: Sequence[float]) -> None:
        import numpy as np

        try:
            from habana_frameworks.mediapipe import fn
            from habana_frameworks.mediapipe.media_types import dtype, ftype, imgtype, randomCropType
            from habana_frameworks.mediapipe.mediapipe import MediaPipe
            from habana_frameworks.mediapipe.plugins.iterator_pytorch import HPUGenericPytorchIterator
        except ImportError as exc:
            raise SuiteError(f"the device loader on Gaudi2 needs habana-media-loader: pip install "
                             f"'suite-bench[gaudi]' ({exc})") from exc
        self.batch_size, self.image_size = batch_size, image_size
        self._queue: queue.Queue = queue.Queue()
        feed = self._queue

        class Pipe(MediaPipe):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__(device="legacy", prefetch_depth=0, batch_size=batch_size, num_threads=1,
                                 pipe_name="SuiteEncodedBatchPipe")
                self.read = fn.ReadMediaDatasetFromExt(ext_queue=feed)
                self.decode = fn.ImageDecoder(output_format=imgtype.RGB_P, resize=[image_size, image_size],
                                              resampling_mode=ftype.BICUBIC, random_crop_type=randomCropType.CENTER_CROP)
                scale = 255.0
                self.mean = fn.MediaConst(data=np.array([m * scale for m in mean], dtype=np.float32), shape=[1, 1, 3],
                                          batch_broadcast=False, dtype=dtype.FLOAT32)
                self.inv_std = fn.MediaConst(data=np.array([1 / (s * scale) for s in std], dtype=np.float32),
                                             shape=[1, 1, 3], batch_broadcast=False, dtype=dtype.FLOAT32)
                self.normalize = fn.CropMirrorNorm(crop_w=image_size, crop_h=image_size, crop_d=0, dtype=dtype.FLOAT32)

            def definegraph(self) -> Any:
                images = self.decode(self.read())
                return self.normalize(images, self.mean(), self.inv_std())

        self._pipe = Pipe()
        self._pipe.build()
        self._iterator = HPUGenericPytorchIterator(mediapipe=self._pipe)

    def __call__(self, encoded: Sequence[bytes]) -> Any:
        import numpy as np

        self._queue.put([np.frombuffer(data, dtype=np.uint8) for data in encoded])
        (images,) = next(self._iterator)
        return images

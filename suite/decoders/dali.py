"""The ``dali`` loader: NVIDIA DALI decodes and preprocesses each batch of encoded images.

DALI (the ``dali`` extra: ``nvidia-dali-cuda120`` or ``nvidia-dali-cuda130``, matching the CUDA major version of
the installed torch; imported only here) runs a small pipeline per batch: ``external_source`` (the batch's encoded
bytes, as read by the DataLoader workers) -> ``decoders.image`` (nvJPEG on the GPU, ``device="mixed"``; its CPU
decoder on the CPU device), with ``adjust_orientation=False``: the reference preprocessing ignores EXIF orientation,
and DALI would otherwise rotate such photos -> ``resize`` of the shorter side, cubic, antialiased, to float32
(``dtype=FLOAT``: DALI keeps uint8 by default, clamping the cubic filter's overshoot before normalization, which the
reference does not) -> ``crop_mirror_normalize`` (center crop, mean/std, float32, CHW). The result is copied into
a torch tensor on the device with ``nvidia.dali.plugin.pytorch.feed_ndarray``, on torch's current CUDA stream (as
DALI's own ``DALIGenericIterator`` does), so torch never reads the buffer before DALI has written it.

One batch is fed per ``run()``: DALI's pipeline documentation asks for ``prefetch_queue_depth=1`` in that mode (with
the default 2 the second ``run()`` fails: "Attempted to peek the data batch that doesn't exist"). A pipeline is built
per batch size and kept (:class:`~suite.decoders.base.PipesBySize`), and shut down at the end. DALI's resampling is
its own, so the pixels are close to, not equal to, the reference transform; the records name the decoder. Images
whose format or pixels DALI decodes otherwise than the reference (GIF, 16-bit, CMYK...) are refused by header and
decoded on the host (:mod:`suite.decoders.fallback`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from suite.decoders.base import Decoder, PipesBySize
from suite.errors import SuiteError
from suite.imaging import ImageKind

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter

DALI_WHEELS = {12: "nvidia-dali-cuda120", 13: "nvidia-dali-cuda130"}
#: Formats DALI's image decoder reads (its documentation: JPEG, PNG, BMP, TIFF, WebP; also JPEG 2000 and PNM,
#: which Pillow names otherwise and the suite leaves to the host).
DALI_FORMATS = ("JPEG", "PNG", "BMP", "TIFF", "WEBP")
#: Pixel modes whose RGB conversion by DALI equals Pillow's ``convert("RGB")`` (checked on the odd-image corpus with
#: DALI 2.4's CPU decoder: identical pixels); 16-bit (DALI scales, Pillow clips), CMYK and others go to the host.
DALI_MODES = ("RGB", "L", "P", "RGBA")


def _dali() -> Any:
    try:
        import nvidia.dali
    except ImportError as exc:
        raise SuiteError(f"the dali loader needs NVIDIA DALI: pip install 'suite-bench[dali]' ({exc})") from exc
    return nvidia.dali


def check_cuda_match(dali_cuda_version: int | None, torch_cuda: str | None) -> None:
    """DALI's CUDA build (``nvidia.dali.__cuda_version__``, e.g. 12986) must have the CUDA major of torch's
    (``torch.version.cuda``, e.g. "13.0"): two runtimes of different majors in one process do not share streams."""
    if dali_cuda_version is None or torch_cuda is None:
        return
    dali_major, torch_major = int(dali_cuda_version) // 1000, int(str(torch_cuda).split(".")[0])
    if dali_major != torch_major:
        wheel = DALI_WHEELS.get(torch_major, f"the DALI wheel for CUDA {torch_major}")
        raise SuiteError(f"DALI is built for CUDA {dali_major} but torch for CUDA {torch_cuda}: install {wheel} "
                         f"(pip install 'suite-bench[dali-cuda{torch_major}]')")


def dali_threads() -> int:
    """DALI's host threads: the cores this process may run on (its CPU affinity: what the configuration was given),
    less one for the training loop; at least 2."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(2, cores - 1)


class DaliDecoder(Decoder):
    name = "dali"
    loader = "dali"
    preprocesses = True
    description = ("NVIDIA DALI: decoders.image (mixed = nvJPEG on a GPU, its CPU decoder on the CPU device), "
                   "shorter-side cubic antialiased resize, crop_mirror_normalize")

    def __init__(self, device: DeviceAdapter, num_threads: int | None = None) -> None:
        super().__init__(device)
        #: DALI's host threads (its "mixed" decoder still decodes Huffman on the host, DALI #5274): by default every
        #: core this process may run on but one, for the training loop (two starved a 16-core box's decode)
        self.num_threads = num_threads if num_threads is not None else dali_threads()
        self._pipes = PipesBySize(lambda pipe: pipe._shutdown())  # DALI's own shutdown (Pipeline.__del__ calls it)

    @property
    def builds(self) -> int:
        return self._pipes.builds

    def ran(self) -> str:
        return f"{self.name} ({self.num_threads} host threads)"

    def refusal(self, kind: ImageKind) -> str | None:
        if kind.format not in DALI_FORMATS:
            return f"DALI's decoder does not read {kind.format}"
        if kind.animated:
            return f"an animated {kind.format}"
        if kind.mode not in DALI_MODES:
            return f"{kind.mode} pixels: DALI converts them to RGB otherwise than the reference (Pillow)"
        return None

    def _device_id(self) -> int | None:
        torch_device = self.device.torch_device
        if torch_device.type != "cuda":
            return None  # DALI's CPU pipeline
        return torch_device.index if torch_device.index is not None else 0

    def _build(self, batch_size: int, image_size: int, mean: Sequence[float], std: Sequence[float]) -> Any:
        dali = _dali()
        from nvidia.dali import fn, pipeline_def, types

        device_id = self._device_id()
        if device_id is not None:
            import torch

            check_cuda_match(getattr(dali, "__cuda_version__", None), torch.version.cuda)
        decoder_device = "cpu" if device_id is None else "mixed"

        @pipeline_def(batch_size=batch_size, num_threads=self.num_threads, device_id=device_id,
                      prefetch_queue_depth=1)  # one batch fed per run()
        def preprocess() -> Any:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            images = fn.decoders.image(encoded, device=decoder_device, output_type=types.RGB,
                                       adjust_orientation=False)  # as the reference: EXIF orientation not applied
            images = fn.resize(images, resize_shorter=image_size, interp_type=types.INTERP_CUBIC, antialias=True,
                               dtype=types.FLOAT)  # unclamped, as the reference's float resize
            return fn.crop_mirror_normalize(images, crop=(image_size, image_size), crop_pos_x=0.5, crop_pos_y=0.5,
                                            mean=[m * 255.0 for m in mean], std=[s * 255.0 for s in std],
                                            dtype=types.FLOAT, output_layout="CHW")

        pipe = preprocess()
        pipe.build()
        return pipe

    def __call__(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> Any:
        import numpy as np
        import torch
        from nvidia.dali.plugin.pytorch import feed_ndarray

        pipe = self._pipes.get((len(encoded), image_size), lambda: self._build(len(encoded), image_size, mean, std))
        pipe.feed_input("encoded", [np.frombuffer(data, dtype=np.uint8) for data in encoded])
        (images,) = pipe.run()
        batch = images.as_tensor()
        torch_device = self.device.torch_device
        out = torch.empty(tuple(batch.shape()), dtype=torch.float32, device=torch_device)
        stream = torch.cuda.current_stream(torch_device) if torch_device.type == "cuda" else None
        feed_ndarray(batch, out, cuda_stream=stream)  # ordered on torch's stream, as DALIGenericIterator does
        return out

    def close(self) -> None:
        self._pipes.close()

"""The ``dali`` loader: NVIDIA DALI decodes and preprocesses each batch of encoded images.

DALI (the ``dali`` extra: ``nvidia-dali-cuda120`` or ``nvidia-dali-cuda130``, matching the CUDA major version of
the installed torch; imported only here) runs a small pipeline per batch: ``external_source`` (the batch's encoded
bytes, as read by the DataLoader workers) -> ``decoders.image`` (nvJPEG on the GPU, ``device="mixed"``; its CPU
decoder on the CPU device) -> ``resize`` of the shorter side, cubic, antialiased -> ``crop_mirror_normalize`` (center
crop, mean/std, float32, CHW). The result is copied into a torch tensor on the device with
``nvidia.dali.plugin.pytorch.feed_ndarray``, on torch's current CUDA stream (as DALI's own ``DALIGenericIterator``
does), so torch never reads the buffer before DALI has written it.

One batch is fed per ``run()``: DALI's pipeline documentation asks for ``prefetch_queue_depth=1`` in that mode (with
the default 2 the second ``run()`` fails: "Attempted to peek the data batch that doesn't exist"). DALI's resampling
is its own, so the pixels are close to, not equal to, the reference transform; the records name the decoder.
"""

from __future__ import annotations

from typing import Any, Sequence

from suite.decoders.base import Decoder
from suite.errors import SuiteError

DALI_WHEELS = {12: "nvidia-dali-cuda120", 13: "nvidia-dali-cuda130"}


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


class DaliDecoder(Decoder):
    name = "dali"
    loader = "dali"
    preprocesses = True
    description = ("NVIDIA DALI: decoders.image (mixed = nvJPEG on a GPU, its CPU decoder on the CPU device), "
                   "shorter-side cubic antialiased resize, crop_mirror_normalize")

    def __init__(self, device: Any, num_threads: int = 2) -> None:
        super().__init__(device)
        self.num_threads = num_threads
        self._pipe: Any = None
        self._shape: tuple[int, int] | None = None

    def _device_id(self) -> int | None:
        torch_device = self.device.torch_device
        if torch_device.type != "cuda":
            return None  # DALI's CPU pipeline
        return torch_device.index if torch_device.index is not None else 0

    def _build(self, batch_size: int, image_size: int, mean: Sequence[float], std: Sequence[float]) -> None:
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
            images = fn.decoders.image(encoded, device=decoder_device, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=image_size, interp_type=types.INTERP_CUBIC, antialias=True)
            return fn.crop_mirror_normalize(images, crop=(image_size, image_size), crop_pos_x=0.5, crop_pos_y=0.5,
                                            mean=[m * 255.0 for m in mean], std=[s * 255.0 for s in std],
                                            dtype=types.FLOAT, output_layout="CHW")

        self._pipe = preprocess()
        self._pipe.build()
        self._shape = (batch_size, image_size)

    def __call__(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> Any:
        import numpy as np
        import torch
        from nvidia.dali.plugin.pytorch import feed_ndarray

        if self._pipe is None or self._shape != (len(encoded), image_size):
            self._build(len(encoded), image_size, mean, std)
        self._pipe.feed_input("encoded", [np.frombuffer(data, dtype=np.uint8) for data in encoded])
        (images,) = self._pipe.run()
        batch = images.as_tensor()
        torch_device = self.device.torch_device
        out = torch.empty(tuple(batch.shape()), dtype=torch.float32, device=torch_device)
        stream = torch.cuda.current_stream(torch_device) if torch_device.type == "cuda" else None
        feed_ndarray(batch, out, cuda_stream=stream)  # ordered on torch's stream, as DALIGenericIterator does
        return out

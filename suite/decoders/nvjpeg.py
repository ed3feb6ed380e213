"""nvJPEG on an NVIDIA GPU through ``torchvision.io.decode_jpeg(list, device="cuda")``: a whole batch per call
(batched GPU decode is what makes nvJPEG pay). torchvision comes with the ``cuda`` extra, imported only here."""

from __future__ import annotations

from typing import Any, Sequence

from suite.decoders.base import DecodeError, Decoder
from suite.errors import SuiteError


class NvJpegDecoder(Decoder):
    name = "nvjpeg"
    loader = "device"
    preprocesses = False
    description = "nvJPEG (torchvision.io.decode_jpeg on the GPU), one call per batch"

    def __call__(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> list[Any]:
        import torch

        try:
            from torchvision.io import ImageReadMode, decode_jpeg
        except ImportError as exc:
            raise SuiteError("the device loader on CUDA needs torchvision (nvJPEG): "
                             f"pip install 'suite-bench[cuda]' ({exc})") from exc
        for index, data in enumerate(encoded):
            if not data.startswith(b"\xff\xd8"):
                raise DecodeError(index, "nvJPEG decodes JPEG only, and this is not a JPEG")
        tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in encoded]
        return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device.torch_device))

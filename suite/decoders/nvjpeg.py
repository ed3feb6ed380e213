"""nvJPEG on an NVIDIA GPU through ``torchvision.io.decode_jpeg(list, device="cuda")``: a whole batch per call
(batched GPU decode is what makes nvJPEG pay). torchvision comes with the ``cuda`` extra, imported only here.

nvJPEG decodes JPEG only, and torchvision's GPU path does not decode CMYK JPEGs (its own tests mark them expected to
fail): those images are refused by header and decoded on the host (:mod:`suite.decoders.fallback`). EXIF orientation
is not applied (``apply_exif_orientation`` defaults to False), as in the reference.

Stream order, made explicit: torchvision allocates the decoded images on the caller's current stream and decodes on
a private stream of torch's pool without waiting for the caller's (pytorch/vision #9606): a block freed by kernels
still queued on the caller's stream can be handed to the decoder and overwritten before they read it. So this
stream is drained before the decode, and the device synchronized after it, whatever the step does next."""

from __future__ import annotations

from typing import Any, Sequence

from suite.decoders.base import DecodeError, Decoder
from suite.errors import SuiteError
from suite.imaging import ImageKind

#: JPEG pixel modes (Pillow's names) that torchvision's GPU decode_jpeg decodes: YCbCr/RGB and greyscale.
NVJPEG_MODES = ("RGB", "L")


class NvJpegDecoder(Decoder):
    name = "nvjpeg"
    loader = "device"
    preprocesses = False
    description = "nvJPEG (torchvision.io.decode_jpeg on the GPU), one call per batch"

    def refusal(self, kind: ImageKind) -> str | None:
        if kind.format != "JPEG":
            return f"nvJPEG decodes JPEG only, not {kind.format}"
        if kind.mode not in NVJPEG_MODES:
            return f"a {kind.mode} JPEG: torchvision's GPU decode does not decode it"
        return None

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
        device = self.device.torch_device
        torch.cuda.current_stream(device).synchronize()  # nothing queued here may still read a block the decoder gets
        images = list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device))
        torch.cuda.synchronize(device)  # the decoder's private stream finished before anything reads its output
        return images

"""Images decoded on the device: the configured decoder, with the images it refuses or fails on decoded on the host
and counted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from suite.decoders.base import DecodeError
from suite.errors import DatasetError, SuiteError

from workloads.bridgetower.preprocessing import CLIP_MEAN, CLIP_STD, preprocess_image

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter


def decode_on_device(device: DeviceAdapter, encoded: list[bytes], names: list[str] | None, image_size: int,
                     loader: str, kinds: list[str] | None = None) -> tuple[torch.Tensor, Any, dict[int, str]]:
    """A batch of encoded images decoded on the device by the decoder that serves ``loader`` there
    (:mod:`suite.decoders`), then, unless the decoder preprocesses itself, the reference preprocessing on the device.
    Images the decoder refuses by their header (``kinds``, :meth:`suite.imaging.ImageKind.spelled`, read by the loader
    workers) or fails on are decoded on the host and preprocessed the reference way (:mod:`suite.decoders.fallback`).
    Returns (pixel values, the decoder, {image index: why it was decoded on the host}). A failure is a
    :class:`DatasetError` naming the image (when the decoder says which) or the batch's images."""
    from suite.decoders.fallback import decode_with_fallback
    from suite.imaging import ImageKind

    decoder = device.decoders.for_loader(loader)
    headers = [ImageKind.parse(k) for k in kinds] if kinds else [ImageKind.of(data) for data in encoded]
    try:
        done = decode_with_fallback(decoder, encoded, headers, image_size, CLIP_MEAN, CLIP_STD,
                                    lambda image: preprocess_image(device.training().to_device(image), image_size))
        return torch.stack(done.pixels), decoder, done.fallbacks
    except SuiteError:
        raise
    except Exception as exc:  # a decoder's error, re-raised naming what it was decoding
        names = list(names or [])
        culprit = exc.image_index if isinstance(exc, DecodeError) else None
        if culprit is not None and culprit < len(names):
            what = f"image {names[culprit]}"
        else:
            what = "the batch of " + (", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                                      if names else f"{len(encoded)} images")
        raise DatasetError(f"cannot decode {what} on the device with {decoder.name}: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:300]}") from exc


class DecodeFallbacks:
    """Training images the device's decoder left to the host: a count, and per reason its count and first names."""

    SHOWN = 5

    def __init__(self) -> None:
        self.count = 0
        self.by_reason: dict[str, dict[str, Any]] = {}

    def note(self, name: str, reason: str) -> None:
        self.count += 1
        entry = self.by_reason.setdefault(reason, {"reason": reason, "images": 0, "first": []})
        entry["images"] += 1
        if len(entry["first"]) < self.SHOWN and name not in entry["first"]:
            entry["first"].append(name)

    def describe(self) -> dict[str, Any]:
        return {"images": self.count, "how": "decoded on the host with Pillow, preprocessed the reference way",
                "reasons": list(self.by_reason.values())}

"""Pillow on the host: the CPU device's ``device`` loader (decoding in the training process, not the workers)."""

from __future__ import annotations

from typing import Any, Sequence

from suite.decoders.base import DecodeError, Decoder


class PillowDecoder(Decoder):
    name = "pillow"
    loader = "device"
    preprocesses = False
    description = "Pillow, one image at a time, in the training process"

    def __call__(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> list[Any]:
        from suite.imaging import decode_to_rgb_tensor

        images = []
        for index, data in enumerate(encoded):
            try:
                images.append(decode_to_rgb_tensor(data))
            except Exception as exc:  # re-raised naming the image
                raise DecodeError(index, f"{type(exc).__name__}: {exc}") from exc
        return images

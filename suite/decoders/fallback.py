"""A batch through a device decoder, with the images it cannot decode as the reference does decoded on the host.

Each image's header says what it is (:class:`~suite.imaging.ImageKind`, read in the loader workers). Images the
decoder refuses (:meth:`~suite.decoders.base.Decoder.refusal`: a PNG for nvJPEG, a CMYK JPEG, 16-bit pixels, an
animated GIF...) and images it fails on anyway are decoded on the host with Pillow, one at a time, exactly as the
reference loader decodes them, and then finished on the device by the caller's preprocessing. In the batch the
decoder sees, their places hold a small placeholder JPEG, so the decoder always meets the batch size it was built for
(a pipeline per batch size: no rebuild inside a measured step). Every such image is returned with its reason; the
workload counts them (``device_decode_fallbacks``) and the records say so. An image the host cannot decode either is
a :class:`~suite.decoders.base.DecodeError` naming it.

A decoder that fails on every image of a batch it was given to decode (torchvision built for another CUDA major than
torch, nvJPEG failing to start, a DALI pipeline that cannot be built) is not a few odd images: it is
:class:`DecoderBroken`, which fails the configuration with the decoder's own words, never a run quietly decoded on
the host.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from suite.decoders.base import DecodeError, Decoder
from suite.errors import SuiteError
from suite.imaging import ImageKind, decode_to_rgb_tensor


@functools.lru_cache(maxsize=1)
def placeholder_jpeg() -> bytes:
    """An 8x8 mid-grey baseline JPEG: what a decoder is given in the place of an image decoded on the host."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (128, 128, 128)).save(out, "JPEG", quality=90)
    return out.getvalue()


class DecoderBroken(SuiteError):
    """The device decoder failed on every image of a batch that it should have decoded: it does not work here."""


@dataclass
class DecodedBatch:
    """Per image, its pixels on the device (normalized, ``(3, size, size)``); and the images decoded on the host,
    with why."""

    pixels: list[Any]
    fallbacks: dict[int, str] = field(default_factory=dict)


def decode_with_fallback(decoder: Decoder, encoded: Sequence[bytes], kinds: Sequence[ImageKind], image_size: int,
                         mean: Sequence[float], std: Sequence[float],
                         finish: Callable[[Any], Any]) -> DecodedBatch:
    """Decode ``encoded`` (headers ``kinds``) with ``decoder``; ``finish`` turns one uint8 ``(3, H, W)`` image (on the
    host or the device) into the normalized pixels on the device (the reference preprocessing)."""
    host = {i: reason for i, kind in enumerate(kinds) if (reason := decoder.refusal(kind)) is not None}
    out = _on_device(decoder, encoded, host, image_size, mean, std)
    pixels = []
    for index, data in enumerate(encoded):
        if index in host:
            try:
                image = decode_to_rgb_tensor(data)
            except Exception as exc:  # neither the device nor the host decodes it: name it
                raise DecodeError(index, f"{host[index]}; on the host too: {type(exc).__name__}: {exc}") from exc
            pixels.append(finish(image))
        else:
            pixels.append(out[index] if decoder.preprocesses else finish(out[index]))
    return DecodedBatch(pixels, host)


def _on_device(decoder: Decoder, encoded: Sequence[bytes], host: dict[int, str], image_size: int,
               mean: Sequence[float], std: Sequence[float]) -> Any:
    """The decoder's output for the whole batch, the host's images replaced by the placeholder; images the decoder
    fails on are added to ``host`` (at most one attempt per image more)."""

    def batch(only: int | None = None) -> list[bytes]:
        return [data if (i not in host and (only is None or i == only)) else placeholder_jpeg()
                for i, data in enumerate(encoded)]

    if len(host) == len(encoded):
        return None
    refused = set(host)  # by header: the decoder was never meant to decode these
    out = _decode_skipping_failures(decoder, encoded, host, batch, image_size, mean, std)
    failed = {i: host[i] for i in host if i not in refused}
    if failed and len(failed) == len(encoded) - len(refused):
        raise DecoderBroken(f"{decoder.name} failed on every one of the {len(failed)} image(s) of a batch it should "
                            f"decode (first: {failed[min(failed)]}): the decoder does not work here, and its images "
                            "are not decoded on the host in its place")
    return out


def _decode_skipping_failures(decoder: Decoder, encoded: Sequence[bytes], host: dict[int, str],
                              batch: Callable[..., list[bytes]], image_size: int, mean: Sequence[float],
                              std: Sequence[float]) -> Any:
    for _ in range(len(encoded) + 1):
        try:
            return decoder(batch(), image_size, mean, std)
        except SuiteError:
            raise  # the decoder is missing or misconfigured: not an image's fault
        except DecodeError as exc:
            if exc.image_index in host:
                raise
            host[exc.image_index] = f"{decoder.name} failed: {' '.join(str(exc).split())[:200]}"
        except Exception:  # which image? each alone, among placeholders
            culprits = {}
            for index in [i for i in range(len(encoded)) if i not in host]:
                try:
                    decoder(batch(only=index), image_size, mean, std)
                except SuiteError:
                    raise
                except Exception as alone:  # noqa: BLE001 - this one goes to the host, with the decoder's words
                    culprits[index] = f"{decoder.name} failed: {type(alone).__name__}: " \
                                      f"{' '.join(str(alone).split())[:200]}"
            if not culprits:
                raise  # the batch fails but no image alone does: not a per-image problem
            host.update(culprits)
        if len(host) == len(encoded):
            return None
    raise SuiteError(f"{decoder.name} kept failing on a batch of {len(encoded)} images")

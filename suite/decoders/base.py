"""The decoder interface: encoded images in, a batch on the device out.

A decoder serves one loader kind (``device``: decoding on the device; ``dali``: NVIDIA DALI) for the adapters that
name it (:attr:`suite.devices.base.DeviceTraits.decoders`). Decoders are plugins of the entry-point group
``suite.decoders``, like devices. One that also resizes, crops and normalizes (DALI, Habana's media pipe) says so
with :attr:`Decoder.preprocesses`; one that only decodes (Pillow, nvJPEG) returns uint8 images that the workload
preprocesses on the device. A decoder builds what it needs on first use and keeps it for the configuration: a
decoder with pipelines keeps one per batch size (:class:`PipesBySize`), so that the evaluation's last, shorter batch
never makes the training batches' pipeline be rebuilt inside a measured step.

Images a decoder does not decode as the reference does (another format, CMYK, 16-bit pixels...) are said so by
:meth:`Decoder.refusal`, from the header alone, and decoded on the host instead (:mod:`.fallback`), one at a time,
counted and recorded; nothing is silently different.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Hashable, Sequence

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter
    from suite.imaging import ImageKind


class Decoder(ABC):
    #: Registered name (``suite.decoders`` entry point), recorded as what decoded the batches.
    name: ClassVar[str]
    #: The loader it serves: ``device`` or ``dali``.
    loader: ClassVar[str]
    #: True: returns normalized float32 ``(N, 3, size, size)``; False: a list of uint8 ``(3, H, W)`` images.
    preprocesses: ClassVar[bool]
    description: ClassVar[str]

    def __init__(self, device: "DeviceAdapter") -> None:
        self.device = device

    @property
    def builds(self) -> int:
        """Pipelines built so far (0 for a decoder without any)."""
        return 0

    def refusal(self, kind: "ImageKind") -> str | None:
        """Why an image of ``kind`` is not decoded here the way the reference decodes it (it is then decoded on the
        host), or ``None`` when it is."""
        return None

    def ran(self) -> str:
        """What ran, as the records say it: the decoder's name and the settings it chose (DALI's host threads)."""
        return self.name

    @abstractmethod
    def __call__(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> Any:
        """Decode (and, when :attr:`preprocesses`, preprocess) one batch on the device."""

    def close(self) -> None:
        """Release what the decoder built."""


class PipesBySize:
    """Built pipelines, one per key (batch size, image size); each closed with ``close_one`` at the end."""

    def __init__(self, close_one: Callable[[Any], None]) -> None:
        self._pipes: dict[Hashable, Any] = {}
        self._close_one = close_one
        self.builds = 0

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        if key not in self._pipes:
            self._pipes[key] = build()
            self.builds += 1
        return self._pipes[key]

    def pipes(self) -> list[Any]:
        """The pipelines built and not closed yet."""
        return list(self._pipes.values())

    def close(self) -> None:
        pipes, self._pipes = list(self._pipes.values()), {}
        for pipe in pipes:
            self._close_one(pipe)


class DecodeError(Exception):
    """A decoder could not decode image ``image_index`` of the batch (the workload names its file)."""

    def __init__(self, image_index: int, message: str) -> None:
        super().__init__(message)
        self.image_index = image_index

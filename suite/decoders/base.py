"""The decoder interface: encoded images in, a batch on the device out.

A decoder serves one loader kind (``device``: decoding on the device; ``dali``: NVIDIA DALI) for the adapters that
name it (:attr:`suite.devices.base.DeviceAdapter.decoders`). Decoders are plugins of the entry-point group
``suite.decoders``, like devices. One that also resizes, crops and normalizes (DALI, Habana's media pipe) says so
with :attr:`Decoder.preprocesses`; one that only decodes (Pillow, nvJPEG) returns uint8 images that the workload
preprocesses on the device. A decoder builds what it needs on first use and keeps it for the configuration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter


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

    @abstractmethod
    def __call__(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> Any:
        """Decode (and, when :attr:`preprocesses`, preprocess) one batch on the device."""

    def close(self) -> None:
        """Release what the decoder built."""


class DecodeError(Exception):
    """A decoder could not decode image ``image_index`` of the batch (the workload names its file)."""

    def __init__(self, image_index: int, message: str) -> None:
        super().__init__(message)
        self.image_index = image_index

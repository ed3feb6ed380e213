"""The ``dali`` loader: NVIDIA DALI decodes and preprocesses each batch of encoded images.

DALI (``nvidia-dali-cuda120``, the ``dali`` extra; imported only here) runs a small pipeline per batch:
``external_source`` (the batch's encoded bytes, as read by the DataLoader workers) -> ``decoders.image``
(nvJPEG on the GPU, ``device="mixed"``; libjpeg-turbo on the CPU device) -> ``resize`` of the shorter side,
cubic, antialiased -> ``crop_mirror_normalize`` (center crop, CLIP mean/std, float32, CHW). The result is
copied into a torch tensor on the device with ``nvidia.dali.plugin.pytorch.feed_ndarray``. DALI's resampling
is its own, so the pixels are close to, not equal to, the reference transform; the records name the loader.
"""

from __future__ import annotations

from typing import Any, Sequence

from suite.errors import SuiteError


class DaliPreprocessor:
    """One built DALI pipeline for a batch size and an image size; call it with a batch's encoded bytes."""

    def __init__(self, batch_size: int, image_size: int, mean: Sequence[float], std: Sequence[float],
                 device_id: int | None, num_threads: int = 2) -> None:
        try:
            from nvidia.dali import fn, pipeline_def, types
        except ImportError as exc:
            raise SuiteError(f"the dali loader needs NVIDIA DALI: pip install 'suite-bench[dali]' ({exc})") from exc
        self.batch_size, self.image_size, self.device_id = batch_size, image_size, device_id
        decoder_device = "cpu" if device_id is None else "mixed"

        @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id)
        def preprocess() -> Any:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            images = fn.decoders.image(encoded, device=decoder_device, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=image_size, interp_type=types.INTERP_CUBIC, antialias=True)
            return fn.crop_mirror_normalize(images, crop=(image_size, image_size), crop_pos_x=0.5, crop_pos_y=0.5,
                                            mean=[m * 255.0 for m in mean], std=[s * 255.0 for s in std],
                                            dtype=types.FLOAT, output_layout="CHW")

        self._pipe = preprocess()
        self._pipe.build()

    def __call__(self, encoded: Sequence[bytes], torch_device: Any) -> Any:
        import numpy as np
        import torch
        from nvidia.dali.plugin.pytorch import feed_ndarray

        if len(encoded) != self.batch_size:
            raise SuiteError(f"the DALI pipeline was built for batches of {self.batch_size}, got {len(encoded)}")
        self._pipe.feed_input("encoded", [np.frombuffer(data, dtype=np.uint8) for data in encoded])
        (images,) = self._pipe.run()
        batch = images.as_tensor()
        out = torch.empty(tuple(batch.shape()), dtype=torch.float32, device=torch_device)
        feed_ndarray(batch, out)
        return out

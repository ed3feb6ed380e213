"""The ``device`` loader on Gaudi: habana-media-loader decodes and preprocesses each batch on the HPU.

Written against habana-media-loader 1.24.1 (the ``gaudi`` extra; imported only here), as optimum-habana's CLIP media
pipe (``examples/contrastive-image-text/clip_media_pipe.py``) builds it: a reader node -> ``fn.ImageDecoder`` (RGB
planar, center crop, bicubic resize to the model's size) -> ``fn.CropMirrorNorm`` with the mean and 1/std scaled by
255, float32. Where optimum-habana's reader hands the decoder file paths (``readerOutType.FILE_LIST``), the suite's
batches arrive as encoded bytes from the DataLoader workers, so its reader is the library's external reader op
(``fn.MediaExtReaderOp`` with an implementation of ``media_ext_reader_op_impl``) returning
``readerOutType.BUFFER_LIST``: one numpy uint8 buffer per image, padded to a multiple of 64 bytes (what
``backend/legacy.py`` hands the native decoder; the library's own buffer reader ``read_image_from_dir_buf`` pads
the same way). One batch is put in the reader's queue before each ``run()``, and the pipe does not prefetch. The
queue is bound to the reader class, not passed in ``priv_params``: the library deep-copies a node's params
(``backend/operator_specs.py``), and a queue (it holds a lock) cannot be copied.

The pipe is driven through the library's ``HPUGenericPytorchIterator``, which builds it; ``iter()`` must be called
once before the first ``next()``: the iterator's ``__iter__`` is what calls ``pipe.iter_init()``, which creates the
executor ``run()`` needs. One pipe per batch size is kept (:class:`~suite.decoders.base.PipesBySize`: the evaluation's
last, shorter batch never makes the training pipe be rebuilt), each closed with the library's ``pipe.del_iter()``
(which releases the device and the executor) at the end. The decoder crops before it resizes, so its pixels are close
to, not equal to, the reference transform; the records name the decoder that ran. The HPU decoder takes baseline JPEG:
other formats, progressive or CMYK JPEGs and EXIF-rotated photos (the reference ignores the rotation; the media pipe's
handling of it is not documented) are decoded on the host (:mod:`suite.decoders.fallback`).
"""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING, Any, Sequence

from suite.decoders.base import Decoder, PipesBySize
from suite.errors import SuiteError
from suite.imaging import ImageKind

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter

#: The reader's length in batches: endless (a batch is fed per run).
ENDLESS = 2**31 - 1


def pad_to_64(data: bytes) -> Any:
    """An encoded image as the native decoder takes it: uint8, its length padded to a multiple of 64 bytes."""
    import numpy as np

    raw = np.frombuffer(data, dtype=np.uint8)
    return np.pad(raw, (0, (-len(raw)) % 64), "constant")


def encoded_batch_reader(feed: "queue.Queue[list[bytes]]") -> type:
    """A reader implementation class reading batches from ``feed``: a subclass of the library's
    ``media_ext_reader_op_impl`` (made on use: the library is imported only here)."""
    import numpy as np
    from habana_frameworks.mediapipe.media_types import dtype, readerOutType
    from habana_frameworks.mediapipe.operators.reader_nodes.reader_nodes import (
        media_ext_reader_op_impl,
        media_ext_reader_op_tensor_info,
    )

    class EncodedBatchReader(media_ext_reader_op_impl):
        """Hands the media pipe the batch of encoded images the suite put in the decoder's feed."""

        def __init__(self, params: dict[str, Any], fw_params: Any) -> None:
            self.batch_size = fw_params.batch_size
            self.feed = feed

        def __iter__(self) -> "EncodedBatchReader":
            return self

        def __next__(self) -> Any:
            try:
                encoded = self.feed.get_nowait()
            except queue.Empty:
                raise SuiteError("the media pipe asked for a batch that was not fed (it must not prefetch)") from None
            if len(encoded) != self.batch_size:
                raise SuiteError(f"the media pipe was built for batches of {self.batch_size}, got {len(encoded)}")
            buffers = np.empty(shape=[len(encoded)], dtype=object)
            for index, data in enumerate(encoded):
                buffers[index] = pad_to_64(data)
            return buffers

        def __len__(self) -> int:
            return ENDLESS

        def gen_output_info(self) -> Any:
            return media_ext_reader_op_tensor_info(dtype.NDT, np.array([self.batch_size], dtype=np.uint32), "")

        def get_largest_file(self) -> str:
            return ""  # buffers, not files

        def get_media_output_type(self) -> Any:
            return readerOutType.BUFFER_LIST

    return EncodedBatchReader


class HabanaMediaDecoder(Decoder):
    name = "habana-media-pipe"
    loader = "device"
    preprocesses = True
    description = ("habana-media-loader on the HPU: ImageDecoder (center crop, bicubic resize) + CropMirrorNorm, "
                   "fed the encoded bytes through an external reader (BUFFER_LIST)")

    def __init__(self, device: DeviceAdapter) -> None:
        super().__init__(device)
        self._feed: queue.Queue = queue.Queue()
        self._pipes = PipesBySize(lambda built: built[0].del_iter())  # (pipe, its batches)

    @property
    def builds(self) -> int:
        return self._pipes.builds

    def refusal(self, kind: ImageKind) -> str | None:
        if kind.format != "JPEG":
            return f"the media pipe's decoder takes JPEG only, not {kind.format}"
        if kind.mode not in ("RGB", "L"):
            return f"a {kind.mode} JPEG: the media pipe's decoder takes YCbCr and greyscale JPEGs"
        if kind.progressive:
            return "a progressive JPEG: the HPU decoder takes baseline JPEG"
        if kind.orientation != 1:
            return f"EXIF orientation {kind.orientation}: the reference ignores it; the media pipe's handling is not " \
                   "documented"
        return None

    def make_pipe(self, batch_size: int, image_size: int, mean: Sequence[float], std: Sequence[float]) -> Any:
        """The media pipe for batches of ``batch_size`` images, reading from this decoder's feed (not built yet)."""
        import numpy as np

        try:
            from habana_frameworks.mediapipe import fn
            from habana_frameworks.mediapipe.media_types import dtype, ftype, imgtype, mediaDeviceType, randomCropType
            from habana_frameworks.mediapipe.mediapipe import MediaPipe
        except ImportError as exc:
            raise SuiteError(f"the device loader on Gaudi2 needs habana-media-loader: pip install "
                             f"'suite-bench[gaudi]' ({exc})") from exc
        reader = encoded_batch_reader(self._feed)

        class SuiteEncodedBatchPipe(MediaPipe):
            def __init__(self) -> None:
                super().__init__(device=mediaDeviceType.LEGACY, prefetch_depth=0, batch_size=batch_size,
                                 num_threads=1, pipe_name="SuiteEncodedBatchPipe")
                self.read = fn.MediaExtReaderOp(impl=reader, num_outputs=1)
                self.decode = fn.ImageDecoder(device="hpu", output_format=imgtype.RGB_P,
                                              resize=[image_size, image_size], resampling_mode=ftype.BICUBIC,
                                              random_crop_type=randomCropType.CENTER_CROP)
                self.mean = fn.MediaConst(data=np.array(mean, dtype=np.float32) * 255, shape=[1, 1, 3],
                                          dtype=dtype.FLOAT32)
                self.inv_std = fn.MediaConst(data=1 / (np.array(std, dtype=np.float32) * 255), shape=[1, 1, 3],
                                             dtype=dtype.FLOAT32)
                self.normalize = fn.CropMirrorNorm(crop_w=image_size, crop_h=image_size, crop_pos_x=0.5,
                                                   crop_pos_y=0.5, crop_d=0, dtype=dtype.FLOAT32)

            def definegraph(self) -> Any:
                images = self.decode(self.read())
                return self.normalize(images, self.mean(), self.inv_std())

        return SuiteEncodedBatchPipe()

    def _build(self, batch_size: int, image_size: int, mean: Sequence[float], std: Sequence[float]) -> Any:
        """(the pipe, the iterator over its batches), started."""
        from habana_frameworks.mediapipe.plugins.iterator_pytorch import HPUGenericPytorchIterator

        pipe = self.make_pipe(batch_size, image_size, mean, std)
        iterator = HPUGenericPytorchIterator(mediapipe=pipe)  # builds the pipe
        return pipe, iter(iterator)  # __iter__ -> pipe.iter_init(): creates the executor run() needs

    def close(self) -> None:
        self._pipes.close()

    def __call__(self, encoded: Sequence[bytes], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> Any:
        _, batches = self._pipes.get((len(encoded), image_size),
                                     lambda: self._build(len(encoded), image_size, mean, std))
        self._feed.put(list(encoded))
        (images,) = next(batches)
        return images

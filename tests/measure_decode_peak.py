"""Measures the peak memory of each image pipeline's worker stage, run by ``tests/test_loader_budget.py`` in a
fresh process: ``python tests/measure_decode_peak.py IMAGE_SIZE`` prints one JSON line per (pipeline, format,
width, height) with the pipeline's own estimate (:meth:`ImagePipeline.peak_bytes`) and the measured growth of the
process's resident high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` before each image, freed
memory returned to the kernel with glibc's ``malloc_trim`` first)."""

from __future__ import annotations

import ctypes
import gc
import io
import json
import sys

import numpy as np
from PIL import Image

from workloads.bridgetower.data.pipelines import PIPELINES

SHAPES = [(2000, 2000), (8000, 300), (300, 8000)]
FORMATS = ["JPEG", "PNG"]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _encode(width: int, height: int, fmt: str) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def main() -> int:
    image_size = int(sys.argv[1])
    libc = ctypes.CDLL("libc.so.6")
    Image.MAX_IMAGE_PIXELS = None
    images = {(fmt, w, h): _encode(w, h, fmt) for fmt in FORMATS for w, h in SHAPES}
    for name, pipeline_cls in PIPELINES.items():
        pipeline = pipeline_cls(image_size, "cpu")
        for fmt in FORMATS:
            pipeline.worker_stage(_encode(400, 300, fmt))  # first-call set-up is not the image's
        for (fmt, width, height), data in images.items():
            gc.collect()
            libc.malloc_trim(0)
            before = _status_kib("VmRSS")
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # resets VmHWM to the current RSS
            pipeline.worker_stage(data)
            measured = (_status_kib("VmHWM") - before) * 1024
            print(json.dumps({"pipeline": name, "format": fmt, "width": width, "height": height,
                              "measured": measured, "estimate": pipeline.peak_bytes(data, width, height)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

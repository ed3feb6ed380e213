"""pytest-benchmark runs of the three image pipelines (reference, closed, open) on the same JPEGs.

    pytest benchmarks/test_image_pipelines.py --benchmark-autosave          # then, later:
    pytest benchmarks/test_image_pipelines.py --benchmark-compare --benchmark-compare-fail=median:10%

One round = one batch of 48 synthetic New-Yorker-like JPEGs through the worker stage on one thread (as in
a DataLoader worker) and the device stage on the CPU, so the table compares the pipelines side by side in
one run and a saved run gates regressions of each. ``extra_info`` carries the fidelity against the
reference (closed: largest deviation after normalization; open: PSNR), the JPEG decoder and the resampler.
End-to-end DataLoader throughput is ``suite bench-loader``'s job.
"""

import pytest
import torch

from workloads.bridgetower.bench_loader import CLOSED_TOLERANCE
from workloads.bridgetower.data.pipelines import PIPELINES, jpeg_decoder_name, psnr_db
from workloads.bridgetower.data.resample import resampler_name
from workloads.bridgetower.data.catalog import open_source

IMAGES, SIZE = 48, 294


@pytest.fixture(scope="module")
def jpegs():
    source = open_source(None)
    return [source.read_bytes(i) for i in range(IMAGES)]


@pytest.fixture(scope="module")
def reference_batch(jpegs):
    pipeline = PIPELINES["reference"](SIZE)
    return pipeline.device_stage(torch.stack([pipeline.worker_stage(d) for d in jpegs]), "cpu")


@pytest.mark.parametrize("name", list(PIPELINES))
def test_image_pipeline_batch(benchmark, jpegs, reference_batch, name):
    pipeline = PIPELINES[name](SIZE)
    pipeline.worker_init()

    def one_batch():
        return pipeline.device_stage(torch.stack([pipeline.worker_stage(d) for d in jpegs]), "cpu")

    benchmark.group = "image pipelines (one batch of 48 JPEGs, one thread)"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batch = benchmark.pedantic(one_batch, rounds=5, warmup_rounds=1)
    finally:
        torch.set_num_threads(threads)
    benchmark.extra_info.update(pipeline=name, description=pipeline.description, jpeg_decoder=jpeg_decoder_name(),
                                resampler=resampler_name(), images=IMAGES, image_size=SIZE)
    assert batch.shape == reference_batch.shape and batch.dtype == torch.float32
    if name == "closed":
        error = float((batch - reference_batch).abs().max())
        benchmark.extra_info["max_abs_error_vs_reference"] = error
        assert error <= CLOSED_TOLERANCE
    elif name == "open":
        benchmark.extra_info["psnr_db_vs_reference"] = psnr_db(reference_batch, batch)

"""Image pipelines: ours (closed) equals the reference within 1/255; the open one is measured by PSNR."""

import gc
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from suite.cli import main
from suite.errors import DatasetError
from workloads.bridgetower import bench_loader
from workloads.bridgetower.bench_loader import CLOSED_TOLERANCE
from workloads.bridgetower.data.loader import CaptionedImages, collate
from workloads.bridgetower.data.pipelines import PIPELINES, decode_rgb_hwc, psnr_db
from workloads.bridgetower.data.catalog import open_source
from workloads.bridgetower.data.sources import ImageFolderSource
from workloads.bridgetower.data.synthetic import ensure_synthetic

from conftest import runs_of

SIZE = 294


def _finish(name, images, device_type="cpu"):
    """Worker stage then device stage; ``device_type`` decides where our pipelines normalize (the device
    stage itself runs on the CPU here either way)."""
    pipeline = PIPELINES[name](SIZE, device_type)
    return pipeline.device_stage(torch.stack([pipeline.worker_stage(d) for d in images]), "cpu")


@pytest.fixture(scope="module")
def jpegs():
    source = open_source(None)
    return [source.read_bytes(i) for i in range(24)]


def test_closed_pipeline_equals_the_reference_within_one_255th_after_normalization(jpegs):
    reference = _finish("reference", jpegs)
    for device_type in ("cpu", "cuda"):  # normalized in the workers, or float16 sent and normalized after
        closed = _finish("closed", jpegs, device_type)
        assert closed.dtype == torch.float32 and closed.shape == reference.shape == (24, 3, SIZE, SIZE)
        assert float((closed - reference).abs().max()) <= CLOSED_TOLERANCE
    # bicubic overshoot beyond [0, 1] is kept, as in the reference (a uint8 pipeline would clamp it)
    assert float(reference.min()) < (0 - 0.4815) / 0.2686 - 0.05


def _encode(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def test_closed_pipeline_handles_every_image_kind_like_the_reference():
    rng = np.random.default_rng(0)
    base = Image.fromarray(rng.integers(0, 255, (333, 401, 3), dtype=np.uint8))
    images = [
        _encode(base.convert("L"), "JPEG"),  # grayscale JPEG
        _encode(base.convert("CMYK"), "JPEG"),  # CMYK JPEG: Pillow path
        _encode(base, "PNG"),
        _encode(base.convert("RGBA"), "PNG"),
        _encode(base, "JPEG", quality=80, progressive=True),
        _encode(base.resize((300, 500)), "JPEG"),  # portrait: the other pass order
    ]
    reference, closed = _finish("reference", images), _finish("closed", images)
    assert float((closed - reference).abs().max()) <= CLOSED_TOLERANCE


def test_jpeg_fast_path_decodes_the_same_pixels_as_pillow(jpegs):
    for data in jpegs[:8]:
        with Image.open(io.BytesIO(data)) as image:
            assert np.array_equal(decode_rgb_hwc(data), np.asarray(image.convert("RGB")))


def test_open_pipeline_differs_and_reports_its_fidelity(jpegs):
    reference, opened = _finish("reference", jpegs), _finish("open", jpegs)
    sent = PIPELINES["open"](SIZE, "cpu").worker_stage(jpegs[0])
    assert sent.dtype == torch.uint8 and sent.shape == (3, SIZE, SIZE)  # uint8 crosses, even to the CPU device
    assert torch.allclose(_finish("open", jpegs, "cuda"), opened, atol=1e-5)  # uint8 sent: same result
    assert opened.shape == reference.shape and opened.dtype == torch.float32
    assert not torch.allclose(opened, reference, atol=CLOSED_TOLERANCE)
    psnr = psnr_db(reference, opened)
    assert 15 < psnr < 60
    assert psnr_db(reference, reference) == float("inf")
    assert psnr_db(reference, _finish("closed", jpegs)) > 60


def test_a_broken_image_in_the_fast_loader_names_the_file(tmp_path):
    root = ensure_synthetic(samples=4, seed=1, root=tmp_path / "data")
    victim = root / "00002.jpg"
    victim.write_bytes(victim.read_bytes()[:1500])
    source = ImageFolderSource(root)
    ids = torch.zeros(4, 8, dtype=torch.long)
    dataset = CaptionedImages(source, ids, ids, "cpu-fast", 64)
    assert dataset[0]["images"].dtype == torch.float32  # on the CPU device: normalized in the workers
    for_accelerator = CaptionedImages(source, ids, ids, "cpu-fast", 64, device_type="cuda")
    assert for_accelerator[0]["images"].dtype == torch.float16  # normalized on the device
    with pytest.raises(DatasetError, match=f"cannot decode image {victim}"):
        dataset[2]


def test_fast_loader_batches_finish_to_the_reference_pixel_values(tmp_path):
    source = ImageFolderSource(ensure_synthetic(samples=4, seed=2, root=tmp_path / "data"))
    ids = torch.zeros(4, 8, dtype=torch.long)
    reference = CaptionedImages(source, ids, ids, "cpu", 64)
    fast = CaptionedImages(source, ids, ids, "cpu-fast", 64)
    a = reference.pipeline.device_stage(collate([reference[i] for i in range(4)])["images"], "cpu")
    b = fast.pipeline.device_stage(collate([fast[i] for i in range(4)])["images"], "cpu")
    assert float((a - b).abs().max()) <= CLOSED_TOLERANCE


def test_bench_loader_json_carries_the_ratios_and_psnr(capsys, tmp_path):
    code = main(["bench-loader", "--images", "16", "--batch-size", "8", "--num-workers", "1", "--rounds", "1",
                 "--image-size", "64", "--train-steps", "6", "--json", "--output", str(tmp_path / "figures")])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures == json.loads((tmp_path / "figures" / "bench-loader.json").read_text())
    for key in ("closed_vs_reference", "open_vs_reference", "open_psnr_db"):
        assert isinstance(figures[key], float) and figures[key] > 0
    assert set(figures["pipelines"]) == {"reference", "closed", "open"}
    for row in figures["pipelines"].values():
        assert row["end_to_end_batches_per_s"] > 0 and row["images_per_s_per_worker"] > 0
        assert len(row["end_to_end_batches_per_s_rounds"]) == 1
    ratio = figures["pipelines"]["closed"]["end_to_end_batches_per_s"] / figures["pipelines"]["reference"][
        "end_to_end_batches_per_s"]
    assert figures["closed_vs_reference"] == pytest.approx(ratio)
    assert figures["fidelity"]["closed_within_tolerance"] is True
    # the closed pipeline's time per image against libjpeg-turbo's decode alone, both on one worker thread
    assert figures["closed_per_image_vs_decode"] == pytest.approx(
        figures["closed_per_image_s"] / figures["decode_per_image_s"])
    assert figures["closed_per_image_vs_decode"] > 1  # it decodes, then resizes: never faster than decoding alone
    assert figures["settings"]["num_workers"] == 1 and figures["settings"]["batch_size"] == 8
    # our pipelines' batches travel in the workers' reused shared memory, the reference's in torch's fresh buffers
    shared = figures["settings"]["shared_batches"]
    assert set(shared) == {"closed", "open"}
    for counts in shared.values():  # warm-up and one round of two batches each, every one accounted for
        assert counts["reused"] + counts["new"] + counts["fresh"] == 4 and counts["new"] >= 1
    training = figures["training"]  # does the open pipeline still teach the model? closed and open side by side
    assert training["steps"] == 6 and set(training) >= {"closed", "open", "open_vs_closed_eval_accuracy"}
    for name in ("closed", "open"):
        assert 0 <= training[name]["eval_accuracy"] <= 1 and training[name]["final_loss_mean_last_10"] > 0


def test_bench_loader_keeps_the_collector_off_its_objects_while_it_measures(monkeypatch, capsys):
    """As the training process does (``kept_shared_with_forks``): no full collection examines the objects made before
    the epochs (0.2-0.4 s each time in this process, against ~0.7 s for an epoch of the closed pipeline), nor
    copies their pages out of the workers'; the collector has them back afterwards."""
    epoch, frozen_during = bench_loader._end_to_end_epoch, []

    def watched(loader, pipeline):
        frozen_during.append(gc.get_freeze_count())
        return epoch(loader, pipeline)

    monkeypatch.setattr(bench_loader, "_end_to_end_epoch", watched)
    assert main(["bench-loader", "--images", "16", "--batch-size", "8", "--num-workers", "1", "--rounds", "1",
                 "--image-size", "64", "--train-steps", "0", "--json"]) == 0
    capsys.readouterr()
    assert len(frozen_during) == 6 and min(frozen_during) > 10_000, frozen_during  # warm-up + one round, 3 each
    assert gc.get_freeze_count() == 0


def test_bench_loader_refuses_more_images_than_the_dataset_has(capsys):
    assert main(["bench-loader", "--images", "100000", "--json"]) == 2
    assert "fewer than --images 100000" in capsys.readouterr().err


@pytest.mark.e2e
def test_training_with_the_fast_loader_follows_the_reference_loss_trajectory(tmp_path):
    code = main(["run", "--loader", "cpu,cpu-fast", "--workers", "1", "--steps", "4", "--warmup-steps", "1",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"])
    assert code == 0
    reference, fast = runs_of(tmp_path / "out")
    assert reference["facts"]["workload"]["image_pipeline"] == "reference"
    assert fast["facts"]["workload"]["image_pipeline"] == "closed"
    assert fast["config"]["loader"] == fast["facts"]["loader_used"] == "cpu-fast"
    assert fast["losses"] == pytest.approx(reference["losses"], rel=1e-3)



def _sigterm_is_default(pipeline, images):
    import signal

    return 1.0 if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else 0.0


@pytest.mark.mechanics
def test_the_per_worker_measure_runs_in_a_worker_that_sigterm_ends_quietly(jpegs):
    """The pool's worker used to inherit the CLI's SIGTERM handler (it raises, to record a run as KILLED): Pool.__exit__
    terminates the worker, and `suite bench-loader` printed 'Process ForkPoolWorker-N ... suite.cli.Terminated'
    tracebacks on most runs (exit 0). The worker now has the default action."""
    import signal

    from suite.cli.main import _raise_terminated
    from workloads.bridgetower import bench_loader
    from workloads.bridgetower.data.pipelines import PIPELINES

    previous = signal.signal(signal.SIGTERM, _raise_terminated)  # as `suite bench-loader` runs
    try:  # the measure runs in the forked worker
        assert bench_loader._in_measuring_worker(PIPELINES["closed"](64), _sigterm_is_default, jpegs[:2]) == 1.0
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.mechanics
def test_closed_and_decode_alone_are_timed_in_pairs_in_alternating_order(monkeypatch):
    """Each image goes through both right after each other, first one then the other, so that a slow spell of a
    shared machine hits both sides of ``closed_per_image_vs_decode`` alike (timed apart, the ratio of unchanged
    code ranged 1.11-1.64 over three runs here)."""
    from workloads.bridgetower import bench_loader

    calls: list[tuple[str, bytes]] = []

    class Recording:
        def worker_stage(self, data):
            calls.append(("closed", data))

    monkeypatch.setattr(bench_loader, "decode_rgb_hwc", lambda data: calls.append(("decode", data)))
    closed_s, decode_s = bench_loader._paired_with_decode(Recording(), [b"a", b"b", b"c"])
    assert calls == [("decode", b"a"), ("closed", b"a"), ("closed", b"b"), ("decode", b"b"), ("decode", b"c"),
                     ("closed", b"c")]
    assert closed_s > 0 and decode_s > 0

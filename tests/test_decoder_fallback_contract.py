"""Every image a hardware decoder meets (issue 25, defects 5-8), against the real libraries that run here: DALI's CPU
pipeline (nvidia-dali-cuda120 2.4, the same graph the GPU runs with ``device="mixed"``), habana-media-loader's own
Python code over its native stand-in (tests/standins/habana_media_native.py), Pillow for the reference. nvJPEG
(torchvision's GPU decode) cannot run here: its refusals are checked by header, and its runtime failures through a
decoder that fails the way ``decode_jpeg`` does (an exception for the batch, no index).

The odd-image corpus (tests/odd_images.py): CMYK, greyscale, progressive and EXIF-rotated JPEGs, a 16-bit PNG, a
palette PNG with transparency, an RGBA PNG, an animated GIF, WebP, BMP, TIFF, a JPEG named .png.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from suite.cli import main
from suite.decoders.base import DecodeError, Decoder
from suite.decoders.fallback import DecoderBroken, decode_with_fallback, placeholder_jpeg
from suite.errors import SuiteError
from suite.imaging import ImageKind, decode_to_rgb_tensor

from conftest import cpu_adapter, require, runs_of

sys.path.insert(0, str(Path(__file__).parent))
from odd_images import exif_rotated_jpeg, odd_images  # noqa: E402

pytestmark = [pytest.mark.hardware_contract, pytest.mark.mechanics]
MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def _reference(data: bytes, size: int = 64) -> torch.Tensor:
    from workloads.bridgetower.preprocessing import preprocess_image

    return preprocess_image(decode_to_rgb_tensor(data), size, MEAN, STD)


def _finish(image: torch.Tensor) -> torch.Tensor:
    from workloads.bridgetower.preprocessing import preprocess_image

    return preprocess_image(image, 64, MEAN, STD)


# --- which images each decoder leaves to the host -----------------------------------------------------------

EXPECTED_HOST = {
    # DALI's CPU decoder checked image by image on this corpus: GIF unreadable; 16-bit PNG scaled where Pillow clips
    "dali": {"cmyk.jpg", "sixteen-bit.png", "animated.gif"},
    "nvjpeg": {"cmyk.jpg", "sixteen-bit.png", "palette-transparent.png", "rgba.png", "animated.gif", "lossy.webp",
               "plain.bmp", "plain.tiff"},
    "habana-media-pipe": {"cmyk.jpg", "progressive.jpg", "exif-rotated.jpg", "sixteen-bit.png",
                          "palette-transparent.png", "rgba.png", "animated.gif", "lossy.webp", "plain.bmp",
                          "plain.tiff"},
    "pillow": set(),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_HOST))
def test_each_decoder_refuses_by_header_what_it_does_not_decode_as_the_reference(name):
    from suite.registry import load_decoder

    decoder = load_decoder(name)(cpu_adapter())
    refused = {file for file, data in odd_images().items() if decoder.refusal(ImageKind.of(data)) is not None}
    assert refused == EXPECTED_HOST[name]
    assert decoder.refusal(ImageKind.of(odd_images()["jpeg-named.png"])) is None  # the header says JPEG


def test_the_whole_corpus_through_dali_matches_the_reference_image_by_image():
    """One batch of all twelve: DALI decodes nine, the host three; every image equals the reference transform within
    DALI's own resampling (measured here: 1e-7 on these small images, since no downscale happens)."""
    require("nvidia.dali")
    decoder = cpu_adapter().decoders.for_loader("dali")
    corpus = odd_images()
    kinds = [ImageKind.of(data) for data in corpus.values()]
    done = decode_with_fallback(decoder, list(corpus.values()), kinds, 64, MEAN, STD, _finish)
    names = list(corpus)
    assert {names[i] for i in done.fallbacks} == EXPECTED_HOST["dali"]
    assert "DALI's decoder does not read GIF" in done.fallbacks[names.index("animated.gif")]
    for name, data, pixels in zip(names, corpus.values(), done.pixels, strict=True):
        assert pixels.shape == (3, 64, 64)
        assert (pixels - _reference(data)).abs().mean().item() < 0.02, name
    assert decoder.builds == 1  # the host's images held placeholders: the batch size never changed
    decoder.close()


def test_dali_ignores_exif_orientation_as_the_reference_does():
    """Defect 6: fn.decoders.image rotates an orientation-6 JPEG by default (mean 1.5 normalized units from the
    reference); adjust_orientation=False keeps the stored pixels, as Pillow's decode does."""
    require("nvidia.dali")
    data = exif_rotated_jpeg()
    out = cpu_adapter().decoders.for_loader("dali")([data, data], 64, MEAN, STD)
    assert (out[0] - _reference(data)).abs().mean().item() < 0.02


def test_dali_keeps_the_cubic_filters_overshoot_as_the_reference_does():
    """Defect 6: fn.resize keeps uint8 unless told otherwise, clamping the cubic overshoot at black/white edges
    before normalization; the reference resizes floats and keeps it."""
    require("nvidia.dali")
    import io

    import numpy as np
    from PIL import Image

    checker = np.kron((np.indices((4, 4)).sum(0) % 2) * 255, np.ones((4, 4))).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.stack([checker] * 3, -1)).save(buffer, "PNG")
    data = buffer.getvalue()
    out = cpu_adapter().decoders.for_loader("dali")([data, data], 64, MEAN, STD)[0]
    reference = _reference(data)
    black = torch.tensor([-m / s for m, s in zip(MEAN, STD)]).view(3, 1, 1)
    assert (reference < black - 0.1).any()  # the reference overshoots below black
    assert out.amin().item() < black.min().item() - 0.1
    assert (out - reference).abs().mean().item() < 0.02


# --- runtime failures: the image the decoder fails on goes to the host ------------------------------------------

class _FailingOn(Decoder):
    """A decoder that fails on given image bytes: with the image's index (DecodeError) or, as torchvision's batched
    decode_jpeg and DALI's run() do, with one exception for the whole batch."""

    name, loader, preprocesses, description = "failing", "device", False, "test decoder"

    def __init__(self, bad: set[bytes], with_index: bool) -> None:
        super().__init__(None)
        self.bad, self.with_index, self.calls = bad, with_index, 0

    def __call__(self, encoded, image_size, mean, std):
        self.calls += 1
        for index, data in enumerate(encoded):
            if data in self.bad:
                if self.with_index:
                    raise DecodeError(index, "corrupt marker")
                raise RuntimeError("nvjpegDecodeBatched failed")
        return [decode_to_rgb_tensor(data) for data in encoded]


@pytest.mark.parametrize("with_index", [True, False])
def test_an_image_the_decoder_fails_on_is_decoded_on_the_host(with_index):
    corpus = odd_images()
    good = [corpus["grayscale.jpg"], corpus["progressive.jpg"], corpus["plain.bmp"]]
    bad = corpus["lossy.webp"]
    decoder = _FailingOn({bad}, with_index)
    encoded = [good[0], bad, good[1], good[2]]
    done = decode_with_fallback(decoder, encoded, [ImageKind.of(d) for d in encoded], 64, MEAN, STD, _finish)
    assert list(done.fallbacks) == [1] and done.fallbacks[1].startswith("failing failed: ")
    for data, pixels in zip(encoded, done.pixels, strict=True):
        assert torch.allclose(pixels, _reference(data), atol=1e-6)
    assert decoder.calls <= len(encoded) + 2


def test_an_image_neither_the_device_nor_the_host_decodes_is_named():
    garbage = b"\xff\xd8\xff\xe0" + b"\x00" * 64  # a JPEG start, then nothing
    decoder = _FailingOn({garbage}, with_index=True)
    encoded = [odd_images()["plain.bmp"], garbage]
    with pytest.raises(DecodeError) as caught:
        decode_with_fallback(decoder, encoded, [ImageKind.of(d) for d in encoded], 64, MEAN, STD, _finish)
    assert caught.value.image_index == 1 and "on the host too" in str(caught.value)


@pytest.mark.parametrize("refused_by_header", [0, 1])
def test_a_decoder_that_fails_on_every_image_of_a_batch_fails_instead_of_decoding_on_the_host(refused_by_header):
    """Issue 47 (5): torchvision built for another CUDA major than torch fails on every image; each went to Pillow and
    the run ended FINISHED, a host-decoding run recorded as device decoding."""
    corpus = odd_images()
    encoded = [corpus["grayscale.jpg"], corpus["progressive.jpg"]] + [corpus["plain.bmp"]] * refused_by_header
    decoder = _FailingOn(set(encoded), with_index=False)
    decoder.refusal = lambda kind: "not a JPEG" if kind.format != "JPEG" else None
    with pytest.raises(DecoderBroken, match=r"failing failed on every one of the 2 image\(s\) of a batch it should "
                                            r"decode \(first: failing failed: RuntimeError: nvjpegDecodeBatched"):
        decode_with_fallback(decoder, encoded, [ImageKind.of(d) for d in encoded], 64, MEAN, STD, _finish)


@pytest.mark.e2e
def test_a_broken_device_decoder_fails_the_configuration_with_its_words(tmp_path, test_plugins):
    from conftest import runs_of

    from suite.cli import main

    code = main(["run", "--device", "broken-decoder-standin", "--loader", "device", "--workers", "0", "--steps", "2",
                 "--warmup-steps", "0", "--no-progress", "--system-metrics-interval", "0", "--output",
                 str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    run, = runs_of(tmp_path / "out")
    assert code == 1 and run["status"] == "FAILED", run["reason"]
    assert "broken-standin failed on every one of the 8 image(s)" in run["reason"]
    assert "Couldn't load custom C++ ops" in run["reason"]


def test_a_missing_decoder_library_is_not_taken_for_a_bad_image(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    decoder = cpu_adapter().decoders.for_loader("dali")
    data = odd_images()["plain.bmp"]
    with pytest.raises(SuiteError, match="needs NVIDIA DALI"):
        decode_with_fallback(decoder, [data], [ImageKind.of(data)], 64, MEAN, STD, _finish)


def test_the_placeholder_is_a_baseline_rgb_jpeg_every_decoder_takes():
    kind = ImageKind.of(placeholder_jpeg())
    assert (kind.format, kind.mode, kind.progressive, kind.orientation) == ("JPEG", "RGB", False, 1)
    from suite.registry import load_decoder

    for name in EXPECTED_HOST:
        assert load_decoder(name)(cpu_adapter()).refusal(kind) is None


# --- pipelines: one per batch size, closed, never built inside a measured step ----------------------------------

def test_dali_keeps_one_pipeline_per_batch_size_and_shuts_them_down():
    """Defect 7: the evaluation's last, shorter batch rebuilt the pipeline, and the next training step rebuilt it
    again on its clock."""
    require("nvidia.dali")
    device = cpu_adapter()
    decoder = device.decoders.for_loader("dali")
    data = odd_images()["plain.bmp"]
    for size in (2, 1, 2, 1, 2):  # training, evaluation's last batch, training...
        assert decoder([data] * size, 32, MEAN, STD).shape == (size, 3, 32, 32)
    assert decoder.builds == 2 and device.decoders.builds() == 2
    pipes = decoder._pipes.pipes()
    assert sorted(p.max_batch_size for p in pipes) == [1, 2]
    device.teardown()
    assert all(p._pipe is None for p in pipes)  # DALI's own shutdown ran (Pipeline._shutdown drops its backend)


def test_the_media_pipe_keeps_one_pipe_per_batch_size_and_closes_each_with_del_iter(monkeypatch):
    require("habana_frameworks.mediapipe")
    from standins import habana_media_native
    from suite.decoders.habana_media import HabanaMediaDecoder

    habana_media_native.install(monkeypatch)
    from habana_frameworks.mediapipe.mediapipe import MediaPipe
    closed = []
    real = MediaPipe.del_iter
    monkeypatch.setattr(MediaPipe, "del_iter", lambda self: (closed.append(self), real(self)))
    decoder = HabanaMediaDecoder(cpu_adapter())
    data = odd_images()["grayscale.jpg"]
    for size in (2, 1, 2):
        assert tuple(decoder([data] * size, 16, (0.5,) * 3, (0.25,) * 3).shape) == (size, 3, 16, 16)
    assert decoder.builds == 2
    decoder.close()
    assert len(closed) == 2 and all(not pipe._pipeline_init for pipe in closed)  # the library's own release ran


@pytest.mark.e2e
def test_no_decoder_pipeline_is_built_inside_a_measured_step(tmp_path):
    """The dali loader on the CPU with an evaluation after every measured step: 51 evaluated pairs end in a batch of
    3, which used to rebuild the pipeline, and the next measured step rebuilt it again."""
    require("nvidia.dali")
    code = main(["run", "--loader", "dali", "--workers", "0", "--steps", "3", "--warmup-steps", "1",
                 "--eval-every", "1", "--eval-samples", "51", "--output", str(tmp_path / "out"), "--tracking-uri",
                 f"sqlite:///{tmp_path}/m.db", "--no-progress", "--system-metrics-interval", "0"])
    assert code == 0
    [run] = runs_of(tmp_path / "out")
    assert run["status"] == "FINISHED" and run["metrics"]["eval_count"] >= 3
    assert run["facts"]["workload"]["eval_samples"] % 8 != 0  # the evaluation meets a shorter batch
    assert run["metrics"]["decoder_builds_in_measured_steps"] == 0
    assert run["facts"]["decoder_builds_per_step"][0] == 1  # the first (warm-up) step built it
    assert run["metrics"]["device_decode_fallbacks"] == 0


# --- the mean and std go to the device once -----------------------------------------------------------------

def test_the_normalization_tensors_are_made_once_per_device(monkeypatch):
    """Defect 8: two tensors (two blocking copies on CUDA) were made for every image."""
    from workloads.bridgetower import preprocessing

    made = []
    real = torch.tensor
    monkeypatch.setattr(preprocessing.torch, "tensor", lambda *a, **k: made.append(k.get("device")) or real(*a, **k))
    preprocessing.normalization.cache_clear()
    images = [decode_to_rgb_tensor(odd_images()["plain.bmp"]) for _ in range(8)]
    for image in images:
        preprocessing.preprocess_image(image, 32)
    assert len(made) == 2  # mean and std, once


# --- the corpus trains through every loader that runs here ----------------------------------------------------

@pytest.mark.e2e
def test_the_odd_image_corpus_trains_through_every_loader(tmp_path):
    import shutil

    from workloads.bridgetower.data.catalog import held_out_split, open_source
    from workloads.bridgetower.data.synthetic import ensure_synthetic

    require("nvidia.dali")
    data = tmp_path / "odd"
    data.mkdir()
    rows = []
    for copy in range(2):
        for name, encoded in odd_images().items():
            file = f"{copy}-{name}"
            (data / file).write_bytes(encoded)
            rows.append({"file_name": file, "image_description": f"an odd image, {name.replace('-', ' ')}"})
    # plain fillers: the held-out split groups identical images (both copies of a picture go to one side), and
    # with them the odd images that trained include the GIF (checked below, before anything runs)
    filler = ensure_synthetic(samples=24, seed=5, root=tmp_path / "cache")
    for line in (filler / "metadata.jsonl").read_text().splitlines():
        row = json.loads(line)
        shutil.copy(filler / row["file_name"], data / f"filler-{row['file_name']}")
        rows.append({**row, "file_name": f"filler-{row['file_name']}"})
    (data / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trained, _, _ = held_out_split(open_source(str(data)), batch_size=8)
    assert any(trained.sample_key(i).endswith(".gif") for i in range(len(trained)))
    code = main(["run", "--dataset", str(data), "--loader", "cpu,cpu-fast,device,dali", "--workers", "0",
                 "--steps", "3", "--warmup-steps", "1", "--output", str(tmp_path / "out"), "--tracking-uri",
                 f"sqlite:///{tmp_path}/m.db", "--no-progress", "--system-metrics-interval", "0", "--report"])
    runs = {r["config"]["loader"]: r for r in runs_of(tmp_path / "out")}
    assert {loader: r["status"] for loader, r in runs.items()} == dict.fromkeys(
        ("cpu", "cpu-fast", "device", "dali"), "FINISHED"), {k: r.get("reason") for k, r in runs.items()}
    assert code == 0
    for run in runs.values():
        assert all(math.isfinite(x) for x in run["losses"])
    assert runs["device"]["metrics"]["device_decode_fallbacks"] == 0  # Pillow on the CPU device decodes them all
    dali = runs["dali"]
    assert dali["metrics"]["device_decode_fallbacks"] > 0
    fallbacks = dali["facts"]["workload"]["device_decode_fallbacks"]
    assert fallbacks["images"] == dali["metrics"]["device_decode_fallbacks"]
    assert any("GIF" in entry["reason"] and entry["first"] for entry in fallbacks["reasons"])
    assert "device_decode_fallbacks" not in runs["cpu"]["metrics"]  # no device decoder ran
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Images decoded on the host, not the device" in report and "loader=dali" in report.split(
        "Images decoded on the host")[1].split("\n")[0]

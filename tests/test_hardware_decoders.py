"""The on-device decoders run against the real libraries.

* DALI: the real ``nvidia-dali-cuda120`` wheel (tox env ``test`` installs it). Its CPU pipeline runs here
  (``device_id=None``, ``decoders.image(device="cpu")``), the same graph the GPU runs with ``device="mixed"``; the
  ``dali`` loader trains on the CPU device.
* Habana's media pipe: the real ``habana-media-loader`` wheel's Python code (MediaPipe, fn, schemas, graph, cal.py,
  legacy.py, reader nodes, the PyTorch iterator), with only its native layer replaced
  (:mod:`standins.habana_media_native`, which says what it models); a source check below fails if the wheel's use
  of that layer drifts from what the stand-in answers.
"""

from __future__ import annotations

import ast
import inspect
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from suite.cli import main
from suite.decoders.dali import dali_threads
from suite.errors import SuiteError

from conftest import cpu_adapter, require, runs_of

pytestmark = pytest.mark.mechanics
sys.path.insert(0, str(Path(__file__).parent))


def _jpegs(tmp_path, count=4):
    from workloads.bridgetower.data.synthetic import ensure_synthetic

    root = ensure_synthetic(samples=count, seed=3, root=tmp_path / "data")
    return [p.read_bytes() for p in sorted(root.glob("*.jpg"))]


# --- DALI ---------------------------------------------------------------------------------------

def test_dali_pixels_are_close_to_the_reference_transform_batch_after_batch(tmp_path, monkeypatch):
    """Defect 1: with DALI's default prefetch_queue_depth=2, the second run() of a feed-one-run-one pipeline fails
    ('Attempted to peek the data batch that doesn't exist'). Defect 2: the copy into torch is ordered on torch's
    stream (cuda_stream=...; None on the CPU device)."""
    require("nvidia.dali")
    import nvidia.dali.plugin.pytorch as dali_torch

    from suite.imaging import decode_to_rgb_tensor
    from workloads.bridgetower.preprocessing import CLIP_MEAN, CLIP_STD, preprocess_image

    assert "cuda_stream" in inspect.signature(dali_torch.feed_ndarray).parameters  # the real API takes it
    copies = []
    real_feed = dali_torch.feed_ndarray

    def feed(tensor, out, **kwargs):
        copies.append(kwargs)
        return real_feed(tensor, out, **kwargs)
    monkeypatch.setattr(dali_torch, "feed_ndarray", feed)
    jpegs = _jpegs(tmp_path, 6)
    decoder = cpu_adapter().decoders.for_loader("dali")
    for batch in (jpegs[:2], jpegs[2:4], jpegs[4:6]):  # three run()s of one pipeline
        out = decoder(batch, 64, CLIP_MEAN, CLIP_STD)
        reference = torch.stack([preprocess_image(decode_to_rgb_tensor(b), 64) for b in batch])
        assert out.shape == reference.shape == (2, 3, 64, 64) and out.dtype == torch.float32
        # DALI's resampling and JPEG decoder are its own: close, not equal. Measured on these drawings: mean
        # |difference| 0.04-0.06 in normalized units (the flat background identical), against 0.26 for the mirrored
        # reference and 0.7 for the other image of the batch.
        difference = (out - reference).abs().mean().item()
        assert difference < 0.1 and difference < (out - reference.flip(-1)).abs().mean().item() / 3, difference
    assert copies == [{"cuda_stream": None}] * 3
    decoder.close()


def test_the_cores_of_dali_threads_are_counted_apart_from_the_training_process(tmp_path):
    """Issue 31: a device decoder that burns host cores shows up (DALI's users ask for it, NVIDIA/DALI #5274): the
    real DALI pipeline decodes in its own threads ("[DALI]...") inside this process, and the contention meter of this
    process's measured window counts them as decoder threads, not as the training process's own cores."""
    require("nvidia.dali")
    from suite.meters.contention import DECODER_THREAD_PREFIXES, ContentionMeter
    from workloads.bridgetower.preprocessing import CLIP_MEAN, CLIP_STD

    jpegs = _jpegs(tmp_path, 8)
    decoder = cpu_adapter().decoders.for_loader("dali")
    decoder(jpegs[:4], 256, CLIP_MEAN, CLIP_STD)  # the pipeline and its threads exist before the window
    meter = ContentionMeter()
    meter.start()
    for _ in range(30):
        decoder(jpegs, 256, CLIP_MEAN, CLIP_STD)
    reading = meter.stop()
    names = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
    decoder.close()
    assert any(name.startswith(DECODER_THREAD_PREFIXES) for name in names), names  # the installed DALI's names
    metrics = reading.metrics()
    assert reading.decoder_threads_cpu_s > 0.02, reading  # DALI's threads decoded 240 images of 256 px
    assert metrics["host_cpu_cores_decoder_threads"] == pytest.approx(reading.decoder_threads_cpu_s / reading.window_s)
    assert metrics["host_cpu_cores_trainer"] == pytest.approx(
        (reading.trainer_cpu_s - reading.decoder_threads_cpu_s) / reading.window_s)


def test_the_dali_loader_trains_three_steps_on_the_cpu(tmp_path):
    require("nvidia.dali")
    code = main(["run", "--device", "cpu", "--loader", "dali", "--workers", "2", "--steps", "3",
                 "--warmup-steps", "1", "--output", str(tmp_path / "out"),
                 "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress", "--system-metrics-interval", "0"])
    assert code == 0
    runs = runs_of(tmp_path / "out")
    assert [r["status"] for r in runs] == ["FINISHED"]  # encoded bytes from 2 workers, decoded by DALI
    for run in runs:
        assert len(run["losses"]) == 4 and all(math.isfinite(x) for x in run["losses"])
        assert run["facts"]["loader_used"] == "dali"
        assert run["facts"]["decoder_used"] == f"dali ({dali_threads()} host threads)"
        assert run["metrics"]["host_cpu_cores_decoder_threads"] >= 0.0  # DALI's threads, counted apart


def test_dali_gets_every_core_of_the_configuration_but_one(monkeypatch):
    """Issue 47 (10): DALI's num_threads=2 starved its host-side decode on a 16-core box."""
    from suite.decoders.dali import DaliDecoder

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert dali_threads() == 15 and DaliDecoder(None).num_threads == 15
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert dali_threads() == 2


def test_a_dali_build_for_another_cuda_major_is_refused_with_the_wheel_to_install():
    """Defect 12: DALI's CUDA major must be torch's. The installed DALI says which it is built for."""
    dali = require("nvidia.dali")
    from suite.decoders.dali import DALI_WHEELS, check_cuda_match

    assert dali.__cuda_version__ // 1000 == 12  # nvidia-dali-cuda120: e.g. 12080 or 12986
    check_cuda_match(dali.__cuda_version__, "12.8")  # same major: fine
    with pytest.raises(SuiteError, match=r"DALI is built for CUDA 12 but torch for CUDA 13.0: install "
                                         r"nvidia-dali-cuda130 \(pip install 'suite-bench\[dali-cuda13\]'\)"):
        check_cuda_match(dali.__cuda_version__, "13.0")
    assert DALI_WHEELS == {12: "nvidia-dali-cuda120", 13: "nvidia-dali-cuda130"}
    check_cuda_match(dali.__cuda_version__, None)  # a CPU build of torch: DALI's CPU pipeline, nothing to match


def test_the_dali_extras_match_the_wheels_the_runtime_check_names():
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    from suite.decoders.dali import DALI_WHEELS

    for major, wheel in DALI_WHEELS.items():
        assert extras[f"dali-cuda{major}"] == [wheel]


# --- Habana media pipe: the real habana-media-loader Python code ----------------------------------

@pytest.fixture
def media_native(monkeypatch):
    require("habana_frameworks.mediapipe")
    from standins import habana_media_native

    return habana_media_native.install(monkeypatch)


def test_the_media_pipe_decodes_batch_after_batch_through_the_librarys_own_code(media_native, tmp_path):
    """Defect 3: the library's iterator starts the pipe only in __iter__ (pipe.iter_init() creates the executor
    run() needs). Defect 4: in-memory JPEGs reach the decoder as BUFFER_LIST (pointers and sizes, padded to 64 bytes),
    not as FILE_LIST (paths), whatever the legacy backend would make of numpy byte arrays."""
    from suite.decoders.habana_media import HabanaMediaDecoder

    jpegs = _jpegs(tmp_path, 4)
    device = cpu_adapter()
    decoder = HabanaMediaDecoder(device)
    first = decoder(jpegs[:2], 32, (0.5,) * 3, (0.25,) * 3)
    second = decoder(jpegs[2:], 32, (0.5,) * 3, (0.25,) * 3)
    assert tuple(first.shape) == tuple(second.shape) == (2, 3, 32, 32) and first.dtype == torch.float32
    manager, libmedia = media_native["manager"], media_native["libmedia"]
    assert manager.calls.count("compile") == 1  # built once, reused per batch
    assert manager.calls.count("getOutput") == 2
    sent = libmedia.batches
    assert len(sent) == 2
    for batch, fed in zip(sent, (jpegs[:2], jpegs[2:]), strict=True):
        for buffer, data in zip(batch, fed, strict=True):
            assert len(buffer) % 64 == 0 and buffer[:len(data)] == data and set(buffer[len(data):]) <= {0}
    # cal.py's decoder_init maps the reader's declared output type to the native input format
    assert repr(manager.decoder_input_format) == "<native mediaInputType.BUFFER_LIST>"


def test_without_iter_the_librarys_iterator_cannot_run(media_native):
    """What defect 3 was, shown on the library itself: next() before iter() finds no executor."""
    from habana_frameworks.mediapipe.plugins.iterator_pytorch import HPUGenericPytorchIterator

    from suite.decoders.habana_media import HabanaMediaDecoder

    decoder = HabanaMediaDecoder(cpu_adapter())
    pipe = decoder.make_pipe(batch_size=1, image_size=8, mean=(0.5,) * 3, std=(0.25,) * 3)
    iterator = HPUGenericPytorchIterator(mediapipe=pipe)
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'run'"):
        next(iterator)


def test_a_batch_of_another_size_builds_a_new_pipe_and_an_unfed_read_is_an_error(media_native, tmp_path):
    from suite.decoders.habana_media import HabanaMediaDecoder, encoded_batch_reader

    jpegs = _jpegs(tmp_path, 3)
    decoder = HabanaMediaDecoder(cpu_adapter())
    decoder(jpegs[:2], 16, (0.5,) * 3, (0.25,) * 3)
    out = decoder(jpegs[2:], 16, (0.5,) * 3, (0.25,) * 3)  # the last, smaller batch of an epoch
    assert tuple(out.shape) == (1, 3, 16, 16)
    assert media_native["manager"].calls.count("compile") == 2
    import queue
    import types

    reader = encoded_batch_reader(queue.Queue())({}, types.SimpleNamespace(batch_size=2))
    with pytest.raises(SuiteError, match="asked for a batch that was not fed"):
        next(reader)


def test_the_stand_in_answers_what_the_installed_wheel_asks_of_its_native_layer():
    """Drift check against the installed habana-media-loader's source: the pipe-manager methods whose answers the
    stand-in shapes are called by cal.py with the arity it implements, legacy.py calls libmedia's
    mediaPipelineRunHpu with 8 arguments, and the wheel imports no native module the stand-in does not know."""
    require("habana_frameworks.mediapipe")
    import habana_frameworks.mediapipe as package

    from standins.habana_media_native import NATIVE_MODULES, LibMedia, PipeManager

    root = Path(package.__file__).parent
    shaped = {name: len(inspect.signature(getattr(PipeManager, name)).parameters) - 1
              for name in ("createGenericNode", "createPlaceHolder", "createOutputPlaceHolder", "compile",
                           "getTensorInfo", "get_ptr", "getOutput")}
    seen: dict[str, set[int]] = {}
    imported: set[str] = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in shaped:
                if path.name == "cal.py" and ast.unparse(node.func.value) == "self._pm_":
                    seen.setdefault(node.func.attr, set()).add(len(node.args))
            if isinstance(node, ast.Import):
                imported.update(a.name for a in node.names if a.name.startswith("media_"))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("media_"):
                imported.add(node.module)
    assert seen == {name: {arity} for name, arity in shaped.items()}
    assert imported <= set(NATIVE_MODULES), imported - set(NATIVE_MODULES)
    legacy = ast.parse((root / "backend" / "legacy.py").read_text())
    [run] = [n for n in ast.walk(legacy) if isinstance(n, ast.Call) and ast.unparse(n.func) == "mediaPipelineRunHpu"]
    assert len(run.args) == len(inspect.signature(LibMedia.run_hpu).parameters) - 1


def test_without_the_libraries_the_decoders_say_what_to_install(monkeypatch, tmp_path):
    from suite.decoders.habana_media import HabanaMediaDecoder

    for name in ("nvidia.dali", "habana_frameworks.mediapipe"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    device = cpu_adapter()
    with pytest.raises(SuiteError, match=r"the dali loader needs NVIDIA DALI: pip install 'suite-bench\[dali\]'"):
        device.decoders.for_loader("dali")([b"\xff\xd8"], 8, (0.5,) * 3, (0.5,) * 3)
    with pytest.raises(SuiteError, match=r"the device loader on Gaudi2 needs habana-media-loader: pip install "
                                         r"'suite-bench\[gaudi\]'"):
        HabanaMediaDecoder(device)([b"\xff\xd8"], 8, (0.5,) * 3, (0.5,) * 3)

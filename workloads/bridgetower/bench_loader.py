"""``suite bench-loader``: the three image pipelines side by side, in one run, on the same images.

For each pipeline of :mod:`.data.pipelines` it measures

* images per second per worker: the worker stage alone, in a forked process on one thread (what one
  DataLoader worker can deliver);
* end to end: a DataLoader with ``num_workers`` workers over the same images, each batch finished by
  the device stage on the CPU device, as batches (and images) per second. Each pipeline's batches travel as its
  training loader moves them: torch's fresh shared memory per batch for the reference, as the published benchmark
  ran, the workers' reused shared buffers for ours (:mod:`.data.shared_batches`; how many batches reused one is
  reported under ``settings``);
* the closed pipeline's time per image over its JPEG decode's alone, both timed in pairs in one forked worker on
  one thread (``closed_per_image_vs_decode``).

Pipelines are measured in interleaved rounds (reference, closed, open, reference, ...) and each figure is the median
over rounds, so that a slow spell of a shared machine hits all of them alike; the ratios ``closed_vs_reference`` and
``open_vs_reference`` are of end-to-end throughput within this one run. Fidelity is checked on the same images: the
closed pipeline's largest deviation from the reference after normalization, and the open pipeline's PSNR.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

from suite.config import RunConfig
from suite.devices.base import prepare_device
from suite.devices.cpu import CPUAdapter
from suite.errors import ConfigError
from suite.meters.host_ram import kept_shared_with_forks

from workloads.bridgetower.data.catalog import open_source
from workloads.bridgetower.data.loader import LOADER_OF_PIPELINE
from workloads.bridgetower.data.pipelines import (
    PIPELINES,
    ImagePipeline,
    decode_rgb_hwc,
    jpeg_decoder_name,
    psnr_db,
)
from workloads.bridgetower.data.resample import resampler_name
from workloads.bridgetower.data.shared_batches import collation, of_loader
from workloads.bridgetower.preprocessing import CLIP_STD

#: The closed pipeline's output must equal the reference's within this, after normalization.
CLOSED_TOLERANCE = 1.0 / 255.0


@dataclass(frozen=True)
class LoaderBenchOptions:
    dataset: str | None = None
    images: int = 480
    image_size: int = 294  # the published (large) preset's
    batch_size: int = 48
    num_workers: int | None = None  # default: every core
    rounds: int = 3
    train_steps: int = 200  # the training comparison closed vs open (tiny preset); 0: none

    def __post_init__(self) -> None:
        for name, minimum in (("images", 1), ("image_size", 8), ("batch_size", 1), ("rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if self.num_workers is not None and (not isinstance(self.num_workers, int) or self.num_workers < 0):
            raise ConfigError(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        if isinstance(self.train_steps, bool) or not isinstance(self.train_steps, int) or self.train_steps < 0:
            raise ConfigError(f"train_steps must be an integer >= 0, got {self.train_steps!r}")
        if self.images < self.batch_size:
            raise ConfigError(f"images ({self.images}) must be at least one batch ({self.batch_size})")

    @property
    def workers(self) -> int:
        return (os.cpu_count() or 1) if self.num_workers is None else self.num_workers


class _WorkerStage(Dataset):
    def __init__(self, images: list[bytes], pipeline: ImagePipeline) -> None:
        self.images, self.pipeline = images, pipeline

    def worker_init(self, _worker_id: int) -> None:
        self.pipeline.worker_init()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"images": self.pipeline.worker_stage(self.images[index])}


def _read_images(options: LoaderBenchOptions) -> tuple[list[bytes], dict[str, Any]]:
    source = open_source(options.dataset)
    if len(source) < options.images:
        raise ConfigError(f"the dataset has {len(source)} images, fewer than --images {options.images}")
    return [source.read_bytes(i) for i in range(options.images)], source.describe()


def _single_thread(fn: Callable[[], Any]) -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def _in_measuring_worker(pipeline: ImagePipeline, measure: Callable[[ImagePipeline, list[bytes]], Any],
                         images: list[bytes]) -> Any:
    """``measure(pipeline, images)`` on one thread in a forked child process, as a DataLoader worker runs, so that
    a pipeline's ``worker_init`` (allocator settings) does not leak into the others."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(1, initializer=_init_measuring_worker, initargs=(pipeline,)) as pool:
        return pool.apply(_single_thread, (functools.partial(measure, pipeline, images),))


def _init_measuring_worker(pipeline: ImagePipeline) -> None:
    """A forked worker dies quietly when the pool ends it: it does not keep the SIGTERM handler of the CLI it was
    forked from (which raises to record a run as KILLED, and printed a traceback per worker on every exit)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pipeline.worker_init()


def _rate(pipeline: ImagePipeline, images: list[bytes]) -> float:
    """Images per second of the worker stage."""
    start = time.perf_counter()
    for data in images:
        pipeline.worker_stage(data)
    return len(images) / (time.perf_counter() - start)


def _paired_with_decode(closed: ImagePipeline, images: list[bytes]) -> tuple[float, float]:
    """Seconds per image of the closed worker stage and of its JPEG decode alone (libjpeg-turbo into an RGB array,
    nothing after: the floor ``closed_per_image_vs_decode`` compares with), measured in pairs: each image through
    both, in alternating order, so that a slow spell of a shared machine hits both sides of the ratio alike and
    neither side always finds the encoded image in cache."""
    seconds = {"closed": 0.0, "decode": 0.0}
    stages: dict[str, Callable[[bytes], Any]] = {"closed": closed.worker_stage, "decode": decode_rgb_hwc}
    for index, data in enumerate(images):
        for name in ("closed", "decode") if index % 2 else ("decode", "closed"):
            start = time.perf_counter()
            stages[name](data)
            seconds[name] += time.perf_counter() - start
    return seconds["closed"] / len(images), seconds["decode"] / len(images)


def _end_to_end_epoch(loader: DataLoader, pipeline: ImagePipeline) -> tuple[int, float]:
    """One pass over the images through the workers and the device stage: (batches, seconds)."""
    batches = 0
    shared = of_loader(loader)
    start = time.perf_counter()
    for batch in loader:
        pipeline.device_stage((shared.received(batch) if shared else batch)["images"], "cpu")
        batches += 1
    return batches, time.perf_counter() - start


def _fidelity(pipelines: dict[str, ImagePipeline], images: list[bytes]) -> dict[str, float]:
    outputs = {name: p.device_stage(torch.stack([p.worker_stage(d) for d in images]), "cpu")
               for name, p in pipelines.items()}
    reference = outputs["reference"]
    closed_error = float((outputs["closed"] - reference).abs().max())
    std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    return {
        "closed_max_abs_error": closed_error,
        "closed_max_error_8bit_levels": float(((outputs["closed"] - reference).abs() * std).max() * 255.0),
        "closed_within_tolerance": closed_error <= CLOSED_TOLERANCE,
        "closed_psnr_db": psnr_db(reference, outputs["closed"]),
        "open_psnr_db": psnr_db(reference, outputs["open"]),
        "open_max_error_8bit_levels": float(((outputs["open"] - reference).abs() * std).max() * 255.0),
    }


def run_loader_benchmark(options: LoaderBenchOptions, workload_class: type,
                         progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Measure every pipeline; returns the figures (see the module docstring) as a JSON-ready dict.
    ``workload_class`` (the BridgeTower workload) trains the training comparison."""
    images, dataset = _read_images(options)
    pipelines = {name: cls(options.image_size) for name, cls in PIPELINES.items()}
    progress("fidelity")
    result: dict[str, Any] = {"fidelity": _fidelity(pipelines, images[: min(len(images), 96)])}

    workers = options.workers
    loaders = {
        name: DataLoader(stage, batch_size=options.batch_size, num_workers=workers, drop_last=True,
                         collate_fn=collation(stage.pipeline.reuses_batch_memory, workers, None),  # as make_loader's
                         persistent_workers=workers > 0, worker_init_fn=stage.worker_init)
        for name, stage in ((name, _WorkerStage(images, p)) for name, p in pipelines.items())
    }
    sample = images[: min(len(images), 96)]  # what one worker thread is timed on
    per_worker: dict[str, list[float]] = {name: [] for name in pipelines}
    paired: list[tuple[float, float]] = []  # per round: seconds per image of (closed, decode alone)
    end_to_end: dict[str, list[float]] = {name: [] for name in pipelines}
    with kept_shared_with_forks():  # as in training: no full collection examines what is here now
        try:
            for name, loader in loaders.items():  # warm-up: start the workers, fill caches
                progress(f"warm-up {name}")
                _end_to_end_epoch(loader, pipelines[name])
            for round_index in range(options.rounds):
                for name, pipeline in pipelines.items():
                    progress(f"round {round_index + 1}/{options.rounds}: {name}")
                    per_worker[name].append(_in_measuring_worker(pipeline, _rate, sample))
                    batches, seconds = _end_to_end_epoch(loaders[name], pipeline)
                    end_to_end[name].append(batches / seconds)
                progress(f"round {round_index + 1}/{options.rounds}: closed and JPEG decode alone, in pairs")
                paired.append(_in_measuring_worker(pipelines["closed"], _paired_with_decode, sample))
        finally:
            for loader in loaders.values():
                iterator = getattr(loader, "_iterator", None)
                if iterator is not None:
                    iterator._shutdown_workers()

    result.update(_ratios(options, pipelines, per_worker, end_to_end, paired, result["fidelity"]))
    result["settings"] = {
        "images": len(images), "image_size": options.image_size, "batch_size": options.batch_size,
        "num_workers": workers, "rounds": options.rounds, "batches_per_epoch": len(images) // options.batch_size,
        "device_stage_on": "cpu", "closed_tolerance": CLOSED_TOLERANCE, "jpeg_decoder": jpeg_decoder_name(),
        "resampler": resampler_name(), "torch": torch.__version__, "logical_cores": os.cpu_count(),
        "dataset": dataset,
        "shared_batches": {name: shared.describe() for name, loader in loaders.items()
                           if (shared := of_loader(loader)) is not None},
    }
    if options.train_steps:
        result["training"] = training_comparison(workload_class, options.dataset, options.train_steps, progress)
    return result


def _ratios(options: LoaderBenchOptions, pipelines: dict[str, Any], per_worker: dict[str, list[float]],
            end_to_end: dict[str, list[float]], paired: list[tuple[float, float]], fidelity: dict[str, Any]
            ) -> dict[str, Any]:
    """Medians over the rounds per pipeline, and each pipeline over the reference (end to end, per worker); the
    closed one per image over the JPEG decode alone from their paired times, pooled over the rounds."""
    table: dict[str, dict[str, Any]] = {}
    for name, pipeline in pipelines.items():
        batches_per_s = statistics.median(end_to_end[name])
        table[name] = {
            "description": pipeline.description,
            "loader": LOADER_OF_PIPELINE.get(name),  # the loader that runs it (None: measured for comparison only)
            "images_per_s_per_worker": statistics.median(per_worker[name]),
            "end_to_end_batches_per_s": batches_per_s,
            "end_to_end_images_per_s": batches_per_s * options.batch_size,
            "end_to_end_batches_per_s_rounds": end_to_end[name],
        }
    reference = table["reference"]["end_to_end_batches_per_s"]
    closed_s, decode_s = (statistics.fmean(side) for side in zip(*paired))
    return dict(
        closed_vs_reference=table["closed"]["end_to_end_batches_per_s"] / reference,
        open_vs_reference=table["open"]["end_to_end_batches_per_s"] / reference,
        closed_vs_reference_per_worker=(table["closed"]["images_per_s_per_worker"]
                                        / table["reference"]["images_per_s_per_worker"]),
        open_vs_reference_per_worker=(table["open"]["images_per_s_per_worker"]
                                      / table["reference"]["images_per_s_per_worker"]),
        open_psnr_db=fidelity["open_psnr_db"],
        # per image on one worker thread: the closed pipeline's time over the JPEG decode's alone (1.0 = decoding
        # is all it does; the rest is resize, crop and normalization), measured in pairs
        closed_per_image_vs_decode=closed_s / decode_s,
        closed_per_image_vs_decode_rounds=[closed / decode for closed, decode in paired],
        decode_only_images_per_s_per_worker=1.0 / decode_s,
        closed_per_image_s=closed_s,
        decode_per_image_s=decode_s,
        pipelines=table,
    )


def training_comparison(workload_class: type, dataset: str | None, steps: int,
                        progress: Callable[[str], None]) -> dict[str, Any]:
    """Does the faster input pipeline still teach the model? The tiny preset trained ``steps`` steps with the
    closed pipeline and with the open one (same seed, same samples; each evaluated through its own pipeline on the
    held-out pairs): eval_accuracy reached, and the losses at the end."""

    config = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu-fast",
                       precision="fp32", batch_size=8, steps=steps, warmup_steps=0, dataset=dataset)
    figures: dict[str, Any] = {"preset": "tiny", "steps": steps, "seed": config.seed,
                               "metric": "eval_accuracy (mean retrieval recall@1 over the held-out pairs)"}
    for name in ("closed", "open"):
        progress(f"training comparison: {steps} steps with the {name} pipeline")
        adapter = CPUAdapter()
        adapter.setup()
        prepare_device(config, adapter)
        workload = workload_class(config, adapter, image_pipeline=name)
        workload.setup()
        batches = workload.batches()
        losses = [float(workload.train_step(next(batches))) for _ in range(steps)]
        figures[name] = {"eval_accuracy": workload.evaluate()["eval_accuracy"],
                         "final_loss_mean_last_10": statistics.fmean(losses[-10:])}
        workload.teardown()
    figures["open_vs_closed_eval_accuracy"] = figures["open"]["eval_accuracy"] - figures["closed"]["eval_accuracy"]
    return figures

"""What the BridgeTower workload reads and checks outside a run's training: the configured dataset opened with its
bounds, a preset described, the inputs checked once before a matrix, their fingerprints recomputed, and the first
samples through a loader beside the reference (the audit's pixel check)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from suite.config import RunConfig
from suite.devices.interfaces import seed_everything
from suite.errors import SuiteError

from workloads.bridgetower.data.bounds import ImageBounds
from workloads.bridgetower.data.catalog import (
    DEFAULT_BOUND_NOTE,
    held_out_split,
    open_evaluation_source,
    open_source,
)
from workloads.bridgetower.data.loader import CaptionedImages
from workloads.bridgetower.data.sources import ImageCaptionSource
from workloads.bridgetower.device_decoding import decode_on_device
from workloads.bridgetower.model import initial_model, weights_fingerprint
from workloads.bridgetower.preprocessing import preprocess_image
from workloads.bridgetower.presets import PRESETS
from workloads.bridgetower.tokenizer import resolve_tokenizer, stand_in_name, tokenizer_fingerprint

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter


def image_bounds(config: RunConfig) -> ImageBounds:
    """The image bounds a configuration asks for (--max-image-pixels, --max-image-bytes; defaults otherwise), every
    stage of the preset's preprocessing included (its output size)."""
    return ImageBounds.of(config.max_image_pixels, config.max_image_bytes, PRESETS[config.preset].image_size)


def open_configured(config: RunConfig) -> ImageCaptionSource:
    """The configuration's dataset, opened with its bounds and options."""
    return open_source(config.dataset, config.skip_bad_samples, bounds=image_bounds(config),
                       allow_outside_links=config.allow_outside_links, max_caption_bytes=config.max_caption_bytes)

def split_configured(config: RunConfig, source: ImageCaptionSource, batch: int
                     ) -> tuple[ImageCaptionSource, ImageCaptionSource, str]:
    """(training samples, evaluated samples, what the split is) of the configuration's dataset: the synthetic set's
    separate evaluation set, or a held-out share; refused with one line where a quality target needs held-out
    samples the dataset cannot spare (see :func:`~workloads.bridgetower.data.catalog.held_out_split`)."""
    return held_out_split(source, batch, limit=config.eval_samples,
                          evaluation=open_evaluation_source(config.dataset, image_bounds(config)),
                          need_held_out=config.target_quality is not None)


def describe_preset(name: str) -> dict[str, Any]:
    """Parameters (counted on a model built on torch's meta device: no memory, no weights), image size, batch
    size, sequence length, what it is for and what it fetches."""
    from transformers import BridgeTowerConfig, BridgeTowerForContrastiveLearning

    preset = PRESETS[name]
    with torch.device("meta"):
        model = BridgeTowerForContrastiveLearning(BridgeTowerConfig(**preset.model_config))
    return {"parameters": sum(p.numel() for p in model.parameters()), "image_size": preset.image_size,
            "batch_size": preset.batch_size, "max_seq_length": preset.max_seq_length,
            "purpose": preset.purpose, "fetches": preset.needs_network()}

def prepare(config: RunConfig) -> dict[str, Any]:
    """Open and check the dataset once in the parent, before any configuration (generating the synthetic set
    if needed): every metadata line, every file's place and kind; with --skip-bad-samples, every image. Says
    once when a preset's tokenizer will be the local stand-in."""
    source = open_configured(config)
    if len(source) < config.batch:
        raise SuiteError(
            f"the dataset has {len(source)} usable samples, fewer than one batch of {config.batch_size}")
    if config.weights and not Path(config.weights).exists() and config.weights.startswith((".", "/", "~")):
        raise SuiteError(f"weights path does not exist: {config.weights}")
    # a target without held-out: refused; a held-out set past the default bound: said up front
    split = split_configured(config, source, config.batch * config.nproc_per_node)[2]
    described = source.describe()
    warnings = list(described.get("warnings", []))
    if DEFAULT_BOUND_NOTE in split:
        warnings.append(f"evaluation: {split}")
    preset = PRESETS[config.preset]
    tokenizer = config.weights or preset.tokenizer  # loaded by each run (a checkpoint's: nothing fetched here)
    if not config.weights and config.tokenizer == "auto":  # what the runs will use; reads local files only
        _, tokenizer = resolve_tokenizer(preset.tokenizer, preset.vocab_size, None, "auto")
    if tokenizer == stand_in_name(preset.vocab_size):
        warnings.append(f"tokenizer: {preset.tokenizer}'s is not on this machine, so a local stand-in with its "
                        f"vocabulary size ({preset.vocab_size}), length and padding runs (same compute; recorded "
                        "as tokenizer=local-stand-in); --tokenizer hub insists on the real one")
    return {"dataset": described, "tokenizer": tokenizer, "warnings": warnings}

def input_fingerprints(config: RunConfig) -> dict[str, Any]:
    """The dataset's fingerprint from its files, the tokenizer's, and the initial weights' hash of the model built
    from the seed (every RNG seeded as a run seeds it before building the model), without training."""

    preset = PRESETS[config.preset]
    dataset = open_configured(config).fingerprint()
    tokenizer, _ = resolve_tokenizer(preset.tokenizer, preset.vocab_size, config.weights, config.tokenizer)
    seed_everything(config.seed)
    weights = weights_fingerprint(initial_model(preset, config.weights))
    return {"dataset_fingerprint": dataset, "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
            "initial_weights_sha256": weights}

def loader_pixels(config: RunConfig, device: DeviceAdapter, count: int) -> dict[str, Any]:
    """The first ``count`` samples through ``config.loader``'s own code (worker stage and device stage, or the
    device's decoder with its host fallback) on ``device``, beside the reference preprocessing of the same
    files (Pillow, resize, crop, normalize: the published method)."""
    from suite.imaging import decode_to_rgb_tensor

    from workloads.bridgetower.data.loader import collate

    source = open_configured(config)
    size, n = PRESETS[config.preset].image_size, min(count, len(source))
    ids = torch.zeros((len(source), 1), dtype=torch.long)
    dataset = CaptionedImages(source, ids, ids, config.loader, size, device.torch_device.type, image_bounds(config))
    batch = collate([dataset[i] for i in range(n)])
    if "images" in batch:
        pixels = dataset.finish_on_device(batch["images"], device.torch_device)
    else:
        pixels, _, _ = decode_on_device(device, batch["encoded_images"], batch["image_names"], size, config.loader,
                                        batch["image_kinds"])
    to_device = device.training().to_device
    reference = torch.stack([preprocess_image(to_device(decode_to_rgb_tensor(source.read_bytes(i))), size)
                             for i in range(n)])
    return {"pixels": pixels.float(), "reference": reference.float(), "images": [source.name_of(i)
                                                                                 for i in range(n)]}

"""The BridgeTower contrastive fine-tuning workload (``BridgeTowerForContrastiveLearning``).

As the reference script: captions tokenized up front (``max_length`` padding, truncation), the text
pooler removed (frozen), ``return_loss=True`` (mean of the text-image, text-cross and image-cross
cross-entropies over the local batch), AdamW with a linear schedule, gradient clipping at 1.0, bf16
autocast when that precision is requested.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping

import torch

from suite.config import RunConfig
from suite.errors import DatasetError, SuiteError
from suite.workload import Workload

from workloads.bridgetower.data.bounds import DecodeBudget, ImageBounds
from workloads.bridgetower.data.catalog import held_out_split, open_source
from workloads.bridgetower.data.loader import LOADER_OF_PIPELINE, CaptionedImages, endless, make_loader
from workloads.bridgetower.data.sources import ImageCaptionSource
from workloads.bridgetower.evaluation import embed_pairs, retrieval_recall
from workloads.bridgetower.preprocessing import CLIP_MEAN, CLIP_STD, preprocess_image
from workloads.bridgetower.presets import PRESETS, PUBLISHED_RECIPE, BridgeTowerPreset
from workloads.bridgetower.tokenizer import resolve_tokenizer, stand_in_name, tokenize_captions, tokenizer_fingerprint


def decode_on_device(device: Any, encoded: list[bytes], names: list[str] | None, image_size: int,
                     loader: str, kinds: list[str] | None = None) -> tuple[torch.Tensor, Any, dict[int, str]]:
    """A batch of encoded images decoded on the device by the decoder that serves ``loader`` there
    (:mod:`suite.decoders`), then, unless the decoder preprocesses itself, the reference preprocessing on the device.
    Images the decoder refuses by their header (``kinds``, :meth:`suite.imaging.ImageKind.spelled`, read by the loader
    workers) or fails on are decoded on the host and preprocessed the reference way (:mod:`suite.decoders.fallback`).
    Returns (pixel values, the decoder, {image index: why it was decoded on the host}). A failure is a
    :class:`DatasetError` naming the image (when the decoder says which) or the batch's images."""
    from suite.decoders.base import DecodeError
    from suite.decoders.fallback import decode_with_fallback
    from suite.imaging import ImageKind

    decoder = device.decoder_for(loader)
    headers = [ImageKind.parse(k) for k in kinds] if kinds else [ImageKind.of(data) for data in encoded]
    try:
        done = decode_with_fallback(decoder, encoded, headers, image_size, CLIP_MEAN, CLIP_STD,
                                    lambda image: preprocess_image(device.to_device(image), image_size))
        return torch.stack(done.pixels), decoder, done.fallbacks
    except SuiteError:
        raise
    except Exception as exc:  # a decoder's error, re-raised naming what it was decoding
        names = list(names or [])
        culprit = exc.image_index if isinstance(exc, DecodeError) else None
        if culprit is not None and culprit < len(names):
            what = f"image {names[culprit]}"
        else:
            what = "the batch of " + (", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                                      if names else f"{len(encoded)} images")
        raise DatasetError(f"cannot decode {what} on the device with {decoder.name}: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:300]}") from exc


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def image_bounds(config: RunConfig) -> ImageBounds:
    """The image bounds a configuration asks for (--max-image-pixels, --max-image-bytes; defaults otherwise), every
    stage of the preset's preprocessing included (its output size)."""
    return ImageBounds.of(config.max_image_pixels, config.max_image_bytes, PRESETS[config.preset].image_size)


def build_model(preset: BridgeTowerPreset, weights: str | None) -> Any:
    """Pretrained weights from ``weights`` (local path or hub id) if given, else random init of the preset."""
    from transformers import BridgeTowerConfig, BridgeTowerForContrastiveLearning

    if weights:
        try:
            return BridgeTowerForContrastiveLearning.from_pretrained(weights)
        except Exception as exc:  # re-raised with context
            raise SuiteError(f"cannot load weights {weights!r}: {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:300]}") from exc
    return BridgeTowerForContrastiveLearning(BridgeTowerConfig(**preset.model_config))


def initial_model(preset: BridgeTowerPreset, weights: str | None) -> Any:
    """The model a run starts from (after seeding): :func:`build_model` with the text pooler removed, as the reference
    freezes it (unused by the loss)."""
    model = build_model(preset, weights)
    model.bridgetower.text_model.pooler = None
    return model


def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes), in state-dict order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


class DecodeFallbacks:
    """Training images the device's decoder left to the host: a count, and per reason its count and first names."""

    SHOWN = 5

    def __init__(self) -> None:
        self.count = 0
        self.by_reason: dict[str, dict[str, Any]] = {}

    def note(self, name: str, reason: str) -> None:
        self.count += 1
        entry = self.by_reason.setdefault(reason, {"reason": reason, "images": 0, "first": []})
        entry["images"] += 1
        if len(entry["first"]) < self.SHOWN and name not in entry["first"]:
            entry["first"].append(name)

    def describe(self) -> dict[str, Any]:
        return {"images": self.count, "how": "decoded on the host with Pillow, preprocessed the reference way",
                "reasons": list(self.by_reason.values())}


class BridgeTowerWorkload(Workload):
    name: ClassVar[str] = "bridgetower"
    presets: ClassVar[Mapping[str, BridgeTowerPreset]] = PRESETS
    default_preset: ClassVar[str] = "tiny"

    @staticmethod
    def _open(config: RunConfig) -> ImageCaptionSource:
        return open_source(config.dataset, config.skip_bad_samples, bounds=image_bounds(config),
                           allow_outside_links=config.allow_outside_links, max_caption_bytes=config.max_caption_bytes)

    @classmethod
    def describe_preset(cls, name: str) -> dict[str, Any]:
        """Parameters (counted on a model built on torch's meta device: no memory, no weights), image size, batch
        size, sequence length, what it is for and what it fetches."""
        from transformers import BridgeTowerConfig, BridgeTowerForContrastiveLearning

        preset = PRESETS[name]
        with torch.device("meta"):
            model = BridgeTowerForContrastiveLearning(BridgeTowerConfig(**preset.model_config))
        return {"parameters": sum(p.numel() for p in model.parameters()), "image_size": preset.image_size,
                "batch_size": preset.batch_size, "max_seq_length": preset.max_seq_length,
                "purpose": preset.purpose, "fetches": preset.needs_network()}

    @classmethod
    def prepare(cls, config: RunConfig) -> dict[str, Any]:
        """Open and check the dataset once in the parent, before any configuration (generating the synthetic set
        if needed): every metadata line, every file's place and kind; with --skip-bad-samples, every image. Says
        once when a preset's tokenizer will be the local stand-in."""
        source = cls._open(config)
        if len(source) < config.batch_size:
            raise SuiteError(
                f"the dataset has {len(source)} usable samples, fewer than one batch of {config.batch_size}")
        if config.weights and not Path(config.weights).exists() and config.weights.startswith((".", "/", "~")):
            raise SuiteError(f"weights path does not exist: {config.weights}")
        described = source.describe()
        warnings = list(described.get("warnings", []))
        preset = PRESETS[config.preset]
        tokenizer = config.weights or preset.tokenizer  # loaded by each run (a checkpoint's: nothing fetched here)
        if not config.weights and config.tokenizer == "auto":  # what the runs will use; reads local files only
            _, tokenizer = resolve_tokenizer(preset.tokenizer, preset.vocab_size, None, "auto")
        if tokenizer == stand_in_name(preset.vocab_size):
            warnings.append(f"tokenizer: {preset.tokenizer}'s is not on this machine, so a local stand-in with its "
                            f"vocabulary size ({preset.vocab_size}), length and padding runs (same compute; recorded "
                            "as tokenizer=local-stand-in); --tokenizer hub insists on the real one")
        return {"dataset": described, "tokenizer": tokenizer, "warnings": warnings}

    @classmethod
    def input_fingerprints(cls, config: RunConfig) -> dict[str, str]:
        """The dataset's fingerprint from its files, the tokenizer's, and the initial weights' hash of the model built
        from the seed (every RNG seeded as a run seeds it before building the model), without training."""
        from suite.devices.base import seed_everything

        preset = PRESETS[config.preset]
        dataset = cls._open(config).fingerprint()
        tokenizer, _ = resolve_tokenizer(preset.tokenizer, preset.vocab_size, config.weights, config.tokenizer)
        seed_everything(config.seed)
        weights = weights_fingerprint(initial_model(preset, config.weights))
        return {"dataset_fingerprint": dataset, "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
                "initial_weights_sha256": weights}

    @classmethod
    def loader_pixels(cls, config: RunConfig, device: Any, count: int) -> dict[str, Any]:
        """The first ``count`` samples through ``config.loader``'s own code (worker stage and device stage, or the
        device's decoder with its host fallback) on ``device``, beside the reference preprocessing of the same
        files (Pillow, resize, crop, normalize: the published method)."""
        from suite.imaging import decode_to_rgb_tensor

        from workloads.bridgetower.data.loader import collate

        source = cls._open(config)
        size, n = PRESETS[config.preset].image_size, min(count, len(source))
        ids = torch.zeros((len(source), 1), dtype=torch.long)
        dataset = CaptionedImages(source, ids, ids, config.loader, size, device.torch_device.type, image_bounds(config))
        batch = collate([dataset[i] for i in range(n)])
        if "images" in batch:
            pixels = dataset.pipeline.device_stage(batch["images"], device.torch_device)
        else:
            pixels, _, _ = decode_on_device(device, batch["encoded_images"], batch["image_names"], size, config.loader,
                                            batch["image_kinds"])
        reference = torch.stack([preprocess_image(device.to_device(decode_to_rgb_tensor(source.read_bytes(i))), size)
                                 for i in range(n)])
        return {"pixels": pixels.float(), "reference": reference.float(), "images": [source.name_of(i)
                                                                                     for i in range(n)]}

    @classmethod
    def recipe_deviations(cls, config: RunConfig) -> list[str]:
        """Differences from the published recipe (:data:`workloads.bridgetower.presets.PUBLISHED_RECIPE`); the
        dataloader worker count and the loader are what the benchmark varies, not part of the recipe."""
        deviations = []
        for name, expected in PUBLISHED_RECIPE.items():
            value = config.batch_size if name == "batch_size" else getattr(config, name)
            if value != expected:
                deviations.append(f"{name} {value!r} (the recipe's: {expected!r})")
        return deviations

    @classmethod
    def loader_benchmark(cls, options: Mapping[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
        from workloads.bridgetower.bench_loader import LoaderBenchOptions, run_loader_benchmark

        return run_loader_benchmark(LoaderBenchOptions(**options), cls, progress)

    def __init__(self, config: RunConfig, device: Any, image_pipeline: str | None = None) -> None:
        """``image_pipeline`` replaces the worker-side pipeline of the configured loader by another of
        :data:`workloads.bridgetower.data.pipelines.PIPELINES` (``suite bench-loader``'s training comparison only:
        a run's records always hold the pipeline of its loader)."""
        super().__init__(config, device)
        self.preset = PRESETS[config.preset]
        self._image_pipeline = image_pipeline
        self._facts: dict[str, Any] = {}
        self._loader: Any = None
        self._ran_loader: Any = None  # the DataLoader that fed the steps (the trainer's own with hf-trainer)
        self._observed_loader: str | None = None  # which loader's path produced the batches
        self._decoder: str | None = None  # the on-device decoder that ran (loaders device, dali)
        self._fallbacks = DecodeFallbacks()  # training images the device decoder left to the host
        self._skipped = 0

    @classmethod
    def preload(cls) -> None:
        import transformers  # noqa: F401 - the model's code, the tokenizer's and the trainer's are what take long
        from transformers import (  # noqa: F401
            BridgeTowerConfig,
            BridgeTowerForContrastiveLearning,
            PreTrainedTokenizerFast,
        )

    def setup(self) -> None:
        preset, config, clock = self.preset, self.config, self.setup_clock
        with clock.phase("dataset"):
            everything: ImageCaptionSource = self._open(config)
        with clock.phase("fingerprint"):
            dataset_fingerprint = everything.fingerprint()
        self._skipped = everything.describe().get("skipped_samples", 0)
        source, held_out, split = held_out_split(everything, config.batch_size * _world_size())
        with clock.phase("tokenization"):
            tokenizer, tokenizer_source = resolve_tokenizer(preset.tokenizer, preset.vocab_size, config.weights,
                                                            config.tokenizer)
            tokenizer_sha = tokenizer_fingerprint(tokenizer)
            encoded, cached = tokenize_captions(tokenizer, source.captions(), preset.max_seq_length, tokenizer_sha)
            encoded_held_out, _ = tokenize_captions(tokenizer, held_out.captions(), preset.max_seq_length,
                                                    tokenizer_sha)
        self._facts["tokenized_captions"] = "from the cache" if cached else "tokenized (then cached)"
        file_cache = getattr(everything, "fingerprint_cache", None) or getattr(
            getattr(everything, "source", None), "fingerprint_cache", None)
        if file_cache:
            self._facts["fingerprint_file_digests"] = dict(file_cache)

        with clock.phase("model"):
            self.device.prepare_framework()
            model = initial_model(preset, config.weights)
            vocab_size = model.config.text_config.vocab_size
            if len(tokenizer) > vocab_size:
                raise SuiteError(f"tokenizer has {len(tokenizer)} tokens but the model's vocabulary has {vocab_size}")
            self._facts.update(
                parameters=sum(p.numel() for p in model.parameters()),
                trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad),
                initial_weights_sha256=weights_fingerprint(model),
                weights=config.weights or "random-init",
            )
            model.train()
            self.model = self.device.place_model(model)
            params = [p for p in self.model.parameters() if p.requires_grad]
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                device = self.device.torch_device
                self.model = torch.nn.parallel.DistributedDataParallel(
                    self.model, device_ids=[device.index] if device.type == "cuda" else None)
            self.params = params
            self.ops = self.device.training_ops()
            self.optimizer, optimizer_description = self.ops.make_optimizer(
                params, lr=preset.learning_rate, eps=preset.adam_epsilon, weight_decay=preset.weight_decay)
            total_steps = config.total_steps
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: max(0.0, (total_steps - step) / total_steps)  # linear, no warm-up
            )
        self.image_size = int(model.config.vision_config.image_size)  # `model`: unwrapped by DDP
        bounds = image_bounds(config)
        budget = DecodeBudget.of(config.loader_memory_gib, config.num_workers)
        dataset = CaptionedImages(source, encoded["input_ids"], encoded["attention_mask"], config.loader,
                                  self.image_size, self.device.torch_device.type, bounds, self._image_pipeline,
                                  budget)
        self.train_dataset = dataset
        self.eval_dataset = CaptionedImages(held_out, encoded_held_out["input_ids"], encoded_held_out["attention_mask"],
                                            config.loader, self.image_size, self.device.torch_device.type, bounds,
                                            self._image_pipeline, budget)
        self._loader = make_loader(dataset, config.batch_size, config.num_workers, config.seed,
                                   pin_memory=self.device.torch_device.type == "cuda",
                                   prefetch_factor=config.prefetch_factor,
                                   loader_timeout_s=config.effective_loader_timeout_s())
        self._facts.update(
            dataset=everything.describe(),
            dataset_fingerprint=dataset_fingerprint,
            eval_split=split,
            train_samples=len(source),
            eval_samples=len(held_out),
            quality_metric="eval_accuracy: mean of text-to-image and image-to-text retrieval recall@1 over the "
                           "held-out pairs (ties count against the model)",
            tokenizer=tokenizer_source,
            tokenizer_sha256=tokenizer_sha,
            max_seq_length=preset.max_seq_length,
            image_size=self.image_size,
            image_preprocessing="resize-shorter-bicubic-antialias+center-crop+clip-normalize (torch ops)",
            image_pipeline=(dataset.pipeline.name if dataset.pipeline else
                            f"decoder {self.device.decoders.get(config.loader, '?')}"),
            image_pipeline_description=(dataset.pipeline.description if dataset.pipeline else
                                        "encoded bytes from the workers, decoded on the device by "
                                        f"{self.device.decoders.get(config.loader, 'no decoder')}"),
            image_bounds=bounds.describe() | budget.describe(),
            loader_timeout_s=config.effective_loader_timeout_s() if config.num_workers > 0 else None,
            image_mean=list(CLIP_MEAN),
            image_std=list(CLIP_STD),
            optimizer=optimizer_description,
            lr_schedule=f"linear decay to 0 over {total_steps} steps",
            max_grad_norm=preset.max_grad_norm,
            text_pooler="removed",
        )

    def batches(self) -> Iterator[Any]:
        return endless(self._loader)

    def count_samples(self, batch: Any) -> int:
        return int(batch["input_ids"].shape[0])

    def _pixel_values(self, batch: Any) -> torch.Tensor:
        if "images" in batch:  # a worker-side pipeline ran; its device stage finishes the batch
            self.note_worker_pipeline_ran()
            return self.train_dataset.pipeline.device_stage(batch["images"], self.device.torch_device)
        names = batch.get("image_names")
        done, decoder, fallbacks = decode_on_device(self.device, batch["encoded_images"], names, self.image_size,
                                                    self.config.loader, batch.get("image_kinds"))
        self._observed_loader = decoder.loader  # the decoder object that made these pixels
        self._decoder = decoder.name
        for index, reason in fallbacks.items():
            self._fallbacks.note(names[index] if names and index < len(names) else f"image {index}", reason)
        return done

    def train_step(self, batch: Any) -> torch.Tensor:
        pixel_values = self._pixel_values(batch)
        input_ids = self.device.to_device(batch["input_ids"])
        attention_mask = self.device.to_device(batch["attention_mask"])
        with self.device.autocast(self.config.precision):
            outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                                 return_loss=True)
        outputs.loss.backward()
        self.ops.clip_grad_norm(self.params, self.preset.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return outputs.loss.detach()

    def evaluate(self) -> dict[str, float]:
        """Retrieval recall@1/@5 both ways over the held-out pairs, on the device, in the run's precision (see
        :mod:`workloads.bridgetower.evaluation`); ``eval_accuracy`` and ``eval_samples`` among the figures."""
        from torch.utils.data import DataLoader

        from workloads.bridgetower.data.loader import collate

        model = self.model.module if isinstance(self.model, torch.nn.parallel.DistributedDataParallel) else self.model
        # its own generator: torch draws each iterator's base seed from the global RNG otherwise, which would move
        # the dropout of the training steps after an evaluation
        batches = DataLoader(self.eval_dataset, batch_size=self.config.batch_size, shuffle=False, num_workers=0,
                             collate_fn=collate, generator=torch.Generator())
        observed, fallbacks = self._observed_loader, self._fallbacks  # what evaluation reads is not what trained
        self._fallbacks = DecodeFallbacks()
        texts, images = embed_pairs(model, batches, self._pixel_values, self.device.to_device,
                                    lambda: self.device.autocast(self.config.precision))
        self._observed_loader, self._fallbacks = observed, fallbacks
        return {**retrieval_recall(texts, images), "eval_samples": float(len(self.eval_dataset))}

    def train_with_trainer(self, hooks: Any) -> dict[str, float]:
        from workloads.bridgetower.trainer_engine import run_with_trainer

        return run_with_trainer(self, hooks)

    def record_trainer_facts(self, trainer: str, optimizer: str) -> None:
        """What the hf-trainer engine ran: the trainer class and the optimizer it built."""
        self._facts.update(trainer=trainer, optimizer=f"{optimizer} (built by the trainer)",
                           lr_schedule="the trainer's linear schedule, no warm-up",
                           data_order="the trainer's own sampler (seeded), not the suite's")

    def observed_loader(self) -> dict[str, Any]:
        loader = self._ran_loader or self._loader
        observed: dict[str, Any] = {}
        if self._observed_loader is not None:
            observed["loader"] = self._observed_loader
        if self._decoder is not None:
            observed["decoder"] = self._decoder
        if loader is not None:
            observed["num_workers"] = loader.num_workers
            observed["prefetch_factor"] = loader.prefetch_factor if loader.num_workers > 0 else None
        return observed

    def note_worker_pipeline_ran(self) -> None:
        """A batch made by the dataset's worker-side pipeline reached a step: the loader is that pipeline's."""
        pipeline = self.train_dataset.pipeline
        self._observed_loader = LOADER_OF_PIPELINE.get(pipeline.name, f"pipeline {pipeline.name}") \
            if pipeline is not None else None

    def record_trainer_loader(self, loader: Any) -> None:
        """Engine hf-trainer: the DataLoader the trainer built and fed its steps from."""
        self._ran_loader = loader

    def metrics(self) -> dict[str, float]:
        figures = {"skipped_samples": float(self._skipped)} if self.config.skip_bad_samples else {}
        if self.config.loader in self.device.decoders:  # an on-device decoder ran: how many images it left to the host
            figures["device_decode_fallbacks"] = float(self._fallbacks.count)
            if self._fallbacks.count:
                self._facts["device_decode_fallbacks"] = self._fallbacks.describe()
        return figures

    def mlperf_hyperparameters(self) -> dict[str, Any]:
        preset = self.preset
        return {
            "train_samples": len(self._loader.dataset),
            "eval_samples": len(self.eval_dataset),
            "opt_name": "adamw",
            "opt_base_learning_rate": preset.learning_rate,
            "opt_adamw_epsilon": preset.adam_epsilon,
            "opt_adamw_weight_decay": preset.weight_decay,
            "opt_gradient_clip_norm": preset.max_grad_norm,
            "opt_learning_rate_warmup_steps": 0,
            "max_sequence_length": preset.max_seq_length,
        }

    def facts(self) -> dict[str, Any]:
        return dict(self._facts)

    def teardown(self) -> None:
        loader, self._loader = self._loader, None
        if loader is not None and getattr(loader, "_iterator", None) is not None:
            loader._iterator._shutdown_workers()  # persistent workers: stop them now, not at exit

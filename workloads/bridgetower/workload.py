"""The BridgeTower contrastive fine-tuning workload (``BridgeTowerForContrastiveLearning``).

As the reference script: captions tokenized up front (``max_length`` padding, truncation), the text
pooler removed (frozen), ``return_loss=True`` (mean of the text-image, text-cross and image-cross
cross-entropies over the local batch), AdamW with a linear schedule, gradient clipping at 1.0, bf16
autocast when that precision is requested.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterator, Mapping

import torch

from suite.config import RunConfig
from suite.figures import DEVICE_DECODE_FALLBACKS, EVAL_SAMPLES, SKIPPED_SAMPLES, Figure
from suite.workload import Workload

from workloads.bridgetower import eval_inputs, inputs
from workloads.bridgetower.data.bounds import DecodeBudget, ImageBounds
from workloads.bridgetower.data.loader import LOADER_OF_PIPELINE, CaptionedImages, endless, make_loader
from workloads.bridgetower.data.shared_batches import of_loader
from workloads.bridgetower.data.sources import ImageCaptionSource
from workloads.bridgetower.device_decoding import DecodeFallbacks, decode_on_device
from workloads.bridgetower.evaluation import QUALITY_FIGURES, embed_pairs, retrieval_recall
from workloads.bridgetower.model import build_for_training
from workloads.bridgetower.preprocessing import CLIP_MEAN, CLIP_STD
from workloads.bridgetower.presets import PRESETS, PUBLISHED_METHOD, PUBLISHED_RECIPE, BridgeTowerPreset
from workloads.bridgetower.tokenizer import resolve_tokenizer, tokenize_captions, tokenizer_fingerprint


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class BridgeTowerWorkload(Workload):
    name: ClassVar[str] = "bridgetower"
    presets: ClassVar[Mapping[str, BridgeTowerPreset]] = PRESETS
    default_preset: ClassVar[str] = "tiny"
    figures: ClassVar[tuple[Figure, ...]] = QUALITY_FIGURES
    datasets: ClassVar[str] = ("'synthetic' (default: New-Yorker-like cartoons generated locally; 'synthetic:N' for N "
                               "of them), 'newyorker' (the published dataset from the hub, pinned revision) or an "
                               "imagefolder path (images + metadata.jsonl)")
    published_reference: ClassVar[str | None] = "bridgetower_hf_blog_2023"
    quality_reference: ClassVar[str | None] = "tiny_quality_reference"

    @classmethod
    def describe_preset(cls, name: str) -> dict[str, Any]:
        return inputs.describe_preset(name)

    @classmethod
    def prepare(cls, config: RunConfig) -> dict[str, Any]:
        return inputs.prepare(config)

    @classmethod
    def input_fingerprints(cls, config: RunConfig) -> dict[str, Any]:
        return inputs.input_fingerprints(config)

    @classmethod
    def loader_pixels(cls, config: RunConfig, device: Any, count: int) -> dict[str, Any]:
        return inputs.loader_pixels(config, device, count)

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
    def method_deviations(cls, config: RunConfig, run_params: Mapping[str, str]) -> list[str]:
        """Where the run measured otherwise than the published benchmark
        (:data:`workloads.bridgetower.presets.PUBLISHED_METHOD`), for each setting the run records."""
        return [f"{name} {run_params[name]} (the published method: {expected}, {meaning})"
                for name, (expected, meaning) in PUBLISHED_METHOD.items()
                if name in run_params and run_params[name] != expected]

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
        self._eval_images: Any = None  # the held-out images preprocessed before the run (eval_inputs)
        self._precision_ran: str | None = None  # read in the model's first forward pass (either engine)
        self._precision_hooks: list[Any] = []

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
            everything: ImageCaptionSource = inputs.open_configured(config)
        with clock.phase("fingerprint"):
            dataset_fingerprint = everything.fingerprint()
        self._skipped = everything.describe().get(SKIPPED_SAMPLES, 0)
        source, held_out, split = inputs.split_configured(config, everything, config.batch * _world_size())
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
            built = build_for_training(self.device, preset, config, len(tokenizer))
        model, self.model, self.params, self.ops = built.model, built.placed, built.params, built.ops
        self.optimizer, self.scheduler, optimizer_description = built.optimizer, built.scheduler, built.optimizer_text
        self._facts.update(built.facts)
        # on every submodule, not the model: a trainer may enter autocast inside the model's forward (accelerate wraps
        # forward itself), after the model's own pre-hooks ran; the first submodule to run sees what its layers see
        self._precision_hooks = [module.register_forward_pre_hook(self._observe_precision)
                                 for module in list(model.modules())[1:]]
        total_steps = config.total_steps
        self.image_size = int(model.config.vision_config.image_size)  # `model`: unwrapped by DDP
        bounds, budget = self._make_loaders(source, held_out, encoded, encoded_held_out)
        with clock.phase("eval_inputs"):
            self._eval_images, self._facts["eval_images"] = eval_inputs.prepare(self.eval_dataset,
                                                                                self.device.torch_device.type)
        dataset = self.train_dataset
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
                            f"decoder {self.device.traits.decoders.get(config.loader, '?')}"),
            image_pipeline_description=(dataset.pipeline.description if dataset.pipeline else
                                        "encoded bytes from the workers, decoded on the device by "
                                        f"{self.device.traits.decoders.get(config.loader, 'no decoder')}"),
            image_bounds=bounds.describe() | budget.describe(),
            loader_timeout_s=config.effective_loader_timeout_s() if config.num_workers > 0 else None,
            image_mean=list(CLIP_MEAN),
            image_std=list(CLIP_STD),
            optimizer=optimizer_description,
            lr_schedule=f"linear decay to 0 over {total_steps} steps",
            max_grad_norm=preset.max_grad_norm,
            text_pooler="removed",
        )

    def _make_loaders(self, source: ImageCaptionSource, held_out: ImageCaptionSource, encoded: Any,
                      encoded_held_out: Any) -> tuple[ImageBounds, DecodeBudget]:
        """The training and held-out datasets through the configured loader, and the training DataLoader; returns
        the image bounds and the workers' decode budget they hold to."""
        config = self.config
        bounds = inputs.image_bounds(config)
        budget = DecodeBudget.of(config.loader_memory_gib, config.num_workers)
        device_type = self.device.torch_device.type
        self.train_dataset = CaptionedImages(source, encoded["input_ids"], encoded["attention_mask"], config.loader,
                                             self.image_size, device_type, bounds, self._image_pipeline, budget)
        self.eval_dataset = CaptionedImages(held_out, encoded_held_out["input_ids"], encoded_held_out["attention_mask"],
                                            config.loader, self.image_size, device_type, bounds,
                                            self._image_pipeline, budget)
        self._loader = make_loader(self.train_dataset, config.batch, config.num_workers, config.seed,
                                   pin_memory=device_type == "cuda", prefetch_factor=config.prefetch_factor,
                                   loader_timeout_s=config.effective_loader_timeout_s())
        return bounds, budget

    def batches(self) -> Iterator[Any]:
        return endless(self._loader)

    def count_samples(self, batch: Any) -> int:
        return int(batch["input_ids"].shape[0])

    def _pixel_values(self, batch: Any) -> torch.Tensor:
        if "images" in batch:  # a worker-side pipeline ran; its device stage finishes the batch
            self.note_worker_pipeline_ran()
            return self.train_dataset.finish_on_device(batch["images"], self.device.torch_device)
        names = batch.get("image_names")
        done, decoder, fallbacks = decode_on_device(self.device, batch["encoded_images"], names, self.image_size,
                                                    self.config.loader, batch.get("image_kinds"))
        self._observed_loader = decoder.loader  # the decoder object that made these pixels
        self._decoder = decoder.ran()
        for index, reason in fallbacks.items():
            self._fallbacks.note(names[index] if names and index < len(names) else f"image {index}", reason)
        return done

    def train_step(self, batch: Any) -> torch.Tensor:
        pixel_values = self._pixel_values(batch)
        input_ids = self.device.training().to_device(batch["input_ids"])
        attention_mask = self.device.training().to_device(batch["attention_mask"])
        with self.device.numerics().autocast(self.config.precision):
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
        :mod:`workloads.bridgetower.evaluation`), their images preprocessed before the run where the loader has a
        worker-side pipeline (:mod:`~workloads.bridgetower.eval_inputs`); ``eval_accuracy`` and ``eval_samples``."""
        from torch.utils.data import DataLoader

        from workloads.bridgetower.data.loader import collate

        model = self.model.module if isinstance(self.model, torch.nn.parallel.DistributedDataParallel) else self.model
        # its own generator: torch draws each iterator's base seed from the global RNG otherwise, which would move
        # the dropout of the training steps after an evaluation
        batches = (eval_inputs.batches(self.eval_dataset, self._eval_images, self.config.batch)
                   if self._eval_images is not None else
                   DataLoader(self.eval_dataset, batch_size=self.config.batch_size, shuffle=False, num_workers=0,
                              collate_fn=collate, generator=torch.Generator()))
        observed, fallbacks = self._observed_loader, self._fallbacks  # what evaluation reads is not what trained
        self._fallbacks = DecodeFallbacks()
        texts, images = embed_pairs(model, batches, self._pixel_values, self.device.training().to_device,
                                    lambda: self.device.numerics().autocast(self.config.precision))
        self._observed_loader, self._fallbacks = observed, fallbacks
        return {**retrieval_recall(texts, images), EVAL_SAMPLES: float(len(self.eval_dataset))}

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
        figures = {SKIPPED_SAMPLES: float(self._skipped)} if self.config.skip_bad_samples else {}
        if self.config.loader in self.device.traits.decoders:  # an on-device decoder ran: images it left to the host
            figures[DEVICE_DECODE_FALLBACKS] = float(self._fallbacks.count)
            if self._fallbacks.count:
                self._facts[DEVICE_DECODE_FALLBACKS] = self._fallbacks.describe()
        return figures

    def mlperf_hyperparameters(self) -> dict[str, Any]:
        preset = self.preset
        return {
            "train_samples": len(self._loader.dataset),
            EVAL_SAMPLES: len(self.eval_dataset),
            "opt_name": "adamw",
            "opt_base_learning_rate": preset.learning_rate,
            "opt_adamw_epsilon": preset.adam_epsilon,
            "opt_adamw_weight_decay": preset.weight_decay,
            "opt_gradient_clip_norm": preset.max_grad_norm,
            "opt_learning_rate_warmup_steps": 0,
            "opt_learning_rate_decay_schedule": "linear to 0",
            "opt_learning_rate_decay_steps": self.config.total_steps,
            **dict(zip(("opt_adamw_beta_1", "opt_adamw_beta_2"), self.optimizer.param_groups[0].get("betas", ()),
                       strict=False)),  # as the optimizer runs (torch's and Habana's fused AdamW: 0.9, 0.999)
            "max_sequence_length": preset.max_seq_length,
        }

    def _observe_precision(self, module: Any, args: Any) -> None:
        """Forward pre-hook, once: the precision in force as the model's layers run (the suite's loop or the
        trainer's)."""
        self._precision_ran = self.device.numerics().precision_in_force(self.params)
        hooks, self._precision_hooks = self._precision_hooks, []
        for hook in hooks:
            hook.remove()

    def precision_ran(self) -> str | None:
        return self._precision_ran

    def facts(self) -> dict[str, Any]:  # with how the batches crossed from the workers, where they reused memory
        return {**self._facts, **({"batch_transfer": ring.describe()} if (ring := of_loader(self._loader)) else {})}

    def teardown(self) -> None:
        if self._eval_images is not None:
            self._eval_images.close()
        loader, self._loader = self._loader, None
        if loader is not None and getattr(loader, "_iterator", None) is not None:
            loader._iterator._shutdown_workers()  # persistent workers: stop them now, not at exit

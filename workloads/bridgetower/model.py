"""The BridgeTower model a run trains: built from its preset (random init) or loaded from weights, with the
fingerprint of its initial weights."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from suite.config import RunConfig
from suite.errors import SuiteError

from workloads.bridgetower.presets import BridgeTowerPreset

if TYPE_CHECKING:
    from suite.devices.base import DeviceAdapter


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


@dataclass
class TrainingModel:
    """The model a run trains, placed on its device, with its optimizer and learning-rate schedule."""

    model: Any  # as built (its config read by the workload)
    placed: Any  # on the device, wrapped in DDP when several processes train
    params: list[Any]
    ops: Any  # the device's training ops (optimizer, clipping)
    optimizer: Any
    scheduler: Any
    optimizer_text: str
    facts: dict[str, Any]


def build_for_training(device: DeviceAdapter, preset: BridgeTowerPreset, config: RunConfig, tokens: int
                       ) -> TrainingModel:
    """The initial model for ``config`` on ``device``, AdamW (the device's) and a linear decay to 0 over the run's
    total steps; refuses a tokenizer with more tokens than the model's vocabulary."""
    device.training().prepare_framework()
    model = initial_model(preset, config.weights)
    vocab_size = model.config.text_config.vocab_size
    if tokens > vocab_size:
        raise SuiteError(f"tokenizer has {tokens} tokens but the model's vocabulary has {vocab_size}")
    facts = {"parameters": sum(p.numel() for p in model.parameters()),
             "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
             "initial_weights_sha256": weights_fingerprint(model), "weights": config.weights or "random-init"}
    model.train()
    placed = device.training().place_model(model)
    params = [p for p in placed.parameters() if p.requires_grad]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch_device = device.torch_device
        placed = torch.nn.parallel.DistributedDataParallel(
            placed, device_ids=[torch_device.index] if torch_device.type == "cuda" else None)
    ops = device.training()
    optimizer, description = ops.make_optimizer(params, lr=preset.learning_rate, eps=preset.adam_epsilon,
                                                weight_decay=preset.weight_decay)
    total_steps = config.total_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: max(0.0, (total_steps - step) / total_steps))  # linear, no warm-up
    return TrainingModel(model, placed, params, ops, optimizer, scheduler, description, facts)

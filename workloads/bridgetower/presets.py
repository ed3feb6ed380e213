"""BridgeTower presets: ``tiny`` (random init, runs anywhere) and ``large`` (the published recipe)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from suite.workload import Preset

LARGE_CHECKPOINT = "BridgeTower/bridgetower-large-itm-mlm-itc"


@dataclass(frozen=True)
class BridgeTowerPreset(Preset):
    #: Keyword arguments of ``BridgeTowerConfig`` (random init when no weights are given).
    model_config: dict[str, Any] = field(default_factory=dict)
    max_seq_length: int = 128
    #: ``"local-byte-level"`` (built in code) or a checkpoint whose tokenizer to load.
    tokenizer: str = "local-byte-level"
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    adam_epsilon: float = 1e-8  # torch/Trainer default; the reference's Gaudi runs used fused AdamW eps 1e-6
    max_grad_norm: float = 1.0  # transformers Trainer default, which the reference ran with


TINY = BridgeTowerPreset(
    name="tiny",
    batch_size=8,
    description="random-init BridgeTower (hidden 64, 2+2+2 layers, image 64): a CPU-sized stand-in",
    learning_rate=1e-3,  # learns the synthetic set's captions within a few hundred steps (reference/tiny_quality)
    model_config=dict(
        text_config=dict(vocab_size=261, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=80),
        vision_config=dict(hidden_size=64, num_hidden_layers=2, patch_size=16, image_size=64),
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, contrastive_hidden_size=32,
        logit_scale_init_value=2.6592, share_cross_modal_transformer_layers=True,
    ),
    max_seq_length=64,
    tokenizer="local-byte-level",
)

LARGE = BridgeTowerPreset(
    name="large",
    batch_size=48,  # per device, as in the blog's text (its printed command says 40: a known inconsistency)
    description=f"the published recipe: {LARGE_CHECKPOINT} shape (866M parameters, image 294, patch 14)",
    model_config=dict(
        text_config=dict(vocab_size=50265, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096, max_position_embeddings=514),
        vision_config=dict(hidden_size=1024, num_hidden_layers=24, patch_size=14, image_size=294),
        hidden_size=1024, num_hidden_layers=6, num_attention_heads=16, contrastive_hidden_size=512,
        logit_scale_init_value=2.6592, share_cross_modal_transformer_layers=True,
    ),
    max_seq_length=128,
    tokenizer=LARGE_CHECKPOINT,
)

PRESETS: dict[str, BridgeTowerPreset] = {p.name: p for p in (TINY, LARGE)}

#: The published recipe's fields (reference/large_recipe.json, checked in the tests): a configuration with all of
#: these follows it exactly (MLPerf division closed); 8 devices, bf16, the pretrained checkpoint on the New Yorker set.
PUBLISHED_RECIPE: dict[str, object] = {"preset": "large", "precision": "bf16", "batch_size": 48, "seed": 42,
                                        "warmup_steps": 3, "dataset": "newyorker", "weights": LARGE_CHECKPOINT,
                                        "nproc_per_node": 8}

"""The BridgeTower workload: presets, pretrained-weights loading, and the training step."""


import pytest
import torch
from transformers import BridgeTowerConfig, BridgeTowerForContrastiveLearning

from suite.config import RunConfig
from workloads.bridgetower.presets import LARGE, PRESETS, TINY
from workloads.bridgetower.tokenizer import build_byte_level_tokenizer
from workloads.bridgetower.workload import BridgeTowerWorkload
from workloads.bridgetower.model import weights_fingerprint

from conftest import run_configuration_process


def test_presets_fix_batch_size_and_shapes():
    assert BridgeTowerWorkload.default_preset == "tiny" and set(PRESETS) == {"tiny", "small", "large"}
    assert TINY.batch_size == 8 and LARGE.batch_size == 48
    vision = LARGE.model_config["vision_config"]
    assert (vision["image_size"], vision["patch_size"]) == (294, 14)


def test_large_preset_has_the_published_866m_parameters():
    with torch.device("meta"):
        model = BridgeTowerForContrastiveLearning(BridgeTowerConfig(**LARGE.model_config))
    params = sum(p.numel() for p in model.parameters())
    assert abs(params - 866e6) / 866e6 < 0.005


def test_weights_fingerprint_changes_with_any_parameter():
    torch.manual_seed(0)
    model = BridgeTowerForContrastiveLearning(BridgeTowerConfig(**TINY.model_config))
    before = weights_fingerprint(model)
    assert weights_fingerprint(model) == before
    with torch.no_grad():
        model.logit_scale += 1e-3  # a 0-dim parameter
    assert weights_fingerprint(model) != before


def test_large_recipe_runs_from_a_local_checkpoint(tmp_path):
    """The pretrained path: `--preset large --weights DIR` loads model and tokenizer from a folder.

    The folder holds a tiny random model (so it runs here) saved with save_pretrained, exactly what
    from_pretrained reads for the real checkpoint.
    """
    checkpoint = tmp_path / "checkpoint"
    model_config = {**TINY.model_config, "text_config": {**TINY.model_config["text_config"],
                                                         "max_position_embeddings": LARGE.max_seq_length + 2}}
    torch.manual_seed(0)
    BridgeTowerForContrastiveLearning(BridgeTowerConfig(**model_config)).save_pretrained(checkpoint)
    build_byte_level_tokenizer().save_pretrained(checkpoint)
    config = RunConfig(workload="bridgetower", preset="large", device="cpu", num_workers=0, loader="cpu",
                       precision="bf16", steps=1, warmup_steps=0, batch_size=LARGE.batch_size,
                       weights=str(checkpoint))
    result = run_configuration_process(tmp_path, config)
    assert result["status"] == "FINISHED", result["reason"]
    facts = result["facts"]["workload"]
    assert facts["weights"] == str(checkpoint) and facts["tokenizer"] == str(checkpoint)
    assert facts["max_seq_length"] == 128 and result["facts"]["batch_size_used"] == 48
    assert result["facts"]["precision_used"] == "bf16"


def test_missing_checkpoint_is_a_clear_failure(tmp_path):
    from suite.errors import SuiteError

    config = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu",
                       precision="fp32", batch_size=8, weights="./no-such-checkpoint")
    with pytest.raises(SuiteError, match="weights path does not exist: ./no-such-checkpoint"):
        BridgeTowerWorkload.prepare(config)


def test_the_precision_recorded_is_read_from_torch_while_the_model_runs():
    """Issue 48 (2): `precision_used` was the request copied. It is read in the model's forward pass: what autocast
    and the parameters say there, whatever was asked."""
    from suite.devices.cpu import CPUAdapter

    adapter = CPUAdapter()
    adapter.setup()
    numerics = adapter.numerics()
    linear = torch.nn.Linear(2, 2)
    assert numerics.precision_in_force(linear.parameters()) == "fp32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert numerics.precision_in_force(linear.parameters()) == "bf16"
    with torch.autocast("cpu", dtype=torch.float16):
        assert numerics.precision_in_force(linear.parameters()) == "autocast float16"
    assert numerics.precision_in_force(linear.to(torch.bfloat16).parameters()) == "parameters bfloat16"


def test_a_bf16_request_whose_autocast_never_engages_is_recorded_as_fp32(tmp_path, monkeypatch):
    """A device whose autocast silently does nothing (the context entered, no lower precision) ran fp32: the record
    says fp32 beside the bf16 request, which the manifest keeps as `requested`."""
    import contextlib

    from suite.config import RunConfig
    from suite.devices.interfaces import Numerics

    config = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu",
                       precision="bf16", steps=1, warmup_steps=0, batch_size=TINY.batch_size)
    from suite.devices.cpu import CPUAdapter

    adapter = CPUAdapter()
    adapter.setup()
    workload = BridgeTowerWorkload(config, adapter)
    workload.setup()
    try:
        workload.train_step(next(workload.batches()))
        assert workload.precision_ran() == "bf16"  # the real autocast, observed
    finally:
        workload.teardown()
    monkeypatch.setattr(Numerics, "autocast", lambda self, precision: contextlib.nullcontext())
    workload = BridgeTowerWorkload(config, adapter)
    workload.setup()
    try:
        workload.train_step(next(workload.batches()))
        assert workload.precision_ran() == "fp32"
    finally:
        workload.teardown()
        adapter.teardown()

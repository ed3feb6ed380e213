"""Presets that run where users are: the published shape offline, the CPU preset at the published image size,
synthetic sets of any size, and `suite list` saying what each preset is."""

from __future__ import annotations

import json

import pytest
import torch

from suite.cli import main
from suite.config import RunConfig
from suite.errors import ConfigError, DatasetError, SuiteError
from workloads.bridgetower.presets import LARGE, LARGE_CHECKPOINT, PRESETS, SMALL
from workloads.bridgetower.tokenizer import resolve_tokenizer, stand_in_name, tokenizer_fingerprint

from conftest import run_file, runs_of

#: RoBERTa's special-token ids (its vocab.json: <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> 50264), which BridgeTower's
#: checkpoint tokenizer uses: the stand-in keeps them, so padding and attention masks are the real ones.
ROBERTA_SPECIAL_IDS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 50264}


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """An empty hub cache and HF_HUB_OFFLINE=1: an air-gapped machine."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    # huggingface_hub reads these at import: set its constants too, or a lookup waits on the network's timeouts
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


def test_the_large_preset_offline_tokenizes_like_the_checkpoint_would(offline_hub):
    tokenizer, what = resolve_tokenizer(LARGE.tokenizer, LARGE.vocab_size, None, "auto")
    assert what == stand_in_name(50265) == "local-stand-in (vocab 50265)"
    assert len(tokenizer) == LARGE.vocab_size == 50265  # the model's embedding size: every id fits
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in ROBERTA_SPECIAL_IDS} == ROBERTA_SPECIAL_IDS
    captions = ["a man and a dog on tinted paper", "x" * 1000]
    encoded = tokenizer(captions, max_length=LARGE.max_seq_length, padding="max_length", truncation=True,
                        return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert ids.shape == mask.shape == (2, 128)  # the published text length: the same compute as the real one
    assert ids[0, 0] == 0 and ids[1, -1] == 2 and int(ids.max()) < 50265
    assert bool((ids[0][mask[0] == 0] == 1).all()) and int(mask[1].sum()) == 128  # padded with <pad>; truncated
    again, _ = resolve_tokenizer(LARGE.tokenizer, LARGE.vocab_size, None, "auto")
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tokenizer)  # deterministic, on every machine


def test_hub_mode_and_weights_insist_on_the_real_tokenizer(offline_hub, tmp_path):
    with pytest.raises(SuiteError, match=f"cannot load the tokenizer of '{LARGE_CHECKPOINT}'"):
        resolve_tokenizer(LARGE.tokenizer, LARGE.vocab_size, None, "hub")
    with pytest.raises(SuiteError, match="cannot load the tokenizer of"):
        resolve_tokenizer(LARGE.tokenizer, LARGE.vocab_size, str(tmp_path / "no-checkpoint"), "auto")
    with pytest.raises(ConfigError, match="tokenizer must be one of auto, hub"):
        RunConfig.from_dict({"workload": "bridgetower", "preset": "large", "device": "cpu", "num_workers": 0,
                             "loader": "cpu", "precision": "fp32", "tokenizer": "maybe"})


def test_the_large_preset_is_the_published_shape_and_says_the_stand_in_once(offline_hub):
    from workloads.bridgetower.workload import BridgeTowerWorkload

    facts = BridgeTowerWorkload.describe_preset("large")
    assert round(facts["parameters"] / 1e6, 1) == 866.6  # the blog's "866M parameters"
    assert (facts["image_size"], facts["batch_size"], facts["max_seq_length"]) == (294, 48, 128)
    config = RunConfig.from_dict({"workload": "bridgetower", "preset": "large", "device": "cpu", "num_workers": 0,
                                  "loader": "cpu", "precision": "fp32", "batch_size": 1})
    prepared = BridgeTowerWorkload.prepare(config)
    assert prepared["tokenizer"] == "local-stand-in (vocab 50265)"
    [warning] = [w for w in prepared["warnings"] if w.startswith("tokenizer:")]
    assert "--tokenizer hub insists on the real one" in warning


def test_the_small_preset_keeps_the_published_image_pipeline_and_trains_on_a_synthetic_set_of_any_size(tmp_path):
    assert (SMALL.image_size, SMALL.model_config["vision_config"]["patch_size"]) == (294, 14)
    assert (LARGE.image_size, LARGE.model_config["vision_config"]["patch_size"]) == (294, 14)
    code = main(["run", "--preset", "small", "--dataset", "synthetic:24", "--workers", "0", "--steps", "3",
                 "--warmup-steps", "1", "--output", str(tmp_path / "out"), "--tracking-uri",
                 f"sqlite:///{tmp_path}/m.db", "--no-progress", "--system-metrics-interval", "0"])
    assert code == 0
    [run] = runs_of(tmp_path / "out")
    assert run["status"] == "FINISHED" and all(torch.isfinite(torch.tensor(run["losses"])))
    workload = run["facts"]["workload"]
    assert workload["image_size"] == 294 and workload["tokenizer"] == "local-byte-level"
    assert workload["image_preprocessing"].startswith("resize-shorter-bicubic-antialias+center-crop")
    dataset = json.loads(run_file(tmp_path / "out", run, "manifest.json").read_text())["dataset"]
    assert dataset["num_samples"] == 24 and dataset["generation"]["samples"] == 24  # how the set was made, recorded
    assert dataset["generation"]["generation_s"] > 0


@pytest.mark.mechanics
def test_synthetic_sets_of_any_size_are_made_once_and_bad_sizes_are_one_line_errors(tmp_path, monkeypatch):
    from workloads.bridgetower.data.catalog import open_source

    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path))
    source = open_source("synthetic:10")
    assert len(source) == 10 and source.root.name.endswith("-n10-s0")
    generation = source.describe()["generation"]
    assert generation["samples"] == 10 and generation["generator_version"] >= 2
    mtime = (source.root / "metadata.jsonl").stat().st_mtime_ns
    assert (open_source("synthetic:10").root / "metadata.jsonl").stat().st_mtime_ns == mtime  # cached, not remade
    assert open_source("synthetic:10").fingerprint() == source.fingerprint()
    for spec in ("synthetic:0", "synthetic:-3", "synthetic:many", "synthetic:", "synthetic:99999999"):
        with pytest.raises(DatasetError, match=r"synthetic:N needs a whole number of images from 1 to 979,200"):
            open_source(spec)


@pytest.mark.mechanics
def test_suite_list_says_what_each_preset_is(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "bridgetower/large: the published recipe" in out and "866.6M parameters, image 294, batch 48" in out
    assert "bridgetower/small:" in out and "image 294, batch 8" in out
    assert "fetches: nothing (random init, local tokenizer)" in out
    assert "--tokenizer hub or --weights fetch from the hub" in out
    assert set(PRESETS) == {"tiny", "small", "large"}

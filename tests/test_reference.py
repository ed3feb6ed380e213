"""The reference data parses, carries provenance, and matches the `large` preset it describes."""

import pytest
import json
from pathlib import Path

from suite.config import RunConfig
from workloads.bridgetower.presets import LARGE, LARGE_CHECKPOINT

pytestmark = pytest.mark.mechanics  # nothing here depends on the transformers line

REFERENCE = Path(__file__).resolve().parents[1] / "reference"


def test_published_table_is_complete_with_provenance():
    data = json.loads((REFERENCE / "bridgetower_hf_blog_2023.json").read_text())
    assert data["source"]["url"] and data["source"]["published"] and data["metric"]["unit"] == "samples/s"
    cells = {(r["device"], r["loader"], r["dataloader_num_workers"]) for r in data["results"]}
    for device in ("gaudi2", "h100", "a100"):
        assert {(device, "cpu", n) for n in (0, 1, 2)} <= cells
    assert ("gaudi2", "device", 2) in cells
    assert all(r["throughput_samples_per_s"] > 0 for r in data["results"])
    assert {f["id"] for f in data["known_flaws"]} >= {"batch-size-text-vs-command", "unequal-warmup-accounting"}


def test_large_recipe_matches_the_large_preset():
    recipe = json.loads((REFERENCE / "large_recipe.json").read_text())
    config = RunConfig.from_dict({**recipe["config"], "device": "cpu"})
    assert config.batch_size == LARGE.batch_size == 48
    assert config.weights == LARGE_CHECKPOINT
    vision, text = LARGE.model_config["vision_config"], LARGE.model_config["text_config"]
    model = recipe["model"]
    assert (vision["image_size"], vision["patch_size"]) == (model["image_size"], model["patch_size"])
    assert (text["num_hidden_layers"], vision["num_hidden_layers"]) == (model["text_layers"], model["vision_layers"])
    assert LARGE.model_config["num_hidden_layers"] == model["cross_modal_layers"]
    assert LARGE.max_seq_length == model["max_seq_length"]
    assert LARGE.learning_rate == recipe["optimizer"]["learning_rate"]
    assert LARGE.max_grad_norm == recipe["optimizer"]["max_grad_norm"]


def test_the_closed_division_recipe_is_the_published_one():
    """PUBLISHED_RECIPE (what a closed-division run must match) against the recipe file and the published table."""
    from workloads.bridgetower.presets import PUBLISHED_RECIPE

    recipe = json.loads((REFERENCE / "large_recipe.json").read_text())["config"]
    published = json.loads((REFERENCE / "bridgetower_hf_blog_2023.json").read_text())
    for name in ("preset", "precision", "batch_size", "seed", "warmup_steps", "dataset", "weights"):
        assert PUBLISHED_RECIPE[name] == recipe[name], name
    assert PUBLISHED_RECIPE["nproc_per_node"] == published["workload"]["devices"] == 8
    assert PUBLISHED_RECIPE["precision"] == published["suite_config"]["precision"]

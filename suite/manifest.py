"""The run manifest: everything an auditor needs to know what ran and to run it again.

Written beside each configuration's result (``runs/<config id>/manifest.json``, also an MLflow
artifact). ``config`` alone is enough to re-run the configuration (:func:`config_from_manifest`);
the rest pins down the environment so an audit can tell what drifted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from suite.config import RunConfig
from suite.environment import git_state, host_facts, package_versions
from suite.errors import SuiteError
from suite.fileio import write_json_atomic
from suite.results import RunResult

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1


def build_manifest(result: RunResult, command: Sequence[str]) -> dict[str, Any]:
    config = result.config
    facts = result.facts
    workload = facts.get("workload", {})
    seed = config["seed"]
    return {
        "manifest_version": MANIFEST_VERSION,
        "config": config,
        "repeat": result.repeat,
        "seeds": {
            "seed": seed,
            "random.seed": seed,
            "numpy.random.seed": seed,
            "torch.manual_seed": seed,
            "data_order": f"torch.Generator seeded with {seed} (sampler)",
            "loader_workers": "torch per-worker seed (from the sampler generator) + worker id; "
                              "random and numpy re-seeded from it",
        },
        "batch_size": {"configured": config.get("batch_size"), "used": facts.get("batch_size_used")},
        "warmup_steps_excluded": facts.get("warmup_steps_excluded"),
        "loader": {"requested": config.get("loader"), "ran": facts.get("loader_used")},
        "precision": {"requested": config.get("precision"), "ran": facts.get("precision_used")},
        "packages": package_versions(),
        "host": host_facts(),
        "device": facts.get("device", {}),
        "git": git_state(),
        "command": list(command),
        "dataset": workload.get("dataset"),
        "dataset_fingerprint": workload.get("dataset_fingerprint"),
        "initial_weights_sha256": workload.get("initial_weights_sha256"),
        "tokenizer_sha256": workload.get("tokenizer_sha256"),
    }


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> Path:
    path = Path(run_dir) / MANIFEST_FILE
    write_json_atomic(path, manifest)
    return path


def load_manifest(path: str | Path) -> dict[str, Any]:
    try:
        manifest = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SuiteError(f"cannot read manifest {path}: {exc}") from exc
    version = manifest.get("manifest_version")
    if version != MANIFEST_VERSION:
        raise SuiteError(f"manifest {path} has version {version!r}; this suite reads version {MANIFEST_VERSION}")
    return manifest


def config_from_manifest(manifest: dict[str, Any]) -> RunConfig:
    """The configuration to re-run, exactly as recorded (batch size included)."""
    return RunConfig.from_dict(manifest["config"])

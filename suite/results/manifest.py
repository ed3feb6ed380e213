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
from suite.errors import ConfigError, ResultsFolderError
from suite.fileio import loads_bounded, read_record_text
from suite.results.environment import git_state, host_facts, package_versions
from suite.results.record import RunResult

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 2  # 2: loader, num_workers and prefetch_factor as requested and as run


#: ``stage`` of a manifest written before the run (config, seeds, environment: enough to re-run it) and of the
#: complete one written at its end (with the run's facts: device, fingerprints, what ran).
BEFORE_THE_RUN, COMPLETE = "before the run", "complete"


def build_manifest(result: RunResult, command: Sequence[str], stage: str = COMPLETE) -> dict[str, Any]:
    """The manifest of ``result``'s run. Written twice by the configuration process: before the run (``stage``
    :data:`BEFORE_THE_RUN`: whatever happens to the disk later, the audit can re-run it) and complete at its end; a
    rescue file carries the complete one (built by the runner from the result it holds)."""
    config = result.config
    facts = result.facts
    workload = facts.get("workload", {})
    seed = config.seed
    return {
        "manifest_version": MANIFEST_VERSION,
        "stage": stage,
        "config": config.to_dict(),
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
        "batch_size": {"configured": config.batch_size, "used": facts.get("batch_size_used")},
        "warmup_steps_excluded": facts.get("warmup_steps_excluded"),
        "loader": {"requested": config.loader, "ran": facts.get("loader_used")},
        "num_workers": {"requested": config.num_workers, "ran": facts.get("num_workers_used")},
        "prefetch_factor": {"requested": config.prefetch_factor, "ran": facts.get("prefetch_factor_used")},
        "precision": {"requested": config.precision, "ran": facts.get("precision_used")},
        "packages": package_versions(),
        "host": host_facts(),
        "device": facts.get("device", {}),
        "accelerator_environment": facts.get("accelerator_environment", {}),
        "git": git_state(),
        "command": list(command),
        "dataset": workload.get("dataset"),
        "dataset_fingerprint": workload.get("dataset_fingerprint"),
        "initial_weights_sha256": workload.get("initial_weights_sha256"),
        "tokenizer_sha256": workload.get("tokenizer_sha256"),
    }


def load_manifest(path: str | Path) -> dict[str, Any]:
    """A manifest, checked to be one this suite wrote (a JSON object of the current version with a valid
    config); :class:`ResultsFolderError` names the file and what is wrong."""
    try:
        manifest = loads_bounded(read_record_text(path), f"manifest {path}")
    except FileNotFoundError:
        raise ResultsFolderError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFolderError(f"cannot read manifest {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ResultsFolderError(f"manifest {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # over the memory bound, or nested too deeply
        raise ResultsFolderError(str(exc)) from None
    if not isinstance(manifest, dict):
        raise ResultsFolderError(f"manifest {path} is not a JSON object but a {type(manifest).__name__}")
    version = manifest.get("manifest_version")
    if version != MANIFEST_VERSION:
        raise ResultsFolderError(f"manifest {path} has version {version!r}; this suite reads version "
                                 f"{MANIFEST_VERSION}")
    try:
        config_from_manifest(manifest)
    except ConfigError as exc:
        raise ResultsFolderError(f"manifest {path}: config: {exc}") from None
    return manifest


def config_from_manifest(manifest: dict[str, Any]) -> RunConfig:
    """The configuration to re-run, exactly as recorded (batch size included)."""
    return RunConfig.from_dict(manifest.get("config"))

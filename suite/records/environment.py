"""Facts about the software and host environment, recorded with every run."""

from __future__ import annotations

import platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

#: Distributions whose versions are recorded with every run (absent ones are recorded as absent).
TRACKED_DISTRIBUTIONS = (
    "suite-bench",
    "torch",
    "transformers",
    "tokenizers",
    "numpy",
    "pillow",
    "psutil",
    "mlflow",
    "datasets",
    "torchvision",
    "optimum-habana",
    "habana-media-loader",
    "nvidia-dali-cuda120",
)


def package_versions(names: tuple[str, ...] = TRACKED_DISTRIBUTIONS) -> dict[str, str]:
    """Installed version of each distribution, or ``"absent"``."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


@lru_cache(maxsize=1)
def git_state() -> dict[str, Any]:
    """Commit and dirty flag of the suite's own source tree; ``unknown`` when not a git checkout."""
    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": commit, "git_dirty": bool(status.strip())}


def host_facts() -> dict[str, Any]:
    import os

    from suite.devices.cpu import cpu_model_name

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_model": cpu_model_name(),
        "logical_cores": os.cpu_count(),
    }

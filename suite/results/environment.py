"""Facts about the software and host environment, recorded with every run."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from suite.devices.cpu import cpu_model_name
from suite.redact import redact_environment

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
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_model": cpu_model_name(),
        "logical_cores": os.cpu_count(),
    }


#: Environment variables that change what an accelerator run does (Habana's bridge and runtime, HCCL, NCCL, CUDA,
#: cuBLAS, NVIDIA's container runtime), recorded whenever set.
ACCELERATOR_VARIABLE_PREFIXES = ("PT_HPU_", "HABANA_", "HLS_", "HCCL_", "NCCL_", "TORCH_NCCL_", "CUDA_", "CUBLAS_",
                                 "NVIDIA_")
#: The variables that say which devices a process sees ("unset" when not set: the runtime's default, all of them).
VISIBLE_DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HABANA_VISIBLE_DEVICES",
                            "HABANA_VISIBLE_MODULES", "HLS_MODULE_ID")
#: Version facts an adapter's ``device_info`` may hold (driver, runtime, firmware, libraries).
VERSION_FACTS = ("driver_version", "cuda_runtime", "cudnn", "nccl", "compute_capability", "habana_frameworks",
                 "firmware_version")


def accelerator_environment(device_info: Mapping[str, Any], environ: Mapping[str, str] | None = None
                            ) -> dict[str, Any]:
    """What in the environment changes an accelerator's results: every variable of
    :data:`ACCELERATOR_VARIABLE_PREFIXES` set for the run (one whose name looks like a credential, such as
    ``NVIDIA_API_KEY`` or ``NCCL_IB_AUTH_TOKEN``, recorded as set without its value:
    :func:`suite.redact.redact_environment`), the visible devices, and the driver, runtime and firmware versions the
    adapter read (``device_info``). Recorded in the manifest and as one MLflow JSON artifact."""
    env = os.environ if environ is None else environ
    return {
        "variables": redact_environment({name: env[name] for name in sorted(env)
                                         if name.startswith(ACCELERATOR_VARIABLE_PREFIXES)}),
        "visible_devices": {name: env.get(name, "unset") for name in VISIBLE_DEVICE_VARIABLES},
        "versions": {name: device_info[name] for name in VERSION_FACTS if name in device_info},
        "device_name": device_info.get("device_name"),
        "device_count": device_info.get("device_count"),
    }

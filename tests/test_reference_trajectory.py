"""Regression canary: the tiny CPU preset's loss trajectory against the one committed in reference/.

Random initialisation differs between transformers lines (4.55.x, which optimum-habana pins, and 5.x),
so the file keeps one trajectory per line. Regenerate the current line's (after an intended change, say
why in the commit) with:
    SUITE_UPDATE_REFERENCE=1 pytest tests/test_reference_trajectory.py
"""

import json
import os
from pathlib import Path

import pytest
import torch

from suite.config import RunConfig
from suite.results.environment import package_versions

from conftest import run_configuration_process

TRAJECTORY = Path(__file__).resolve().parents[1] / "reference" / "tiny_cpu_loss_trajectory.json"
CONFIG = RunConfig(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu", precision="fp32",
                   steps=5, warmup_steps=3, seed=42, batch_size=8)
RTOL = 1e-5  # last-bit differences between CPU instruction sets and JPEG codec builds; far below a real change


def transformers_line() -> str:
    """``transformers-5`` for 5.x and later, ``transformers-4.55`` for 4.x releases."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return f"transformers-{major}" if major >= 5 else f"transformers-{major}.{minor}"


def _run(tmp_path):
    result = run_configuration_process(tmp_path, CONFIG)
    assert result["status"] == "FINISHED", result["reason"]
    return result


def test_tiny_loss_trajectory_matches_the_reference(tmp_path):
    result = _run(tmp_path)
    line = transformers_line()
    if os.environ.get("SUITE_UPDATE_REFERENCE") == "1":
        versions = package_versions()
        data = json.loads(TRAJECTORY.read_text()) if TRAJECTORY.exists() else {}
        data.update({
            "description": "loss per step (warm-up included) of the tiny preset on CPU, per transformers line; "
                           "a regression canary",
            "config": CONFIG.to_dict(),
            "dataset_fingerprint": result["facts"]["workload"]["dataset_fingerprint"]["sha256"],
            "rtol": RTOL,
        })
        data.setdefault("lines", {})[line] = {
            "initial_weights_sha256": result["facts"]["workload"]["initial_weights_sha256"],
            "losses_hex": result["losses_hex"],
            "loss_digest": result["loss_digest"],
            "generated_with": {k: versions[k] for k in ("torch", "transformers", "pillow", "numpy")}
            | {"cpu_capability": torch.backends.cpu.get_cpu_capability()},
        }
        TRAJECTORY.write_text(json.dumps(data, indent=2) + "\n")
        pytest.skip(f"reference trajectory for {line} rewritten")
    data = json.loads(TRAJECTORY.read_text())
    assert RunConfig.from_dict(data["config"]) == CONFIG  # fields added since default alike
    assert result["facts"]["workload"]["dataset_fingerprint"]["sha256"] == data["dataset_fingerprint"]
    assert line in data["lines"], f"no reference trajectory for {line}: generate it (see the module docstring)"
    reference = {**data["lines"][line], "rtol": data["rtol"]}
    expected = torch.tensor([float.fromhex(h) for h in reference["losses_hex"]], dtype=torch.float64)
    measured = torch.tensor([float.fromhex(h) for h in result["losses_hex"]], dtype=torch.float64)
    assert measured.shape == expected.shape
    assert result["facts"]["workload"]["initial_weights_sha256"] == reference["initial_weights_sha256"]
    torch.testing.assert_close(measured, expected, rtol=reference["rtol"], atol=0.0)

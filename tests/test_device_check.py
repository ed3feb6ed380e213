"""scripts/device-check.sh cannot pass falsely: no device is a non-zero exit with the reason (run for real here), and
any FAILED configuration, or one that left no record, fails the check."""

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from suite.devices.base import Availability

pytestmark = pytest.mark.mechanics
ROOT = Path(__file__).parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_check_on_a_machine_without_the_device_exits_non_zero_with_the_reason():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "device-check.sh"), "cuda"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "NO_INSTALL": "1"}, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("device-check: python: ") and any(line.startswith("device-check: torch: ")
                                                                 for line in lines)
    assert lines[-1] == ("device-check: FAILED: device cuda is not available here: no CUDA device: torch "
                         f"{__import__('torch').__version__} is a build without CUDA")


def test_the_extras_installed_match_torchs_cuda_and_exist():
    check = _script()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert check.extras_for("nvidia", "12.8") == ["cuda", "dali-cuda12"]
    assert check.extras_for("nvidia", "13.0") == ["cuda", "dali-cuda13"]
    assert check.extras_for("gaudi", None) == ["gaudi"]
    for family, cuda in (("nvidia", "12.8"), ("nvidia", "13.0"), ("gaudi", None)):
        assert set(check.extras_for(family, cuda)) <= set(extras)


def _fake_run(statuses):
    """`suite run` as the check calls it, writing what a run of that configuration would record."""
    def run(*args):
        if args[0] != "run":
            return 0
        argv = list(args)
        value = {name: argv[argv.index(name) + 1] for name in ("--loader", "--workers", "--precision", "--engine",
                                                                 "--output")}
        config = {"loader": value["--loader"], "num_workers": int(value["--workers"]),
                  "precision": value["--precision"], "engine": value["--engine"]}
        status = statuses(config)
        if status is None:
            return 1  # crashed before recording anything
        out = Path(value["--output"])
        out.mkdir(parents=True)
        metrics = {"throughput_samples_per_s": 10.0 * (1 + config["num_workers"]) *
                   (3 if config["loader"] in ("device", "dali") else 1), "mfu_bf16_peak": 0.05}
        (out / "results.json").write_text(json.dumps({"runs": [{
            "config": config, "status": status, "reason": None if status == "FINISHED" else "boom",
            "metrics": metrics if status == "FINISHED" else {}, "facts": {}}]}))
        return 0 if status == "FINISHED" else 1
    return run


@pytest.fixture
def offline_check(monkeypatch):
    check = _script()

    class Adapter:
        supported_loaders = ("cpu", "cpu-fast", "device", "dali")

        @classmethod
        def availability(cls):
            return Availability(True, "", {"device_name": "NVIDIA H100 80GB HBM3"})

        def setup(self):
            pass

        def supported_precisions(self):
            return ("fp32",)  # a card without bf16: those configurations are refused up front

    import suite.registry

    monkeypatch.setattr(suite.registry, "load_device", lambda name: Adapter)
    monkeypatch.setattr(check, "nvjpeg_rate", lambda: {"nvjpeg_images_per_s": 1.0})
    return check


def test_every_configuration_finished_passes_and_reports_the_figures(offline_check, monkeypatch, tmp_path):
    monkeypatch.setattr(offline_check, "suite", _fake_run(lambda config: "FINISHED"))
    assert offline_check.main(["h100", "--no-install", "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert report["passed"] and len(report["configurations"]) == 4 * 2 + 1  # fp32 x 4 loaders x 2 workers + trainer
    assert {r["precision"] for r in report["refused_up_front"]} == {"bf16"}
    assert report["refused_up_front"][0]["reason"] == "h100 supports fp32 only"
    assert report["samples_per_s"]["suite/fp32/nw2"] == {"cpu": 30.0, "cpu-fast": 30.0, "device": 90.0, "dali": 90.0}
    assert report["on_device_decode_vs_best_cpu_loader"]["suite/fp32/nw0"] == {"device_vs_best_cpu_loader": 3.0,
                                                                               "dali_vs_best_cpu_loader": 3.0}
    assert report["mfu_bf16_peak"]["suite/fp32/nw0/device"] == 0.05


def test_one_failed_configuration_fails_the_check(offline_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(offline_check, "suite", _fake_run(
        lambda config: "FAILED" if config["loader"] == "dali" and config["num_workers"] == 2 else "FINISHED"))
    assert offline_check.main(["h100", "--no-install", "--output", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert not report["passed"] and [(f["loader"], f["num_workers"]) for f in report["failed"]] == [("dali", 2)]
    assert capsys.readouterr().out.rstrip().endswith("device-check: FAILED")


def test_a_configuration_that_left_no_record_fails_the_check(offline_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(offline_check, "suite", _fake_run(
        lambda config: None if config["engine"] == "hf-trainer" else "FINISHED"))
    assert offline_check.main(["h100", "--no-install", "--output", str(tmp_path)]) == 1
    assert "1 configuration(s) left no record" in capsys.readouterr().out

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


# --- installing the extras never replaces the installed torch (issue 25, defect 3): real pip, real index ----------

@pytest.mark.hardware_contract
def test_the_extras_install_pins_the_installed_torch_and_pip_keeps_it(tmp_path):
    """pip's own dry run of the cuda extra with the constraint the check writes: torch stays the installed build, and
    whatever torchvision pip picks is one that accepts it (torchvision 0.29.1 would need torch >= 2.14)."""
    import torch

    check = _script()
    assert check.pinned_pip_command("x[cuda]", tmp_path / "c.txt")[3:6] == ["install", "--quiet", "--constraint"]
    constraints = tmp_path / "torch-pin.txt"
    constraints.write_text(f"torch=={torch.__version__}\n")
    argv = check.pinned_pip_command(f"{ROOT}[cuda]", constraints)
    done = subprocess.run([*argv, "--dry-run", "--report", str(tmp_path / "report.json")], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0 and not os.environ.get("CI") and "ConnectionError" in done.stderr + done.stdout:
        pytest.skip("no package index reachable")
    assert done.returncode == 0, done.stderr[-2000:]
    picked = {item["metadata"]["name"].lower(): item["metadata"]["version"]
              for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert "torch" not in picked  # the installed build stays
    if "torchvision" in picked:
        major, minor = (int(p) for p in picked["torchvision"].split(".")[:2])
        torch_minor = int(torch.__version__.split(".")[1])
        assert (major, minor) == (0, torch_minor + 15)  # torchvision 0.N+15 pairs with torch 2.N


@pytest.mark.hardware_contract
def test_where_no_release_matches_the_installed_torch_nothing_is_installed_and_the_pip_line_is_said(
        tmp_path, capsys):
    """A torch no torchvision release accepts (here: a version that does not exist): the check stops before pip
    installs anything, naming the exact pip line."""
    check = _script()
    assert check.pip_install_pinned(f"{ROOT}[cuda]", "2.13.0.post999", tmp_path) is False
    out = capsys.readouterr().out
    assert "FAILED: no release of " in out and "matches the installed torch 2.13.0.post999" in out
    line = out.split("The pip line: ")[1].strip()
    assert line == " ".join(check.pinned_pip_command(f"{ROOT}[cuda]", tmp_path / "torch-pin.txt"))
    assert (tmp_path / "torch-pin.txt").read_text() == "torch==2.13.0.post999\n"


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
    """The check with the device probe answering as an H100 host would (one card without bf16, or ``count`` cards)."""
    check = _script()
    state = {"count": 1, "asked": []}

    def probe(names, precisions=False):
        state["asked"].append(precisions)
        details = {"device_name": "NVIDIA H100 80GB HBM3", "device_count": state["count"]}
        if precisions:
            details["supported_precisions"] = ["fp32"]  # a card without bf16: those configurations are refused
        return {name: Availability(True, "", details) for name in names}

    import suite.devices.probe

    monkeypatch.setattr(suite.devices.probe, "probe", probe)
    monkeypatch.setattr(check, "nvjpeg_rate_elsewhere", lambda: {"nvjpeg_images_per_s": 1.0})
    check.state = state
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
    assert offline_check.state["asked"] == [False, True]  # availability, then precisions: both in the probe


def test_a_machine_with_several_devices_runs_one_configuration_over_all_of_them(offline_check, monkeypatch, tmp_path):
    calls = []
    run = _fake_run(lambda config: "FINISHED")
    monkeypatch.setattr(offline_check, "suite", lambda *args: calls.append(args) or run(*args))
    offline_check.state["count"] = 8
    assert offline_check.main(["h100", "--no-install", "--output", str(tmp_path)]) == 0
    nproc = [a[a.index("--nproc-per-node") + 1] for a in calls if a[0] == "run"]
    assert nproc.count("8") == 1 and nproc.count("1") == 4 * 2 + 1


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

"""scripts/device-check.sh works the first time on a fresh accelerator box and cannot pass falsely (issue 47): its plan
for a driver of 550 and of 580 (a stand-in ``nvidia-smi`` on PATH, printing what the real one prints for
``--query-gpu=driver_version --format=csv,noheader``), an environment made for real (a venv over this interpreter's
torch, installing only from a wheelhouse), no device as a non-zero exit naming the driver, and the runs' verdict: any
FAILED configuration, one that left no record, or one whose images were decoded on the host fails the check."""

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
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _nvidia_smi(tmp_path, version):
    """A folder holding an ``nvidia-smi`` that answers the driver query as the real one does."""
    folder = tmp_path / f"bin-{version}"
    folder.mkdir()
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho '{version}'\n")
    tool.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable}


def _plan(tmp_path, env, *args):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "device-check.sh"), "cuda", "--plan", "--output",
                           str(tmp_path / "out"), *args], capture_output=True, text=True, env=env, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("driver,build,cuda", [("580.65.06", "cu130", "CUDA 13.0"), ("550.54.15", "cu126", "CUDA 12.6")])
def test_the_plan_installs_the_tested_torch_built_for_the_cuda_the_driver_runs(tmp_path, driver, build, cuda):
    check = _script()
    code, out = _plan(tmp_path, _nvidia_smi(tmp_path, driver))
    assert code == 0, out
    assert f"driver {driver} (nvidia-smi)" in out
    assert f"torch: torch {check.TESTED_TORCH}+{build} and torchvision {check.TESTED_TORCHVISION}+{build} ({cuda} " \
           f"build): driver {driver}" in out
    assert f"--index-url https://download.pytorch.org/whl/{build} torch=={check.TESTED_TORCH}" in out
    # the published shape, with a budget each, and nothing changed
    for shape in ("large bf16 cpu workers=0", "large bf16 cpu workers=1", "large bf16 cpu workers=2",
                  "large bf16 device workers=2", "large bf16 dali workers=2", "large bf16 cpu workers=2 "
                  "--no-deterministic"):
        assert f"device-check:   {shape}" in out, shape
    assert "--preset large --precision bf16" in out and "at most 480 s of device time" in out
    assert "not installed: mlflow: the runs record to the results folder" in out
    assert not (tmp_path / "out").exists()


def test_a_driver_too_old_for_any_build_is_refused_naming_it(tmp_path):
    code, out = _plan(tmp_path, _nvidia_smi(tmp_path, "470.239.06"))
    assert code == 2 and "environment: none can be made: driver 470.239.06 (nvidia-smi): no torch" in out
    assert "needs driver >= 525.60.13" in out and not (tmp_path / "out").exists()


def test_the_plan_with_the_installed_torch_pins_it(tmp_path):
    import torch

    code, out = _plan(tmp_path, _nvidia_smi(tmp_path, "580.65.06"), "--use-installed-torch")
    assert code == 0, out
    assert f"torch: torch {torch.__version__} (CUDA none), already installed with {sys.executable}" in out
    assert f"constraints: torch=={torch.__version__}" in out and "seeing its site-packages" in out


def test_the_tested_torch_is_the_one_the_tests_run():
    """One fact, checked where it is written twice: the check's TESTED_TORCH is tox.ini's pin, and its torchvision
    pairs with it (0.N+15 for torch 2.N)."""
    check = _script()
    assert f"torch=={check.TESTED_TORCH}" in (ROOT / "tox.ini").read_text()
    minor = int(check.TESTED_TORCH.split(".")[1])
    assert check.TESTED_TORCHVISION.startswith(f"0.{minor + 15}.")


def test_the_run_time_needs_are_the_projects_less_what_runs_without(tmp_path):
    check = _script()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needs = check.runtime_requirements(["cuda"])
    names = {check._name(n) for n in needs}
    assert names == {check._name(n) for n in project["dependencies"] + project["optional-dependencies"]["cuda"]} \
        - {"torch", "torchvision", "mlflow", "numba", "arch"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "cuda", "--requirements"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == [n.replace(" ", "") for n in needs] or \
        done.stdout.strip().splitlines() == needs


@pytest.mark.e2e
def test_the_environment_is_made_for_real_and_installs_only_from_the_wheelhouse(tmp_path):
    """A venv over this interpreter (its torch, pinned: this is a virtualenv, whose packages `venv
    --system-site-packages` would not show), the suite installed into it from a wheelhouse holding only setuptools:
    every run-time need is already there, so pip (--no-index) fetches nothing, and the venv's Python imports the
    suite and this interpreter's torch."""
    import argparse

    check = _script()
    wheels = tmp_path / "wheels"  # what scripts/wheelhouse.sh puts there for this box: the build's setuptools alone
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest",
                              str(wheels), check.BUILD_REQUIREMENT], capture_output=True, text=True, timeout=600)
    if fetched.returncode != 0 and not os.environ.get("CI"):
        pytest.skip(f"no package index reachable: {fetched.stderr[-300:]}")
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    args = argparse.Namespace(venv=tmp_path / "venv", output=tmp_path / "out", wheelhouse=wheels,
                              use_installed_torch=True, python=sys.executable)
    env = check.plan_environment(args, "cpu", check.Driver(None, "a CPU"))  # the cuda extra: the plan tests
    assert all("--no-index" in install for install in env.installs)
    python = check.make_environment(env)
    done = subprocess.run([python, "-c", "import suite, torch, workloads; print(torch.__version__)"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import torch

    assert done.stdout.strip() == torch.__version__
    assert (tmp_path / "venv" / "pins.txt").read_text().startswith(f"torch=={torch.__version__}\n")


def test_the_device_check_on_a_machine_without_the_device_exits_3_with_the_reason_and_the_driver():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "cuda", "--inner",
                           "--output", "/tmp/unused-device-check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("device-check: FAILED: device cuda is not available here: no CUDA device: torch "
                           f"{__import__('torch').__version__} is a build without CUDA (")
    assert "driver" in last  # issue 47 (1): every "device unavailable" reason says the driver


# --- the verdict: offline, with the device probe and `suite run` answering as an H100 host would ---------------------

def _fake_run(status_of, fallbacks=lambda config: 0):
    """`suite run` as the check calls it, writing what a run of that configuration would record."""
    def run(*args):
        if args[0] != "run":
            return 0
        argv = list(args)
        value = {name: argv[argv.index(name) + 1] for name in ("--loader", "--workers", "--precision", "--output")}
        config = {"loader": value["--loader"], "num_workers": int(value["--workers"]),
                  "precision": value["--precision"], "deterministic": "--no-deterministic" not in argv}
        status = status_of(config)
        if status is None:
            return 1  # crashed before recording anything
        out = Path(value["--output"])
        out.mkdir(parents=True)
        metrics = {"throughput_samples_per_s": 40.0 * (1 + config["num_workers"] / 2) *
                   (1.5 if config["loader"] in ("device", "dali") else 1) * (1 if config["deterministic"] else 1.1),
                   "mfu": 0.3, "device_peak_memory_bytes": 40 * 2**30}
        if config["loader"] in ("device", "dali"):
            metrics["device_decode_fallbacks"] = float(fallbacks(config))
        (out / "results.json").write_text(json.dumps({"runs": [{
            "config": config, "status": status, "reason": None if status == "FINISHED" else "boom",
            "metrics": metrics if status == "FINISHED" else {}, "facts": {}}]}))
        return 0 if status == "FINISHED" else 1
    return run


@pytest.fixture
def offline_check(monkeypatch):
    check = _script()

    def probe(names, precisions=False):
        details = {"device_name": "NVIDIA H100 80GB HBM3", "device_count": 1, "supported_precisions": ["fp32", "bf16"]}
        return {name: Availability(True, "", details) for name in names}

    import suite.devices.probe

    monkeypatch.setattr(suite.devices.probe, "probe", probe)
    monkeypatch.setattr(check, "nvjpeg_rate_elsewhere", lambda: {"nvjpeg_images_per_s": 1.0})
    monkeypatch.setattr(check, "_importable", lambda module: module == "nvidia.dali")
    monkeypatch.setattr(check, "mlflow_installed", lambda: False)
    return check


def test_every_configuration_finished_passes_and_prints_the_blogs_table(offline_check, monkeypatch, tmp_path,
                                                                        capsys):
    monkeypatch.setattr(offline_check, "suite", _fake_run(lambda config: "FINISHED"))
    assert offline_check.main(["h100", "--inner", "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert report["passed"] and report["blog_device"] == "h100" and report["blog_devices"] == 8
    published = {row["configuration"]: row for row in report["rows"]}
    assert published["large bf16 cpu workers=0"]["blog_per_device"] == pytest.approx(336.5 / 8)
    assert published["large bf16 cpu workers=2"]["blog_per_device"] == pytest.approx(602.1 / 8)
    ratios = {r["ratio"]: r for r in report["ratios"]}
    assert ratios["workers 2 / 0"]["measured"] == pytest.approx(2.0)
    assert ratios["workers 2 / 0"]["blog"] == pytest.approx(602.1 / 336.5)
    assert ratios["device decode / cpu workers=2"]["measured"] == pytest.approx(1.5)
    assert ratios["device decode / cpu workers=2"]["blog"] is None  # the blog decoded on the device on Gaudi2 only
    assert report["determinism_cost"]["cost"] == pytest.approx(1 - 1 / 1.1)
    out = capsys.readouterr().out
    assert "the blog's table for this device" in out and "workers 2 / 0" in out and "deterministic kernels" in out
    assert out.rstrip().endswith("device-check: PASSED")


def test_one_failed_configuration_fails_the_check(offline_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(offline_check, "suite", _fake_run(
        lambda config: "FAILED" if config["loader"] == "dali" else "FINISHED"))
    assert offline_check.main(["h100", "--inner", "--output", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert not report["passed"] and [f["configuration"] for f in report["failed"]] == ["large bf16 dali workers=2"]
    assert capsys.readouterr().out.rstrip().endswith("device-check: FAILED")


def test_a_configuration_that_left_no_record_fails_the_check(offline_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(offline_check, "suite", _fake_run(
        lambda config: None if config["num_workers"] == 1 else "FINISHED"))
    assert offline_check.main(["h100", "--inner", "--output", str(tmp_path)]) == 1
    assert "FAILED: large bf16 cpu workers=1: NO RECORD" in capsys.readouterr().out


def test_any_image_decoded_on_the_host_fails_the_check(offline_check, monkeypatch, tmp_path, capsys):
    """Issue 47 (5): a broken decoder became silent host decoding, and the check ignored the fallback count."""
    monkeypatch.setattr(offline_check, "suite", _fake_run(lambda config: "FINISHED",
                                                          fallbacks=lambda config: 3 if config["loader"] == "device"
                                                          else 0))
    assert offline_check.main(["h100", "--inner", "--output", str(tmp_path)]) == 1
    assert "3 image(s) of the check's own data decoded on the host" in capsys.readouterr().out


def test_without_dali_its_configuration_is_said_not_run_and_not_failed(offline_check, monkeypatch, tmp_path,
                                                                       capsys):
    monkeypatch.setattr(offline_check, "_importable", lambda module: False)
    monkeypatch.setattr(offline_check, "suite", _fake_run(lambda config: "FINISHED"))
    assert offline_check.main(["h100", "--inner", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "dali: not run (NVIDIA DALI is not installed" in out and "large bf16 dali" not in out

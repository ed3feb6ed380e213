"""The device check behind ``scripts/device-check.sh``: the first run of this code on a GPU or Gaudi machine, in one
call, that cannot pass falsely, and that measures the published workload's shape.

1. **The environment** (this script, standard library only, before anything is installed): it reads the driver's
   version first (``/proc/driver/nvidia/version`` or ``nvidia-smi``; ``hl-smi`` on Gaudi), then makes a virtual
   environment of its own (never pip into the system Python: Debian 12 and Ubuntu 24.04 refuse it) and installs:

   * by default, torch ``TESTED_TORCH`` (the release the suite's tests run) built for the CUDA the driver runs:
     from download.pytorch.org's ``cu130`` for a driver >= 580.65.06, ``cu126`` for >= 525.60.13 (NVIDIA's
     minor-version compatibility), with the matching torchvision from the same index; a driver older than that is
     refused, naming it. (An unpinned ``pip install torch`` takes torch 2.15 built for CUDA 13.2, which an older
     driver cannot run: the reason shown was only "no CUDA device".)
   * ``--use-installed-torch``: the environment sees the interpreter's own packages (``--system-site-packages``) and
     uses the torch (and torchvision) installed there, pinned: cloud images and air-gapped clusters ship one;
   * ``--wheelhouse DIR``: installs only from DIR (``pip --no-index``), which ``scripts/wheelhouse.sh`` fills on a
     connected machine with what the suite needs beside an existing torch.

   MLflow is not installed: the runs record to the results folder, and ``suite upload`` takes them into MLflow later
   from any machine that has it. ``--plan`` prints the environment it would make, the exact torch build it would
   install or use and why, and every configuration with its time budget; it changes nothing.
2. **The runs** (stage ``--inner``, in that environment): the device is probed in a short-lived process (a long-lived
   parent never holds it); a tiny smoke run; then the published shape (the large preset, bf16, the published
   per-device batch of 48, random init: nothing is fetched) for ``dataloader_num_workers`` 0, 1, 2 with the CPU
   loader, the device decoders (nvJPEG; DALI where installed; Habana's media pipe), and one configuration without
   deterministic kernels, the published method's setting (the cost of the suite's determinism). Each configuration
   runs under its share of ``--budget`` (480 s by default, about 8 minutes of an H100 after installation): one that
   overruns is killed and recorded FAILED ("timed out").
3. **The table**: per-device samples/s beside the blog's figures divided by its 8 devices, the workers 2/0 and 1/0 and
   device-decode ratios beside the blog's, MFU and device memory; then ``device-check.json``. Exit 1 if any
   configuration FAILED or left no record, or any image of its own synthetic data was decoded on the host instead of
   the device (a broken decoder would otherwise pass as device decoding); exit 3 where the device is absent, with the
   reason and the driver's version; exit 2 where no environment can be made.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FAMILY = {"cuda": "nvidia", "h100": "nvidia", "a100": "nvidia", "gaudi2": "gaudi", "cpu": "cpu"}
#: The torch the suite's tests run (tox.ini), and the torchvision that pairs with it (0.N+15 for torch 2.N).
TESTED_TORCH = "2.13.0"
TESTED_TORCHVISION = "0.28.0"
#: PyTorch's CUDA builds the check installs, newest first, with the oldest Linux driver each runs (NVIDIA's CUDA
#: minor-version compatibility: any 13.x on >= 580.65.06, any 12.x on >= 525.60.13).
CUDA_BUILDS = (("cu130", "CUDA 13.0", (580, 65, 6)), ("cu126", "CUDA 12.6", (525, 60, 13)))
PYTORCH_INDEX = "https://download.pytorch.org/whl/{build}"
#: The blog's numbers are global over this many devices (reference/bridgetower_hf_blog_2023.json, workload.devices).
BLOG_REFERENCE = "bridgetower_hf_blog_2023"
#: What building the suite's editable install needs (pyproject.toml's build-system), installed into the environment
#: first: offline, pip's isolated build could not fetch it.
BUILD_REQUIREMENT = "setuptools>=68"
DEFAULT_BUDGET_S = 480.0
SMOKE_BUDGET_S = 90.0
MIN_CONFIGURATION_S = 60.0
EXIT_FAILED, EXIT_NO_ENVIRONMENT, EXIT_UNAVAILABLE = 1, 2, 3


def say(text: str) -> None:
    print(f"device-check: {text}", flush=True)


class Refused(Exception):
    """No environment can be made here; the message says why (the driver's version included)."""


# --- 1. the driver and the environment -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Driver:
    version: str | None  # "580.65.06"; None: no driver found
    how: str  # where it was read, or why it was not

    def parts(self) -> tuple[int, ...]:
        return tuple(int(p) for p in (self.version or "").split(".") if p.isdigit())

    def text(self) -> str:
        return f"driver {self.version} ({self.how})" if self.version else f"no driver found ({self.how})"


def read_driver(family: str) -> Driver:
    """The kernel driver's version: NVIDIA's from ``/proc/driver/nvidia/version``, else ``nvidia-smi``; Habana's from
    ``hl-smi``. Read without torch: it is said even where no torch can open the device."""
    if family == "nvidia":
        try:
            text = Path("/proc/driver/nvidia/version").read_text(errors="replace")
            found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
            if found:
                return Driver(found.group(1), "/proc/driver/nvidia/version")
        except OSError:
            pass
        out = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        found = re.match(r"\s*(\d+\.\d+(?:\.\d+)?)", out)
        return Driver(found.group(1), "nvidia-smi") if found else Driver(None, f"nvidia-smi: {out[:200]}")
    if family == "gaudi":
        out = command_output(["hl-smi", "-Q", "driver_version", "-f", "csv,noheader"])
        found = re.match(r"\s*(\S+)", out)
        return Driver(found.group(1), "hl-smi") if found and "not found" not in out else Driver(None, out[:200])
    return Driver(None, "a CPU has no driver")


def command_output(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return f"{argv[0]}: not found"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    return (done.stdout or done.stderr).strip()


@dataclass
class Environment:
    """What the check makes and installs (``--plan`` prints it)."""

    venv: Path
    python: str  # the interpreter the venv is made from
    system_site_packages: bool  # the venv sees that interpreter's own packages (its torch), whatever its kind
    torch: str  # what torch it runs, in words
    why: str
    installs: list[list[str]] = field(default_factory=list)  # pip commands, run in the venv, in order
    pins: list[str] = field(default_factory=list)  # the pip constraints every install runs under


def interpreter_torch(python: str) -> tuple[str, str | None, str | None] | None:
    """(torch, its CUDA, torchvision or None) as ``python`` imports them; None where it has no torch."""
    probe = ("import json, torch\ntry:\n import torchvision; tv = torchvision.__version__\n"
             "except Exception:\n tv = None\nprint(json.dumps([torch.__version__, torch.version.cuda, tv]))")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    torch, cuda, vision = json.loads(done.stdout.strip().splitlines()[-1])
    return torch, cuda, vision


def choose_cuda_build(driver: Driver) -> tuple[str, str]:
    """(PyTorch's build tag, what it is) for this driver: the newest CUDA the driver runs; :class:`Refused` where
    none does."""
    have = driver.parts()
    for tag, cuda, needed in CUDA_BUILDS:
        if have and have >= needed:
            return tag, cuda
    oldest = CUDA_BUILDS[-1]
    raise Refused(f"{driver.text()}: no torch {TESTED_TORCH} build runs on it (the oldest, {oldest[1]}, needs driver "
                  f">= {'.'.join(map(str, oldest[2]))}); update the driver, or pass --use-installed-torch to use a "
                  "torch built for it")


def plan_environment(args: argparse.Namespace, family: str, driver: Driver) -> Environment:
    """The environment to make: its interpreter, which torch and why, and the pip commands; nothing is done."""
    venv = args.venv or (args.output / "venv")
    extras = ["cuda"] if family == "nvidia" else ["gaudi"] if family == "gaudi" else []
    suite_spec = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    source = ["--no-index", "--find-links", str(args.wheelhouse)] if args.wheelhouse else []
    if args.use_installed_torch or family == "gaudi":  # Habana's torch comes with its software stack, never pip's
        found = interpreter_torch(args.python)
        if found is None:
            raise Refused(f"{args.python} has no importable torch to use ({driver.text()}); drop "
                          "--use-installed-torch to install torch " + TESTED_TORCH)
        torch, cuda, vision = found
        pins = [f"torch=={torch}"] + ([f"torchvision=={vision}"] if vision else [])
        env = Environment(venv, args.python, True, f"torch {torch} (CUDA {cuda or 'none'}), already installed with "
                          f"{args.python}", "--use-installed-torch: the interpreter's own torch, pinned"
                          if family != "gaudi" else "Habana's torch comes with its software stack", pins=pins)
    else:
        if family == "nvidia":
            tag, cuda = choose_cuda_build(driver)
            torch_source = source or ["--index-url", PYTORCH_INDEX.format(build=tag)]
            what = f"torch {TESTED_TORCH}+{tag} and torchvision {TESTED_TORCHVISION}+{tag} ({cuda} build)"
            why = (f"{driver.text()} runs {cuda}: the newest of PyTorch's builds it can run "
                   f"({', '.join(f'{c} needs >= ' + '.'.join(map(str, n)) for _, c, n in CUDA_BUILDS)})")
            torch_specs = [f"torch=={TESTED_TORCH}", f"torchvision=={TESTED_TORCHVISION}"]
        else:
            torch_source = source
            what, why = f"torch {TESTED_TORCH} (CPU)", "no accelerator: the CPU build"
            torch_specs = [f"torch=={TESTED_TORCH}"]
        env = Environment(venv, args.python, False, what, why, pins=list(torch_specs))
        env.installs.append(["install", "--quiet", *torch_source, *torch_specs])
    # the suite (editable: the tree that travelled is what runs) built with the environment's own setuptools, so that
    # nothing is fetched for the build, then its run-time needs (MLflow aside: runs record to the folder)
    env.installs.append(["install", "--quiet", *source, BUILD_REQUIREMENT])
    env.installs.append(["install", "--quiet", *source, "--no-build-isolation", "--no-deps", "-e", suite_spec])
    env.installs.append(["install", "--quiet", *source, *runtime_requirements(extras)])
    return env


#: Dependencies a configuration runs without, and what is missing then; the check does not install them (the wheels
#: that travel to an air-gapped box are ~110 MB lighter: llvmlite alone is 58 MB).
OPTIONAL_AT_RUN_TIME = {
    "mlflow": "the runs record to the results folder; `suite upload` takes them into MLflow later",
    "numba": "the cpu-fast loader's compiled kernels (torch's interpolate runs instead, recorded as such)",
    "arch": "the audit's bootstrap (`suite audit`), not a run",
}


def runtime_requirements(extras: list[str]) -> list[str]:
    """What the suite needs to run a configuration (``pyproject.toml``'s dependencies and the extras'), torch and
    :data:`OPTIONAL_AT_RUN_TIME` aside: torch is the environment's."""
    text = (ROOT / "pyproject.toml").read_text()
    needs = _toml_list(text, "dependencies")
    for extra in extras:
        needs += _toml_list(text, extra)
    return [n for n in needs if _name(n) not in ("torch", "torchvision", *OPTIONAL_AT_RUN_TIME)]


def _toml_list(text: str, key: str) -> list[str]:
    """The strings of ``key = [...]`` in pyproject.toml (read by hand: Python 3.10 has no tomllib)."""
    found = re.search(rf"^{re.escape(key)}\s*=\s*\[(.*?)\]", text, re.S | re.M)
    return re.findall(r'"([^"]+)"', found.group(1)) if found else []


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower()


def see_packages_of(base: str, python: str) -> None:
    """Make the venv of ``python`` see ``base``'s installed packages after its own: a ``.pth`` file naming them.
    (``venv --system-site-packages`` would show the packages of the base *installation*: from a virtualenv or a conda
    environment, not the ones its interpreter imports, torch among them.)"""
    query = ("import json, sysconfig; "
             "print(json.dumps(sorted({sysconfig.get_paths()[k] for k in ('purelib', 'platlib')})))")
    theirs = json.loads(subprocess.run([base, "-c", query], capture_output=True, text=True, check=True).stdout)
    ours = json.loads(subprocess.run([python, "-c", query], capture_output=True, text=True, check=True).stdout)
    Path(ours[0], "_device_check_base_packages.pth").write_text("".join(f"{path}\n" for path in theirs))


def make_environment(env: Environment) -> str:
    """Make the venv and run its installs under the pins; the venv's python. :class:`Refused` says what failed."""
    python = str(env.venv / "bin" / "python")
    if not Path(python).exists():
        argv = [env.python, "-m", "venv", str(env.venv)]
        say("making the environment: " + " ".join(argv))
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise Refused(f"{' '.join(argv)} failed (Debian and Ubuntu: apt install python3-venv): "
                          + " ".join((done.stderr or done.stdout).split()[-30:]))
        if env.system_site_packages:
            see_packages_of(env.python, python)
    pins = env.venv / "pins.txt"
    pins.write_text("".join(f"{pin}\n" for pin in env.pins))
    for install in env.installs:
        argv = [python, "-m", "pip", *install[:1], "--constraint", str(pins), *install[1:]]
        say(" ".join(argv[2:]))
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise Refused(f"pip failed: {' '.join(argv[2:])}: " + " ".join((done.stderr or done.stdout).split()[-40:]))
    return python


# --- 2. the configurations -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Configuration:
    name: str
    options: tuple[str, ...]  # `suite run` options
    budget_s: float
    role: str  # smoke, published, determinism
    loader: str = "cpu"
    workers: int = 0
    deterministic: bool = True


def plan_configurations(device: str, family: str, budget_s: float, steps: int, precision: str = "bf16",
                        dali: bool = False) -> list[Configuration]:
    """The smoke run, then the published shape for workers 0, 1, 2 (CPU loader), the device decoders at 2 workers,
    and the published method's determinism (off) at 2 workers; the budget shared equally after the smoke run's."""
    decoders = {"nvidia": ["device"] + (["dali"] if dali else []), "gaudi": ["device"], "cpu": ["device"]}[family]
    published = [("cpu", 0, True), ("cpu", 1, True), ("cpu", 2, True)] + [(d, 2, True) for d in decoders] \
        + [("cpu", 2, False)]
    share = max(MIN_CONFIGURATION_S, (budget_s - SMOKE_BUDGET_S) / len(published))
    preset = "large" if family != "cpu" else "tiny"  # a CPU runs the machinery only (the tests)
    common = ("--device", device, "--eval-samples", "48", "--warmup-steps", "3", "--steps", str(steps))
    out = [Configuration("smoke: tiny fp32 cpu workers=0", ("--device", device, "--preset", "tiny", "--precision",
                                                             "fp32", "--loader", "cpu", "--workers", "0", "--steps",
                                                             "5", "--warmup-steps", "1"), SMOKE_BUDGET_S, "smoke")]
    for loader, workers, deterministic in published:
        name = (f"{preset} {precision} {loader} workers={workers}"
                + ("" if deterministic else " --no-deterministic"))
        options = (*common, "--preset", preset, "--precision", precision, "--loader", loader, "--workers",
                   str(workers), *(() if deterministic else ("--no-deterministic",)))
        out.append(Configuration(name, options, share, "published" if deterministic else "determinism", loader,
                                 workers, deterministic))
    return out


def print_plan(args: argparse.Namespace, driver: Driver, env: Environment | None, refusal: str | None,
               configurations: list[Configuration]) -> None:
    say(f"plan for device {args.device} (nothing is changed)")
    say(f"{driver.text()}")
    if env is None:
        say(f"environment: none can be made: {refusal}")
    else:
        say(f"environment: {env.venv} (a virtual environment of {env.python}"
            + (", seeing its site-packages" if env.system_site_packages else "") + ")")
        say(f"torch: {env.torch}: {env.why}")
        for install in env.installs:
            say("  pip " + " ".join(install) + f"   (constraints: {', '.join(env.pins)})")
        for name, without in OPTIONAL_AT_RUN_TIME.items():
            say(f"not installed: {name}: {without}")
    total = sum(c.budget_s for c in configurations)
    say(f"configurations ({len(configurations)}, at most {total:.0f} s of device time after installation):")
    for configuration in configurations:
        say(f"  {configuration.name:<48} budget {configuration.budget_s:.0f} s   suite run "
            + " ".join(configuration.options))


# --- 3. running them, and the table ----------------------------------------------------------------------------------
def suite(*args: str) -> int:
    argv = [sys.executable, "-m", "suite", *args]
    say(" ".join(argv[2:]))
    return subprocess.run(argv).returncode


def mlflow_installed() -> bool:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        return False
    return True


def published_figures(device: str, device_name: str | None) -> tuple[str | None, dict[tuple[str, int], float], int]:
    """(the blog's device the card compares with, its samples/s per device by (loader, workers), the blog's device
    count): H100 and A100 by name; Gaudi2; none for other cards."""
    data = json.loads((ROOT / "reference" / f"{BLOG_REFERENCE}.json").read_text())
    devices = int(data["workload"]["devices"])
    name = (device_name or "").upper()
    blog = "gaudi2" if device == "gaudi2" else "h100" if "H100" in name else "a100" if "A100" in name else None
    figures = {(row["loader"], int(row["dataloader_num_workers"])): float(row["throughput_samples_per_s"]) / devices
               for row in data["results"] if row["device"] == blog}
    return blog, figures, devices


def collect(out: Path, configurations: list[Configuration]) -> list[dict[str, Any]]:
    """Each configuration's record (``None`` where it left none)."""
    records = []
    for index, configuration in enumerate(configurations):
        path = out / "runs" / f"{index:02d}" / "results.json"
        runs = json.loads(path.read_text()).get("runs", []) if path.exists() else []
        records.append({"configuration": configuration.name, "role": configuration.role,
                        "budget_s": configuration.budget_s, "record": runs[0] if runs else None})
    return records


def summarize(records: list[dict[str, Any]], configurations: list[Configuration], device: str,
              device_name: str | None) -> dict[str, Any]:
    """The blog-comparable table: per configuration its samples/s per device beside the blog's, MFU, device memory;
    the ratios beside the blog's; the determinism cost."""
    blog, figures, devices = published_figures(device, device_name)
    rows, measured = [], {}
    for configuration, item in zip(configurations, records):
        run = item["record"] or {}
        metrics = run.get("metrics") or {}
        samples = metrics.get("throughput_samples_per_s") if run.get("status") == "FINISHED" else None
        if samples is not None and configuration.role == "published":
            measured[(configuration.loader, configuration.workers)] = samples
        rows.append({"configuration": configuration.name, "status": run.get("status", "NO RECORD"),
                     "reason": run.get("reason"), "samples_per_s_per_device": samples,
                     "blog_per_device": figures.get((configuration.loader, configuration.workers))
                     if configuration.role == "published" else None,
                     "mfu": metrics.get("mfu"), "device_peak_memory_bytes": metrics.get("device_peak_memory_bytes"),
                     "device_decode_fallbacks": metrics.get("device_decode_fallbacks"),
                     "decoder_used": (run.get("facts") or {}).get("decoder_used"),
                     "method_deviations": (run.get("facts") or {}).get("method_deviations")})
    ratios = []
    for label, top, bottom in (("workers 2 / 0", ("cpu", 2), ("cpu", 0)), ("workers 1 / 0", ("cpu", 1), ("cpu", 0)),
                               ("device decode / cpu workers=2", ("device", 2), ("cpu", 2)),
                               ("dali / cpu workers=2", ("dali", 2), ("cpu", 2))):
        mine = measured[top] / measured[bottom] if top in measured and bottom in measured else None
        theirs = figures[top] / figures[bottom] if top in figures and bottom in figures else None
        if mine is not None or theirs is not None:
            ratios.append({"ratio": label, "measured": mine, "blog": theirs})
    determinism = None
    free = [r for c, r in zip(configurations, rows) if c.role == "determinism"]
    pinned = measured.get(("cpu", 2))
    if free and free[0]["samples_per_s_per_device"] and pinned:
        determinism = {"deterministic": pinned, "not_deterministic": free[0]["samples_per_s_per_device"],
                       "cost": 1 - pinned / free[0]["samples_per_s_per_device"]}
    return {"blog_device": blog, "blog_devices": devices, "rows": rows, "ratios": ratios,
            "determinism_cost": determinism}


def print_table(summary: dict[str, Any]) -> None:
    def number(value: Any, pattern: str = "{:.1f}") -> str:
        return "-" if value is None else pattern.format(value)

    blog = summary["blog_device"]
    say(f"the blog's table for this device (per device; the blog: its global samples/s / its "
        f"{summary['blog_devices']} devices, {blog or 'no published figures for this card'}):")
    say(f"  {'configuration':<48} {'samples/s':>10} {'blog':>8} {'MFU':>6} {'device GiB':>10}  status")
    for row in summary["rows"]:
        say(f"  {row['configuration']:<48} {number(row['samples_per_s_per_device']):>10} "
            f"{number(row['blog_per_device']):>8} {number(row['mfu'], '{:.1%}'):>6} "
            f"{number((row['device_peak_memory_bytes'] or 0) / 2**30 if row['device_peak_memory_bytes'] else None):>10}"
            f"  {row['status']}" + (f": {row['reason']}" if row["reason"] else ""))
    for ratio in summary["ratios"]:
        say(f"  {ratio['ratio']:<30} measured {number(ratio['measured'], '{:.2f}x'):>7}   blog "
            f"{number(ratio['blog'], '{:.2f}x')}")
    cost = summary["determinism_cost"]
    if cost:
        say(f"  deterministic kernels (the suite's default) cost {cost['cost']:.0%} against the published method's "
            f"setting ({cost['deterministic']:.1f} vs {cost['not_deterministic']:.1f} samples/s, workers=2)")


def run_inner(args: argparse.Namespace) -> int:
    """Stage 2 and 3, in the environment the check made."""
    from suite.devices.probe import probe

    family = FAMILY[args.device]
    availability = probe([args.device])[args.device]
    if not availability.available:
        say(f"FAILED: device {args.device} is not available here: {availability.reason}")
        return EXIT_UNAVAILABLE
    details = probe([args.device], precisions=True)[args.device].details  # set up once, in its own process
    say(f"device: {details}")
    supported = tuple(details.get("supported_precisions") or ("fp32",))
    precision = "bf16" if "bf16" in supported else "fp32"
    if precision != "bf16":
        say(f"{args.device} does not compute bf16 natively: the published shape runs in fp32 here (recorded)")
    dali = family == "nvidia" and _importable("nvidia.dali")
    configurations = plan_configurations(args.device, family, args.budget, args.steps, precision, dali)
    if family == "nvidia" and not dali:
        say("dali: not run (NVIDIA DALI is not installed: pip install 'suite-bench[dali-cuda<major>]')")
    out = args.output
    # MLflow where the environment has it (a store in the check's folder), else the results folders alone
    recording = ["--tracking-uri", f"sqlite:///{out.resolve()}/mlflow.db"] if mlflow_installed() else []
    for index, configuration in enumerate(configurations):  # a folder each: one failure never hides the others
        suite("run", *configuration.options, "--timeout", f"{configuration.budget_s:.0f}", "--no-progress",
              *recording, "--output", str(out / "runs" / f"{index:02d}"))
    records = collect(out, configurations)
    summary = summarize(records, configurations, args.device, details.get("device_name"))
    print_table(summary)
    report: dict[str, Any] = {"device": args.device, "details": details, "budget_s": args.budget,
                              "configurations": [asdict(c) for c in configurations], **summary}
    if family == "nvidia":
        report["nvjpeg"] = nvjpeg_rate_elsewhere()
    failed = [r for r in summary["rows"] if r["status"] != "FINISHED"]
    fell_back = [r for r in summary["rows"] if (r["device_decode_fallbacks"] or 0) > 0]
    report["failed"], report["fell_back_to_host"] = failed, fell_back
    report["passed"] = not failed and not fell_back and "error" not in report.get("nvjpeg", {})
    (out / "device-check.json").write_text(json.dumps(report, indent=2, default=str))
    say(f"report: {out / 'device-check.json'}")
    for row in failed:
        say(f"FAILED: {row['configuration']}: {row['status']}" + (f": {row['reason']}" if row["reason"] else ""))
    for row in fell_back:
        say(f"FAILED: {row['configuration']}: {row['device_decode_fallbacks']:.0f} image(s) of the check's own data "
            "decoded on the host, not on the device")
    if "error" in report.get("nvjpeg", {}):
        say(f"FAILED: nvJPEG rate: {report['nvjpeg']['error']}")
    say("PASSED" if report["passed"] else "FAILED")
    return 0 if report["passed"] else EXIT_FAILED


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def nvjpeg_rate_elsewhere() -> dict[str, Any]:
    """:func:`nvjpeg_rate` in a short-lived process (this one never opens the device)."""
    done = subprocess.run([sys.executable, __file__, "--nvjpeg-rate"], capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " ".join((done.stderr or "").split()[-30:]) or f"exit status {done.returncode}"
        return {"error": tail}
    return json.loads(lines[-1])


def nvjpeg_rate(batch: int = 64, rounds: int = 10) -> dict[str, float]:
    """nvJPEG (the suite's ``device`` decoder on NVIDIA) vs Pillow on this host, images/s, one batch of the
    synthetic JPEGs decoded ``rounds`` times after one warm-up."""
    import torch

    from suite.decoders.nvjpeg import NvJpegDecoder
    from suite.imaging import decode_to_rgb_tensor
    from suite.registry import load_device

    from workloads.bridgetower.data.synthetic import ensure_synthetic

    root = ensure_synthetic(samples=batch, seed=7)
    jpegs = [p.read_bytes() for p in sorted(root.glob("*.jpg"))][:batch]
    device = load_device("cuda")()
    device.setup()
    decoder = NvJpegDecoder(device)
    decoder(jpegs, 224, (0.5,) * 3, (0.5,) * 3)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(rounds):
        decoder(jpegs, 224, (0.5,) * 3, (0.5,) * 3)
    torch.cuda.synchronize()
    gpu = len(jpegs) * rounds / (time.perf_counter() - start)
    start = time.perf_counter()
    for data in jpegs:
        decode_to_rgb_tensor(data)
    cpu = len(jpegs) / (time.perf_counter() - start)
    return {"nvjpeg_images_per_s": round(gpu, 1), "pillow_images_per_s_one_core": round(cpu, 1),
            "batch": len(jpegs)}


# --- the command line ------------------------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("device", nargs="?", default="cuda", choices=sorted(FAMILY))
    default_out = f"suite-results/device-check-{time.strftime('%Y%m%d-%H%M%S')}"
    parser.add_argument("--output", type=Path, default=Path(os.environ.get("OUT", default_out)))
    parser.add_argument("--plan", action="store_true", help="print the environment, the torch build and every "
                                                            "configuration with its budget; change nothing")
    parser.add_argument("--use-installed-torch", action="store_true",
                        help="use the torch installed with --python (a venv seeing its packages), pinned")
    parser.add_argument("--wheelhouse", type=Path, default=None, metavar="DIR",
                        help="install only from DIR (pip --no-index), filled by scripts/wheelhouse.sh")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the environment is made from")
    parser.add_argument("--venv", type=Path, default=None, help="where the environment goes (default: OUTPUT/venv)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET", DEFAULT_BUDGET_S)),
                        metavar="SECONDS", help="device time for the configurations after installation (default: "
                                                "%(default)s); each gets an equal share, killed past it")
    parser.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "20")),
                        help="measured steps of each configuration of the published shape (default: 20)")
    parser.add_argument("--requirements", action="store_true",
                        help="print what the suite needs to run beside torch, one requirement a line (for "
                             "scripts/wheelhouse.sh), and exit")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # stage 2, in the environment
    parser.add_argument("--nvjpeg-rate", action="store_true", help=argparse.SUPPRESS)  # nvjpeg_rate_elsewhere's child
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.nvjpeg_rate:
        print(json.dumps(nvjpeg_rate()))
        return 0
    if args.inner:
        return run_inner(args)
    family = FAMILY[args.device]
    if args.requirements:
        extras = ["cuda"] if family == "nvidia" else ["gaudi"] if family == "gaudi" else []
        print("\n".join(runtime_requirements(extras)))
        return 0
    driver = read_driver(family)
    say(f"python {sys.version.split()[0]}; {driver.text()}")
    env, refusal = None, None
    try:
        env = plan_environment(args, family, driver)
    except Refused as exc:
        refusal = str(exc)
    # the plan lists DALI's configuration: it runs where the environment has DALI (said then, never a failure)
    configurations = plan_configurations(args.device, family, args.budget, args.steps, dali=family == "nvidia")
    if args.plan:
        print_plan(args, driver, env, refusal, configurations)
        return 0 if env is not None else EXIT_NO_ENVIRONMENT
    if env is None:
        say(f"FAILED: {refusal}")
        return EXIT_NO_ENVIRONMENT
    args.output.mkdir(parents=True, exist_ok=True)
    try:
        python = make_environment(env)
    except Refused as exc:
        say(f"FAILED: {exc}")
        return EXIT_NO_ENVIRONMENT
    inner = [python, str(Path(__file__).resolve()), args.device, "--inner", "--output", str(args.output.resolve()),
             "--budget", str(args.budget), "--steps", str(args.steps)]
    return subprocess.run(inner, cwd=args.output).returncode


if __name__ == "__main__":
    sys.exit(main())

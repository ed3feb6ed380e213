"""The device check behind ``scripts/device-check.sh``: one short, complete run on a GPU or Gaudi machine that cannot
pass falsely.

1. Prints the environment first (driver, CUDA or Habana stack, torch, the card), then asks whether the device is
   there, in a short-lived process (:mod:`suite.devices.probe`: this long-lived parent never opens the device, so that
   on an exclusive-process GPU or a one-card Gaudi host the runs it starts can): if not, it stops with the adapter's
   reason and exit status 3.
2. Installs the extras that match the installed torch (``cuda`` and ``dali-cuda<major>`` for an NVIDIA card, ``gaudi``
   for Gaudi2), unless ``--no-install``, with the installed torch pinned (a pip constraint): pip must never replace
   it (torchvision 0.29.1 requires torch >= 2.14, and another torch may bring another CUDA major than the DALI wheel
   chosen). Where no release matches, it stops with exit status 2 and the exact pip line that found none.
3. Runs the tiny matrix on the device: loaders cpu, cpu-fast, device and (NVIDIA) dali x workers 0, 2 x fp32, bf16,
   plus one hf-trainer configuration, and on a machine with several devices one configuration over all of them
   (``--nproc-per-node``); a configuration the device cannot run (a precision or loader it does not support) is
   refused up front, with the adapter's reason, and listed as such, never run and never counted as run.
4. ``suite compare`` (table and plots) and ``suite bench-loader``; on NVIDIA, nvJPEG's batch decode rate against
   Pillow's on this host (in its own process too).
5. Writes one JSON report (``device-check.json``) with the figures a reader asks first: samples/s per loader at 0 and
   2 workers, the on-device decode vs the best CPU loader, MFU, nvJPEG images/s; and exits 1 if any configuration
   that ran FAILED (0 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FAMILY = {"cuda": "nvidia", "h100": "nvidia", "a100": "nvidia", "gaudi2": "gaudi"}
WORKERS = (0, 2)
PRECISIONS = ("fp32", "bf16")
EXIT_UNAVAILABLE = 3
EXIT_NO_MATCHING_RELEASE = 2


def say(text: str) -> None:
    print(f"device-check: {text}", flush=True)


def command_output(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return f"{argv[0]}: not found"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    return (done.stdout or done.stderr).strip()


def environment(family: str) -> dict[str, Any]:
    """What the machine is, read before anything runs."""
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if family == "nvidia":
        env["nvidia_smi"] = command_output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                            "--format=csv,noheader"])
    else:
        env["hl_smi"] = command_output(["hl-smi", "-Q", "name,driver_version,memory.total", "-f", "csv,noheader"])
    return env


def pinned_pip_command(spec: str, constraints: Path) -> list[str]:
    """pip's command installing ``spec`` with the constraints file that pins the installed torch."""
    return [sys.executable, "-m", "pip", "install", "--quiet", "--constraint", str(constraints), spec]


def pip_install_pinned(spec: str, torch_version: str, workdir: Path) -> bool:
    """Install ``spec`` without touching the installed torch (``torch==<installed>`` as a pip constraint); first a
    dry run, so that where no release of a dependency matches that torch nothing is installed and the exact pip line
    is said. True when installed."""
    constraints = workdir / "torch-pin.txt"
    constraints.write_text(f"torch=={torch_version}\n")
    argv = pinned_pip_command(spec, constraints)
    say(f"installing {spec} with torch pinned at {torch_version} ({constraints})")
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True)
    if dry.returncode != 0:
        why = [line.strip() for line in (dry.stderr or dry.stdout).splitlines() if line.strip()]
        say(f"FAILED: no release of {spec}'s dependencies matches the installed torch {torch_version}"
            + (f" ({why[-1]})" if why else "") + "; nothing was installed. The pip line: " + " ".join(argv))
        return False
    subprocess.run(argv, check=True)
    return True


def installed_torch_version() -> str:
    """torch's version as a fresh interpreter sees it (after an install, this process still holds the old module)."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


def extras_for(family: str, torch_cuda: str | None) -> list[str]:
    """The project extras matching this machine: DALI's wheel must have the CUDA major of torch's build."""
    if family == "gaudi":
        return ["gaudi"]
    if torch_cuda is None:
        return ["cuda"]
    return ["cuda", f"dali-cuda{str(torch_cuda).split('.')[0]}"]


def plan(device: str, family: str, details: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The configurations to run and those refused up front (with the adapter's reason), from the probe's ``details``
    (``supported_precisions``, ``device_count``): nothing here opens the device."""
    from suite.registry import load_device

    adapter_cls = load_device(device)
    supported = tuple(details.get("supported_precisions") or ())
    loaders = ["cpu", "cpu-fast", "device"] + (["dali"] if family == "nvidia" else [])
    run: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for loader in loaders:
        for precision in PRECISIONS:
            for workers in WORKERS:
                config = {"loader": loader, "precision": precision, "workers": workers, "engine": "suite"}
                if precision not in supported:
                    refused.append({**config, "reason": f"{device} supports {', '.join(supported)} only"})
                elif loader not in adapter_cls.traits.supported_loaders:
                    refused.append({**config, "reason": f"{device} has no decoder for loader {loader}"})
                else:
                    run.append(config)
    trainer_precision = "bf16" if "bf16" in supported else "fp32"
    run.append({"loader": "cpu", "precision": trainer_precision, "workers": 2, "engine": "hf-trainer"})
    count = int(details.get("device_count") or 1)
    if count > 1:  # the published benchmark's shape: one configuration over every device of the machine
        run.append({"loader": "cpu", "precision": trainer_precision, "workers": 2, "engine": "suite",
                    "nproc_per_node": count})
    return run, refused


def suite(*args: str) -> int:
    argv = [sys.executable, "-m", "suite", *args]
    say(" ".join(argv[2:]))
    return subprocess.run(argv).returncode


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


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Samples/s per loader and workers (per precision), on-device decode vs the best CPU loader, MFU."""
    rows: dict[str, dict[str, float]] = {}
    mfu: dict[str, float] = {}
    for run in results.get("runs", []):
        config, metrics = run["config"], run.get("metrics") or {}
        if run.get("status") != "FINISHED" or "throughput_samples_per_s" not in metrics:
            continue
        devices = int(config.get("nproc_per_node", 1))
        key = (f"{config.get('engine', 'suite')}/{config['precision']}/nw{config['num_workers']}"
               + (f"/x{devices}" if devices > 1 else ""))
        rows.setdefault(key, {})[config["loader"]] = round(metrics["throughput_samples_per_s"], 2)
        if "mfu_bf16_peak" in metrics:
            mfu[f"{key}/{config['loader']}"] = round(metrics["mfu_bf16_peak"], 4)
    ratios: dict[str, dict[str, float]] = {}
    for key, by_loader in rows.items():
        best_cpu = max((by_loader.get(name, 0.0) for name in ("cpu", "cpu-fast")), default=0.0)
        if best_cpu > 0:
            ratios[key] = {f"{name}_vs_best_cpu_loader": round(by_loader[name] / best_cpu, 3)
                           for name in ("device", "dali") if name in by_loader}
    return {"samples_per_s": rows, "on_device_decode_vs_best_cpu_loader": ratios, "mfu_bf16_peak": mfu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("device", nargs="?", default="cuda", choices=sorted(FAMILY))
    default_out = f"suite-results/device-check-{time.strftime('%Y%m%d-%H%M%S')}"
    parser.add_argument("--output", type=Path, default=Path(os.environ.get("OUT", default_out)))
    parser.add_argument("--steps", type=int, default=int(os.environ.get("STEPS", "20")))
    parser.add_argument("--no-install", action="store_true", help="use the environment as it is")
    parser.add_argument("--nvjpeg-rate", action="store_true", help=argparse.SUPPRESS)  # nvjpeg_rate_elsewhere's child
    args = parser.parse_args(argv)
    if args.nvjpeg_rate:
        print(json.dumps(nvjpeg_rate()))
        return 0
    family = FAMILY[args.device]
    env = environment(family)
    for key, value in env.items():
        say(f"{key}: {value}")
    from suite.devices.probe import probe

    availability = probe([args.device])[args.device]
    if not availability.available:
        say(f"FAILED: device {args.device} is not available here: {availability.reason}")
        return EXIT_UNAVAILABLE
    say(f"device: {availability.details}")
    out = args.output
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_install:
        extras = extras_for(family, env["torch_cuda"])
        project = Path(__file__).resolve().parents[1]
        if not pip_install_pinned(f"{project}[{','.join(extras)}]", env["torch"], out):
            return EXIT_NO_MATCHING_RELEASE
        if installed_torch_version() != env["torch"]:
            say(f"FAILED: the install replaced torch {env['torch']} by {installed_torch_version()}")
            return EXIT_NO_MATCHING_RELEASE
    availability = probe([args.device], precisions=True)[args.device]  # set up once, in its own process
    if not availability.available:
        say(f"FAILED: device {args.device} cannot be set up: {availability.reason}")
        return EXIT_UNAVAILABLE
    to_run, refused = plan(args.device, family, availability.details)
    for item in refused:
        say(f"refused up front: {item}")
    uri = f"sqlite:///{out.resolve()}/mlflow.db"
    common = ["--device", args.device, "--steps", str(args.steps), "--warmup-steps", "3", "--tracking-uri", uri,
              "--no-progress"]
    codes = []
    for index, item in enumerate(to_run):  # one folder per configuration: one failure never hides the others
        codes.append(suite("run", *common, "--loader", item["loader"], "--workers", str(item["workers"]),
                           "--precision", item["precision"], "--engine", item["engine"],
                           "--nproc-per-node", str(item.get("nproc_per_node", 1)),
                           "--output", str(out / "runs" / f"{index:02d}")))
    results: dict[str, Any] = {"runs": []}
    for folder in sorted((out / "runs").glob("*")):
        path = folder / "results.json"
        if path.exists():
            results["runs"].extend(json.loads(path.read_text()).get("runs", []))
    suite("compare", "--experiment", "bridgetower", "--tracking-uri", uri, "--output", str(out / "compare"))
    suite("bench-loader", "--num-workers", "2", "--rounds", "2", "--output", str(out))
    report: dict[str, Any] = {"device": args.device, "environment": env, "availability": availability.details,
                              "refused_up_front": refused, "configurations": [], **summarize(results)}
    for run in results["runs"]:
        config = run["config"]
        report["configurations"].append({
            "loader": config["loader"], "num_workers": config["num_workers"], "precision": config["precision"],
            "engine": config.get("engine", "suite"), "nproc_per_node": config.get("nproc_per_node", 1),
            "status": run["status"], "reason": run.get("reason"),
            "samples_per_s": (run.get("metrics") or {}).get("throughput_samples_per_s"),
            "decoder_used": (run.get("facts") or {}).get("decoder_used"),
            "device_decode_fallbacks": (run.get("metrics") or {}).get("device_decode_fallbacks")})
    if family == "nvidia":
        try:
            report["nvjpeg"] = nvjpeg_rate_elsewhere()
        except Exception as exc:  # noqa: BLE001 - reported, and it fails the check
            report["nvjpeg"] = {"error": f"{type(exc).__name__}: {exc}"}
    bench = out / "bench-loader.json"
    if bench.exists():
        report["bench_loader"] = json.loads(bench.read_text())
    failed = [c for c in report["configurations"] if c["status"] != "FINISHED"]
    missing = len(to_run) - len(report["configurations"])
    report["failed"] = failed
    report["passed"] = not failed and missing == 0 and "error" not in report.get("nvjpeg", {})
    (out / "device-check.json").write_text(json.dumps(report, indent=2, default=str))
    say(f"report: {out / 'device-check.json'}")
    for item in failed:
        say(f"FAILED: {item}")
    if missing:
        say(f"FAILED: {missing} configuration(s) left no record")
    if "error" in report.get("nvjpeg", {}):
        say(f"FAILED: nvJPEG rate: {report['nvjpeg']['error']}")
    say("PASSED" if report["passed"] else "FAILED")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

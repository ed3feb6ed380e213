"""``suite audit --loaders``: does every loader feed the model what the reference loader feeds it?

optimum-habana's media pipe moved the training loss (their PR #256): a faster loader that changes the model's input
changes the benchmark. For the configurations of a recorded matrix, every loader the device runs is compared with
the reference preprocessing on the same images, and its first training steps with the reference loader's:

* ``loader_pixels``: the model input of the first ``--loader-images`` samples (the workload's own loader code on the
  device: :meth:`~suite.workload.Workload.loader_pixels`) against the reference preprocessing of the same files:
  max and mean absolute difference (normalized units), PSNR over the reference's range, per-channel mean and std.
  PASS when the mean absolute difference is within ``--loader-pixel-tolerance``, else FAIL (no noise here: the same
  files give the same pixels). The comparison runs in a short-lived process, as the device probe does, so that this
  process never holds the device its runs need.
* ``loader_losses``: ``--loader-steps`` training steps of each loader (fresh processes, the same seed, no warm-up)
  against the reference loader's (``cpu``): PASS when the largest relative difference of the losses is within
  ``--loader-loss-rtol``, else FAIL. A loader the device does not run is SKIP, with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Sequence

from suite.analysis.equivalence import FAIL, PASS
from suite.audit.verdicts import SKIP, Check
from suite.config import RunConfig
from suite.errors import SuiteError
from suite.registry import load_device, load_workload
from suite.run.launch import launch

if TYPE_CHECKING:
    from suite.results.store import ResultsStore
    from suite.run.launch import Progress

#: The reference loader: workers decode and preprocess as the published method does.
REFERENCE_LOADER = "cpu"
DEFAULT_PIXEL_TOLERANCE = 0.1  # mean |difference|, normalized units (DALI's resampling: 0.04-0.06 measured)
DEFAULT_LOSS_RTOL = 0.02
DEFAULT_IMAGES = 16
DEFAULT_STEPS = 5
PIXEL_TIMEOUT_S = 900.0


def pixel_figures(pixels: Any, reference: Any) -> dict[str, Any]:
    """How far a loader's model input is from the reference's (both ``(N, 3, H, W)`` float tensors)."""
    difference = (pixels - reference).abs()
    span = float(reference.max() - reference.min()) or 1.0
    mse = float((difference ** 2).mean())
    return {"max_abs": float(difference.max()), "mean_abs": float(difference.mean()),
            "psnr_db": math.inf if mse == 0 else 10 * math.log10(span ** 2 / mse),
            "channel_mean": [float(v) for v in pixels.mean(dim=(0, 2, 3))],
            "reference_channel_mean": [float(v) for v in reference.mean(dim=(0, 2, 3))],
            "channel_std": [float(v) for v in pixels.std(dim=(0, 2, 3))],
            "reference_channel_std": [float(v) for v in reference.std(dim=(0, 2, 3))]}


def _measure_here(config: RunConfig, loaders: Sequence[str], count: int) -> dict[str, Any]:
    """In this process: each loader's pixel figures, or why it cannot run here."""

    adapter = load_device(config.device)()
    adapter.setup()
    workload = load_workload(config.workload)
    out: dict[str, Any] = {}
    try:
        for loader in loaders:
            if loader not in adapter.traits.supported_loaders:
                out[loader] = {"skip": f"{config.device} does not run loader {loader}"}
                continue
            try:
                made = workload.loader_pixels(dataclasses.replace(config, loader=loader), adapter, count)
            except NotImplementedError as exc:
                out[loader] = {"skip": str(exc)}
                continue
            except SuiteError as exc:
                out[loader] = {"skip": f"cannot run here: {exc}"}
                continue
            figures = pixel_figures(made["pixels"].cpu(), made["reference"].cpu())
            out[loader] = {**figures, "images": len(made["images"])}
    finally:
        adapter.teardown()
    return out


def measure_pixels(config: RunConfig, loaders: Sequence[str], count: int) -> dict[str, Any]:
    """:func:`_measure_here` in a short-lived process (``python -m suite.audit.loaders``)."""
    argv = [sys.executable, "-m", "suite.audit.loaders", json.dumps(config.to_dict()), ",".join(loaders),
            str(count)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIXEL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SuiteError(f"the loader comparison did not finish within {PIXEL_TIMEOUT_S:g} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " ".join((done.stderr or "").split()[-40:]) or f"exit status {done.returncode}"
        raise SuiteError(f"the loader comparison failed: {tail}")
    return json.loads(lines[-1])


def pixel_check(loader: str, figures: dict[str, Any], tolerance: float) -> tuple[str, str]:
    """(verdict, detail) of one loader's pixels."""
    if "skip" in figures:
        return "SKIP", figures["skip"]
    detail = (f"{figures['images']} images: mean |difference| {figures['mean_abs']:.4f}, max {figures['max_abs']:.3f} "
              f"(normalized units; tolerance {tolerance:g}), PSNR {figures['psnr_db']:.1f} dB, channel means "
              f"{_triple(figures['channel_mean'])} vs {_triple(figures['reference_channel_mean'])}, stds "
              f"{_triple(figures['channel_std'])} vs {_triple(figures['reference_channel_std'])}")
    return (PASS if figures["mean_abs"] <= tolerance else FAIL), detail


def loss_check(losses: Sequence[float], reference: Sequence[float], rtol: float) -> tuple[str, str]:
    """(verdict, detail) of one loader's first losses against the reference loader's."""
    if len(losses) != len(reference) or not losses:
        return FAIL, f"{len(losses)} losses against the reference loader's {len(reference)}"
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True))
    detail = (f"first {len(losses)} losses, largest relative difference from the reference loader's {worst:.3g} "
              f"(tolerance {rtol:g}); {', '.join(f'{x:.5g}' for x in losses)} vs "
              f"{', '.join(f'{x:.5g}' for x in reference)}")
    return (PASS if worst <= rtol else FAIL), detail


def _triple(values: Sequence[float]) -> str:
    return "(" + ", ".join(f"{v:.3f}" for v in values) + ")"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.audit.loaders", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a configuration, as JSON")
    parser.add_argument("loaders", help="comma-separated loaders")
    parser.add_argument("count", type=int)
    args = parser.parse_args(argv)
    config = RunConfig.from_dict(json.loads(args.config))
    print(json.dumps(_measure_here(config, args.loaders.split(","), args.count)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


@dataclasses.dataclass(frozen=True)
class LoaderAudit:
    """``suite audit --loaders``: how many images and steps, and the declared tolerances."""

    images: int = DEFAULT_IMAGES
    steps: int = DEFAULT_STEPS
    pixel_tolerance: float = DEFAULT_PIXEL_TOLERANCE
    loss_rtol: float = DEFAULT_LOSS_RTOL


def loader_checks(configs: Sequence[RunConfig], store: ResultsStore, progress: Progress | None, options: LoaderAudit,
                  command: Sequence[str]) -> list[Any]:
    """For each device, precision and engine of the recorded configurations: every loader the device runs, pixels
    and first losses against the reference loader (see the module docstring)."""

    checks: list[Any] = []
    bases: dict[str, RunConfig] = {}
    for config in configs:
        base = dataclasses.replace(config, loader=REFERENCE_LOADER, steps=options.steps, warmup_steps=0,
                                   engine="suite", target_quality=None, max_steps=None, eval_every=None,
                                   prefetch_factor=config.prefetch_factor if config.num_workers else None)
        bases.setdefault(base.config_id, base)
    for base in bases.values():
        loaders = list(load_device(base.device).traits.supported_loaders)
        where = f"{base.device} {base.precision}"
        try:
            pixels = measure_pixels(base, loaders, options.images)
        except SuiteError as exc:
            checks.append(Check(where, "loader_pixels", FAIL, str(exc)))
            pixels = {}
        losses: dict[str, list[float]] = {}
        for loader in loaders:
            if loader in pixels:
                verdict, detail = pixel_check(loader, pixels[loader], options.pixel_tolerance)
                checks.append(Check(f"{where} loader={loader}", "loader_pixels", verdict, detail))
            if "skip" in pixels.get(loader, {}):
                continue
            result = launch(dataclasses.replace(base, loader=loader), store, progress, command=list(command))
            store.record(result)
            if result.status != "FINISHED":
                checks.append(Check(f"{where} loader={loader}", "loader_losses", FAIL,
                                    f"its {options.steps} steps {result.status}: {result.reason}"))
                continue
            losses[loader] = list(result.losses)
        reference = losses.get(REFERENCE_LOADER)
        for loader, values in losses.items():
            if loader == REFERENCE_LOADER:
                continue
            if reference is None:
                checks.append(Check(f"{where} loader={loader}", "loader_losses", SKIP,
                                    "the reference loader's steps did not run"))
                continue
            verdict, detail = loss_check(values, reference, options.loss_rtol)
            checks.append(Check(f"{where} loader={loader}", "loader_losses", verdict, detail))
    return checks

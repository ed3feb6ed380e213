"""``suite tune``: find the loader setting by experiment.

The reference's lesson is that the best ``dataloader_num_workers`` depends on the machine and must be
measured. ``suite tune`` runs one configuration over ``num_workers`` 0..N (N = the core count by default)
and, for N > 0, over prefetch factors, each as an ordinary recorded run of the suite (fresh process,
MLflow, results.json); then it recommends the fastest setting, unless a smaller one is *equivalent* to it within
the tolerance by the audit's equivalence test (:mod:`suite.analysis.equivalence`: the 90 % interval of the throughput
ratio, from both runs' step times, lies inside the band; fewer workers cost host RAM and cores the training step
could use). Overlapping intervals alone show no difference, not equality: they never make a setting "as good".
A contended point is never found equivalent. It plots the sweep.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from suite.analysis.equivalence import INCONCLUSIVE, PASS, ratio_test
from suite.analysis.host_ram_figures import compared_bytes
from suite.analysis.plots import finish_workers_axis, save_figure
from suite.config import MatrixSpec, RunConfig
from suite.errors import ConfigError
from suite.figures import (
    DATA_WAIT_FRACTION,
    HOST_RAM_PEAK_PSS_BYTES,
    THROUGHPUT_CI95_HIGH,
    THROUGHPUT_CI95_LOW,
    THROUGHPUT_SAMPLES_PER_S,
)
from suite.results.record import FINISHED, RunResult

MiB = 2**20


@dataclass(frozen=True)
class TunePoint:
    num_workers: int
    prefetch_factor: int | None
    status: str
    throughput_samples_per_s: float | None = None
    host_ram_peak_pss_bytes: float | None = None
    host_ram_peak_pss_anon_bytes: float | None = None  # what settings are compared by (suite.analysis.host_ram_figures)
    data_wait_fraction: float | None = None
    reason: str = ""
    ci_low: float | None = None  # 95 % interval of the throughput (block bootstrap over its steps)
    ci_high: float | None = None
    contended: bool = False  # other work used the machine during its measured window
    vs_best: str = ""  # the equivalence test against the best setting: "best", PASS, FAIL or INCONCLUSIVE, and why

    @property
    def label(self) -> str:
        return f"workers={self.num_workers}" + (f", prefetch={self.prefetch_factor}"
                                                if self.prefetch_factor is not None else "")


@dataclass(frozen=True)
class TuneOutcome:
    points: list[TunePoint]
    best: TunePoint
    recommended: TunePoint
    tolerance: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "tolerance": self.tolerance,
            "best": dataclasses.asdict(self.best),
            "recommended": dataclasses.asdict(self.recommended),
            "points": [dataclasses.asdict(p) for p in self.points],
            "rule": "smallest num_workers (then prefetch factor, then host anon RAM) not significantly slower than the "
                    "best: its 95 % throughput interval reaches the best's, or its throughput >= (1 - tolerance) x "
                    "best",
            "contended_points": [p.label for p in self.points if p.contended],
        }


def sweep_configs(spec: MatrixSpec, prefetch_factors: Sequence[int]) -> list[RunConfig]:
    """One configuration per (workers, prefetch factor); workers 0 has no prefetching, so it runs once."""
    if len(spec.devices) != 1 or len(spec.loaders) != 1 or len(spec.precisions) != 1:
        raise ConfigError("suite tune sweeps one device, loader and precision at a time")
    if not prefetch_factors or any(p < 1 for p in prefetch_factors):
        raise ConfigError(f"prefetch factors must be integers >= 1, got {list(prefetch_factors)}")
    configs = []
    for workers in sorted(spec.workers):
        for prefetch in ([None] if workers == 0 else sorted(set(prefetch_factors))):
            base = dataclasses.replace(spec, workers=(workers,), prefetch_factor=prefetch)
            configs.extend(base.expand())
    return configs


def analyse(results: Sequence[RunResult], tolerance: float) -> TuneOutcome:
    """Best and recommended settings over the finished runs; raises if none finished."""
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance must be in [0, 1), got {tolerance}")
    points, steps = [], []
    for result in results:
        config, m = result.config, result.metrics
        points.append(TunePoint(
            num_workers=config.num_workers, prefetch_factor=config.prefetch_factor, status=result.status,
            throughput_samples_per_s=m.get(THROUGHPUT_SAMPLES_PER_S),
            host_ram_peak_pss_bytes=m.get(HOST_RAM_PEAK_PSS_BYTES), host_ram_peak_pss_anon_bytes=compared_bytes(m),
            data_wait_fraction=m.get(DATA_WAIT_FRACTION), reason=result.reason or "",
            ci_low=m.get(THROUGHPUT_CI95_LOW, m.get(THROUGHPUT_SAMPLES_PER_S)),
            ci_high=m.get(THROUGHPUT_CI95_HIGH, m.get(THROUGHPUT_SAMPLES_PER_S)),
            contended=bool((result.facts.get("contention") or {}).get("contended"))))
        steps.append(list(result.facts.get("step_times_s") or []))
    finished = [i for i, p in enumerate(points) if p.status == FINISHED and p.throughput_samples_per_s is not None]
    if not finished:
        raise ConfigError("no configuration of the sweep finished; see the reasons in results.json")
    top = max(finished, key=lambda i: points[i].throughput_samples_per_s or 0.0)
    for i in finished:
        points[i] = dataclasses.replace(points[i], vs_best=_against_best(points[top], steps[top], points[i], steps[i],
                                                                         tolerance) if i != top else "best")
    best = points[top]
    good = [best] + [points[i] for i in finished if points[i].vs_best.startswith(PASS)]
    recommended = min(good, key=lambda p: (p.num_workers, p.prefetch_factor or 0,
                                           p.host_ram_peak_pss_anon_bytes or float("inf")))
    return TuneOutcome(points, best, recommended, tolerance)


def _against_best(best: TunePoint, best_steps: list[float], point: TunePoint, steps: list[float],
                  tolerance: float) -> str:
    """The equivalence test of ``point``'s throughput against the best one's: its verdict and why."""
    if best.contended or point.contended:
        return f"{INCONCLUSIVE}: measured under contention"
    if len(best_steps) < 2 or len(steps) < 2 or tolerance == 0:
        return f"{INCONCLUSIVE}: " + ("no tolerance" if tolerance == 0 else "fewer than two step times recorded")
    test = ratio_test(best_steps, steps, tolerance)
    return f"{test.verdict}: ratio {test.ratio:.3f} [{test.low:.3f}, {test.high:.3f}] to the best"


def plot(outcome: TuneOutcome, path: Path, title: str) -> Path:
    """Throughput and host RAM (anon) against num_workers, one line per prefetch factor; the pick is marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finished = [p for p in outcome.points if p.status == FINISHED and p.throughput_samples_per_s is not None]
    zero = [p for p in finished if p.num_workers == 0]
    factors = sorted({p.prefetch_factor for p in finished if p.prefetch_factor is not None})
    fig, (speed, ram) = plt.subplots(1, 2, figsize=(12, 5))
    series: list[int | None] = [*factors] or [None]
    for factor in series:
        line = sorted(zero + [p for p in finished if p.prefetch_factor == factor], key=lambda p: p.num_workers)
        label = f"prefetch_factor={factor}" if factor is not None else "workers 0"
        speed.plot([p.num_workers for p in line], [p.throughput_samples_per_s for p in line], marker="o", label=label)
        ram.plot([p.num_workers for p in line], [(p.host_ram_peak_pss_anon_bytes or float("nan")) / MiB
                                                 for p in line], marker="o", label=label)
    pick = outcome.recommended
    speed.axhline((1 - outcome.tolerance) * (outcome.best.throughput_samples_per_s or 0), color="grey",
                  linestyle=":", label=f"best - {outcome.tolerance:.0%}")
    speed.scatter([pick.num_workers], [pick.throughput_samples_per_s], s=160, facecolors="none",
                  edgecolors="red", linewidths=2, label=f"recommended: {pick.label}", zorder=5)
    workers = sorted({p.num_workers for p in outcome.points})
    finish_workers_axis(speed, "Throughput", "samples/s (measured steps)", workers, 8)
    finish_workers_axis(ram, "Host RAM peak (anonymous part of PSS, process + workers)", "MiB", workers, 8)
    fig.suptitle(title)
    save_figure(plt, fig, path)
    return path

"""Leak or plateau: the slope of a memory series over the measured window, with its interval and a verdict.

A series is (position in measured steps, bytes): the host RSS of the configuration's process tree as the runner
sampled it (time mapped onto steps), or the device allocator's current memory read after each measured step. The
slope is fitted to *block means*: the window is cut into :data:`BLOCKS` groups of consecutive samples (equal counts),
each group's mean position and mean bytes is one point, and an ordinary least-squares line through those points
gives the growth per step with a Student-t interval on ``blocks - 2`` degrees of freedom. Averaging within a block
absorbs the saw-tooth of a step's allocations and frees and most of the sample-to-sample correlation, which would
make an interval over raw samples far too narrow.

The verdict, for a declared tolerance (growth over the whole measured window within ±:data:`RELATIVE_TOLERANCE`
of the series' mean level, at least :data:`ABSOLUTE_FLOOR_BYTES`, counts as none): **plateau** only when the whole
95 % interval of the growth per step lies inside ± tolerance / measured steps; **growing** only when its lower end is
above the tolerance (a growth beyond what counts as none); **inconclusive** otherwise (noise, too few samples, memory
falling, or a growth whose interval straddles the tolerance: a heap still settling after the warm-up). With
independent normal block residuals each claim is a one-sided 2.5 % test: a growth beyond the tolerance is called a
plateau in at most 2.5 % of windows, a growth within it (a flat series included) is called growing in at most 2.5 %.
The rule is the audit's equivalence test's (:mod:`suite.analysis.equivalence`) on a growth instead of a ratio.
:func:`calibrate` measures the rates on synthetic series with correlated noise and a step saw-tooth
(docs/performance.md has the figures). A plateau bounds the growth *over the window measured*: for a longer run,
extrapolate with the interval's upper end.

A run records each series' samples as fitted (:func:`record`: ``facts.<host|device>_memory_samples``), so that an
audit fits them again (:func:`refit_differences`) and finds a verdict or a figure that was edited after the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Sequence

import numpy as np

from suite.analysis.equivalence import same_figure
from suite.figures import MEASURED_STEPS

PLATEAU, GROWING, INCONCLUSIVE = "plateau", "growing", "inconclusive"
#: Growth over the measured window counted as none: 1 % of the memory in use.
RELATIVE_TOLERANCE = 0.01
#: The smallest tolerance over a window, in bytes (page and allocator-arena granularity).
ABSOLUTE_FLOOR_BYTES = 2**20
#: Groups of consecutive samples whose means the line is fitted to.
BLOCKS = 8
#: Fewest samples a verdict is given on: two per block (with one sample per block, correlated noise is not averaged
#: and the interval is too narrow: 9 % false *growing* in :func:`calibrate` with one sample per step over 8 steps).
MIN_SAMPLES = 2 * BLOCKS
CONFIDENCE = 0.95
#: How verdicts of several series (host, device) or runs combine: the worst one wins.
_SEVERITY = {PLATEAU: 0, INCONCLUSIVE: 1, GROWING: 2}
#: The series a run records, by metric prefix, and what each measures.
SERIES = (("memory", "host"), ("device_memory", "device"))


@dataclass(frozen=True)
class Trend:
    """The fitted growth of one series and its verdict (figures ``None`` where there were too few samples)."""

    series: str
    verdict: str
    growth_per_step: float | None
    ci95_low: float | None
    ci95_high: float | None
    tolerance_per_step: float | None
    samples: int
    blocks: int
    measured_steps: int
    reason: str
    #: (position in measured steps, bytes) as fitted; recorded apart (:func:`record`), not among the trend's facts
    fitted: tuple[tuple[float, float], ...] = field(default=(), repr=False, compare=False)

    def metrics(self, prefix: str) -> dict[str, float]:
        """``<prefix>_growth_bytes_per_step`` with its ``_ci95_low``/``_ci95_high`` and the tolerance."""
        if self.growth_per_step is None or self.ci95_low is None or self.ci95_high is None:
            return {}
        return {f"{prefix}_growth_bytes_per_step": self.growth_per_step,
                f"{prefix}_growth_bytes_per_step_ci95_low": self.ci95_low,
                f"{prefix}_growth_bytes_per_step_ci95_high": self.ci95_high,
                f"{prefix}_growth_tolerance_bytes_per_step": float(self.tolerance_per_step or 0.0)}

    def facts(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "fitted"}


def verdict_of(low: float, high: float, tolerance: float) -> str:
    """The rule of the module docstring on an interval of growth per step and a tolerance per step."""
    if -tolerance <= low and high <= tolerance:
        return PLATEAU
    if low > tolerance:
        return GROWING
    return INCONCLUSIVE


def verdict_from_metrics(metrics: dict[str, float], prefix: str) -> str | None:
    """The verdict of a recorded series (``None`` where it was not recorded): read back from its metrics, so a run
    read from MLflow gets the same verdict as its results folder."""
    keys = [f"{prefix}_growth_bytes_per_step_ci95_low", f"{prefix}_growth_bytes_per_step_ci95_high",
            f"{prefix}_growth_tolerance_bytes_per_step"]
    if not all(key in metrics for key in keys):
        return None
    return verdict_of(*(float(metrics[key]) for key in keys))


def worst(verdicts: Iterable[str | None]) -> str | None:
    """Verdicts of several series or runs together: growing if any grows, plateau only if all are, else
    inconclusive; ``None`` where there is none."""
    known = [v for v in verdicts if v is not None]
    return max(known, key=_SEVERITY.__getitem__) if known else None


def recorded_verdict(facts: dict[str, Any]) -> str | None:
    """A run record's ``memory_trend`` fact, where it is one of the verdicts (an edited record's text is not shown)."""
    verdict = facts.get("memory_trend")
    return verdict if verdict in _SEVERITY else None


def describe(verdict: str | None, metrics: dict[str, float]) -> str:
    """A verdict as a table shows it: with the growth per step of each series that grows ("-" for none)."""
    if verdict is None:
        return "-"
    growing = [f"{metrics[prefix + '_growth_bytes_per_step'] / 2**20:+.2f} MiB/step {where}"
               for prefix, where in SERIES if verdict_from_metrics(metrics, prefix) == GROWING]
    return f"{verdict} ({', '.join(growing)})" if growing else verdict


def fit(positions: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, measured_steps: int,
        series: str) -> Trend:
    """The trend of ``values`` (bytes) at ``positions`` (in measured steps from the window's start)."""
    x, y = np.asarray(positions, dtype=float), np.asarray(values, dtype=float)
    fitted = tuple(zip(positions, values, strict=True))
    if len(x) < MIN_SAMPLES or measured_steps < 1:
        return Trend(series, INCONCLUSIVE, None, None, None, None, len(x), 0, measured_steps,
                     f"{len(x)} samples in the measured window: a verdict needs at least {MIN_SAMPLES}", fitted)
    order = np.argsort(x, kind="stable")
    blocks = BLOCKS
    groups = np.array_split(order, blocks)
    bx = np.array([x[g].mean() for g in groups])
    by = np.array([y[g].mean() for g in groups])
    sxx = float(((bx - bx.mean()) ** 2).sum())
    if sxx <= 0:
        return Trend(series, INCONCLUSIVE, None, None, None, None, len(x), blocks, measured_steps,
                     "every sample at the same position: no slope", fitted)
    slope = float(((bx - bx.mean()) * (by - by.mean())).sum() / sxx)
    residuals = by - (by.mean() + slope * (bx - bx.mean()))
    dof = blocks - 2
    stderr = float(np.sqrt((residuals ** 2).sum() / dof / sxx))
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + CONFIDENCE / 2, dof)) * stderr
    tolerance = max(RELATIVE_TOLERANCE * float(abs(y.mean())), ABSOLUTE_FLOOR_BYTES) / measured_steps
    verdict = verdict_of(slope - half, slope + half, tolerance)
    return Trend(series, verdict, slope, slope - half, slope + half, tolerance, len(x), blocks, measured_steps,
                 f"{CONFIDENCE:.0%} interval of the growth per step against ±{tolerance:.4g} bytes/step "
                 f"(±{RELATIVE_TOLERANCE:.0%} of {y.mean() / 2**20:.1f} MiB over {measured_steps} steps, at least "
                 f"{ABSOLUTE_FLOOR_BYTES / 2**20:g} MiB), line through {blocks} block means", fitted)


def record(trend: Trend, prefix: str, metrics: dict[str, float], facts: dict[str, Any]) -> None:
    """A series' trend into a run's record: its metrics (``<prefix>_growth_...``), its facts
    (``<where>_memory_trend``) and the samples it was fitted on (``<where>_memory_samples``, for
    :func:`refit_differences`); ``prefix`` is one of :data:`SERIES`."""
    where = dict(SERIES)[prefix]
    metrics.update(trend.metrics(prefix))
    facts[f"{where}_memory_trend"] = trend.facts()
    facts[f"{where}_memory_samples"] = {"positions": [float(p) for p, _ in trend.fitted],
                                        "bytes": [float(v) for _, v in trend.fitted]}


#: Relative difference between a recorded figure and its refit that is an inconsistency (the same samples give the
#: same figures bitwise; JSON keeps every float exactly).
REFIT_RTOL = 1e-9


@dataclass(frozen=True)
class Refit:
    """A recorded memory trend fitted again from its stored samples (:func:`refit_differences`)."""

    series: tuple[str, ...]  # the series refitted ("host", "device")
    samples: int  # in all
    missing: tuple[str, ...]  # series with a trend recorded but no samples stored (cannot be refitted)
    differences: tuple[str, ...]  # what the record says and its samples do not give


def refit_differences(metrics: dict[str, float], facts: dict[str, Any]) -> Refit | None:
    """Each recorded series fitted again from its stored samples over the record's ``measured_steps``, against the
    recorded figures, the series' verdict and the combined ``memory_trend``; ``None`` where the record has no memory
    trend at all. Malformed samples count as a difference."""
    refitted: list[str] = []
    missing: list[str] = []
    differences: list[str] = []
    verdicts: list[str] = []
    count = 0
    steps = int(metrics.get(MEASURED_STEPS, 0))
    for prefix, where in SERIES:
        trend_fact = facts.get(f"{where}_memory_trend")
        recorded_metrics = {k: v for k, v in metrics.items() if k.startswith(f"{prefix}_growth_")}
        if trend_fact is None and not recorded_metrics:
            continue
        samples = facts.get(f"{where}_memory_samples")
        if samples is None:
            missing.append(where)
            continue
        try:
            positions, values = samples["positions"], samples["bytes"]
            if len(positions) != len(values):
                raise ValueError("positions and bytes differ in length")
            again = fit([float(p) for p in positions], [float(v) for v in values], steps, where)
        except (KeyError, TypeError, ValueError) as exc:
            differences.append(f"{where} memory samples unreadable ({exc})")
            continue
        refitted.append(where)
        count += again.samples
        verdicts.append(again.verdict)
        said = trend_fact.get("verdict") if isinstance(trend_fact, dict) else None
        if said != again.verdict:
            differences.append(f"{where} memory trend is {_quoted(said)} but its {again.samples} stored samples give "
                               f"{again.verdict!r}")
        expected = again.metrics(prefix)
        for name in sorted(set(expected) | set(recorded_metrics)):
            value, want = recorded_metrics.get(name), expected.get(name)
            if value is None or want is None:
                differences.append(f"{name} is {'missing' if value is None else f'{value:.6g}'} but its stored "
                                   f"samples give {'none' if want is None else f'{want:.6g}'}")
            elif not same_figure(float(value), want, REFIT_RTOL, 1.0):
                differences.append(f"{name} is {value:.6g} but its {again.samples} stored samples give {want:.6g}")
    if not refitted and not missing and not differences and "memory_trend" not in facts:
        return None
    combined = worst(verdicts)
    if not missing and facts.get("memory_trend") != combined:
        differences.append(f"memory_trend is {_quoted(facts.get('memory_trend'))} but the refitted series give "
                           f"{combined!r}")
    return Refit(tuple(refitted), count, tuple(missing), tuple(differences))


def _quoted(value: Any) -> str:
    """A recorded value as a difference quotes it: escaped (``repr``) and cut, whatever an edit put there."""
    text = repr(value)
    return text if len(text) <= 40 else text[:36] + "...'"


def fit_timed(samples: Sequence[tuple[float, float]], window: tuple[float, float], measured_steps: int,
              series: str) -> Trend:
    """The trend of (time, bytes) samples inside ``window`` (two times on the same clock), time mapped linearly onto
    the window's measured steps."""
    start, end = window
    inside = [(t, v) for t, v in samples if start <= t <= end]
    span = end - start
    positions = [(t - start) / span * measured_steps for t, _ in inside] if span > 0 else [0.0] * len(inside)
    return fit(positions, [v for _, v in inside], measured_steps, series)


def calibrate(windows: int = 2000, steps: int = 20, samples_per_step: int = 3, level: float = 600 * 2**20,
              noise: float = 0.003, correlation: float = 0.7, sawtooth: float = 0.01, seed: int = 0) -> dict[str, Any]:
    """Error rates of :func:`fit` on synthetic windows: a flat series (a *growing* verdict is false), one growing by
    twice the tolerance over the window (a *plateau* verdict is false; *growing* is the test's power) and one growing
    by exactly the tolerance (the boundary, either claim's worst case: plateau or growing there is an error). Noise:
    AR(1) with ``correlation`` between samples and a standard deviation of ``noise`` of the level, plus a saw-tooth
    of ``sawtooth`` of the level within each step."""
    rng = np.random.default_rng(seed)
    n = steps * samples_per_step
    positions = np.arange(n) / samples_per_step
    tolerance_window = RELATIVE_TOLERANCE * level
    outcomes: dict[str, dict[str, float]] = {}
    for name, growth in (("flat", 0.0), ("boundary", tolerance_window), ("leaking", 2 * tolerance_window)):
        counts = {PLATEAU: 0, GROWING: 0, INCONCLUSIVE: 0}
        for _ in range(windows):
            shocks = rng.normal(0.0, noise * level * np.sqrt(1 - correlation ** 2), n)
            ar = np.empty(n)
            ar[0] = rng.normal(0.0, noise * level)
            for i in range(1, n):
                ar[i] = correlation * ar[i - 1] + shocks[i]
            series = level + growth * positions / steps + ar + sawtooth * level * (positions % 1.0)
            counts[fit(positions, series, steps, name).verdict] += 1
        outcomes[name] = {k: v / windows for k, v in counts.items()}
    return {"windows": windows, "steps": steps, "samples_per_step": samples_per_step, "noise": noise,
            "correlation": correlation, "sawtooth": sawtooth, "outcomes": outcomes,
            "false_growing_rate": outcomes["flat"][GROWING], "false_plateau_rate": outcomes["leaking"][PLATEAU],
            "boundary_plateau_rate": outcomes["boundary"][PLATEAU],
            "boundary_growing_rate": outcomes["boundary"][GROWING], "leak_found_rate": outcomes["leaking"][GROWING]}

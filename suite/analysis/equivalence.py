"""Is a re-run's throughput the recorded one? An equivalence test on their ratio (the TOST idea).

Throughput is samples per step over the mean step time, so the ratio re-run / recorded is ``mean(recorded step
times) / mean(re-run step times)``. Its confidence interval comes from a stationary block bootstrap of each run's
measured step times (arch's :class:`~arch.bootstrap.StationaryBootstrap`), with the mean block length chosen from
each series' own autocorrelation (Politis and White's :func:`~arch.bootstrap.optimal_block_length`), so correlated
neighbouring steps widen the interval instead of being counted as independent evidence. With repeats of the
recorded configuration, its side is the bootstrap of the repeats' throughputs (between-run variation included), and
the re-run, a single run, carries the between-run variance the repeats show on top of its own.

The verdict, for a declared tolerance ``t`` (default ±10 %): PASS only when the whole interval lies inside
``[1 - t, 1 + t]`` (both one-sided tests reject a difference beyond the band: a 90 % interval is two 5 % tests);
FAIL when it lies wholly outside the band; INCONCLUSIVE otherwise. A noisier run has a wider interval, which can only
move a verdict towards INCONCLUSIVE, never towards PASS. Contention is checked before any of this by the caller:
a contended run on either side is INCONCLUSIVE whatever the numbers.

:func:`calibrate` measures the test's error rates on synthetic step-time series with autocorrelation, drift, spikes
and between-run shifts (``suite audit --calibrate``; the README has the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
#: The declared equivalence band of a re-run's throughput: ±10 % of the recorded one.
DEFAULT_TOLERANCE = 0.10
#: Two one-sided tests at 5 % each: a 90 % interval.
CONFIDENCE = 0.90
REPLICATES = 2000


def same_figure(recorded: float, recomputed: float, rtol: float, floor: float) -> bool:
    """A recorded figure against the same figure recomputed from the record's own data (a consistency check, not a
    statistical one): equal within ``rtol`` of the recomputed value (at least of ``floor``); two NaNs agree, a NaN
    against a number does not (an edit to NaN is caught)."""
    if math.isnan(recorded) or math.isnan(recomputed):
        return math.isnan(recorded) and math.isnan(recomputed)
    return abs(recorded - recomputed) <= rtol * max(abs(recomputed), floor)


@dataclass(frozen=True)
class RatioTest:
    """The ratio re-run / recorded, its interval, the band, and the verdict."""

    ratio: float
    low: float
    high: float
    tolerance: float
    verdict: str
    method: str

    def describe(self) -> str:
        return (f"ratio re-run/recorded {self.ratio:.3f}, {CONFIDENCE:.0%} interval [{self.low:.3f}, {self.high:.3f}] "
                f"against the band [{1 - self.tolerance:.2f}, {1 + self.tolerance:.2f}] ({self.method})")


def verdict_of(low: float, high: float, tolerance: float) -> str:
    if 1 - tolerance <= low and high <= 1 + tolerance:
        return PASS
    if high < 1 - tolerance or low > 1 + tolerance:
        return FAIL
    return INCONCLUSIVE


#: Shortest series whose autocorrelation is estimated; shorter ones are resampled step by step (block length 1).
MIN_STEPS_FOR_BLOCKS = 12


def block_length(series: np.ndarray) -> float:
    """The stationary bootstrap's mean block length for ``series`` (Politis-White), at least 1 and at most a third
    of the series; 1 for a series too short (or too flat) to estimate its autocorrelation from."""
    from arch.bootstrap import optimal_block_length

    if len(series) < MIN_STEPS_FOR_BLOCKS or float(np.std(series)) == 0.0:
        return 1.0
    with np.errstate(divide="ignore", invalid="ignore"):  # arch divides by a zero variance on constant stretches
        estimate = float(optimal_block_length(series)["stationary"].iloc[0])
    if not math.isfinite(estimate):
        estimate = 1.0
    return min(max(estimate, 1.0), max(1.0, len(series) / 3))


def _bootstrap_means(series: np.ndarray, replicates: int, seed: int) -> tuple[np.ndarray, float]:
    from arch.bootstrap import StationaryBootstrap

    block = block_length(series)
    # arch annotates block_size as int, yet uses it as the mean of a geometric block length: a fractional one is meant
    bootstrap = StationaryBootstrap(block, series, seed=np.random.default_rng(seed))  # type: ignore[arg-type]
    return bootstrap.apply(lambda x: np.array([x.mean()]), replicates)[:, 0], block


def ratio_test(recorded_steps: Sequence[float] | np.ndarray, rerun_steps: Sequence[float] | np.ndarray,
               tolerance: float = DEFAULT_TOLERANCE,
               recorded_repeats: Sequence[float] | None = None, replicates: int = REPLICATES,
               seed: int = 0, samples_per_step: float | None = None) -> RatioTest:
    """The equivalence test of the re-run's throughput against the recorded one; see the module docstring.
    ``*_steps``: measured step times (s) of each run; ``recorded_repeats``: the recorded configuration's throughput
    per repeat (samples/s), when it was measured more than once: ``samples_per_step`` (the re-run's global batch)
    then turns the re-run's step times into the same unit."""
    rerun = np.asarray(rerun_steps, dtype=float)
    recorded = np.asarray(recorded_steps, dtype=float)
    if len(rerun) < 2 or len(recorded) < 2:
        raise ValueError("the equivalence test needs at least two measured steps on each side")
    rerun_means, rerun_block = _bootstrap_means(rerun, replicates, seed)
    repeats = [v for v in (recorded_repeats or []) if v == v and v > 0]
    if len(repeats) >= 2:
        if not samples_per_step:
            raise ValueError("recorded repeats are samples/s: the re-run's samples per step are needed too")
        values = np.log(np.asarray(repeats, dtype=float))
        rng = np.random.default_rng(seed + 1)
        draws = rng.choice(values, size=(replicates, len(values)), replace=True).mean(axis=1)
        between = float(np.std(values, ddof=1))  # the spread a single run has beyond its own steps
        rerun_rate = samples_per_step / rerun_means  # samples/s, as the recorded repeats
        log_ratio = np.log(rerun_rate) + rng.normal(0.0, between, replicates) - draws
        point = float(np.log(samples_per_step / rerun.mean()) - values.mean())
        method = (f"re-run: stationary bootstrap of {len(rerun)} steps (mean block {rerun_block:.1f}) plus the "
                  f"between-run spread of {len(repeats)} recorded repeats (sd {between:.3f} in log)")
        return _finish(point, log_ratio, tolerance, method, log=True)
    recorded_means, recorded_block = _bootstrap_means(recorded, replicates, seed + 1)
    ratios = recorded_means / rerun_means
    point = float(recorded.mean() / rerun.mean())
    method = (f"stationary bootstrap of the measured step times, {len(recorded)} recorded and {len(rerun)} re-run "
              f"steps (mean blocks {recorded_block:.1f} and {rerun_block:.1f}), {replicates} replicates")
    return _finish(point, ratios, tolerance, method, log=False)


def _finish(point: float, draws: np.ndarray, tolerance: float, method: str, log: bool) -> RatioTest:
    tail = (1 - CONFIDENCE) / 2
    low, high = (float(q) for q in np.quantile(draws, [tail, 1 - tail]))
    if log:
        point, low, high = math.exp(point), math.exp(low), math.exp(high)
    return RatioTest(point, low, high, tolerance, verdict_of(low, high, tolerance), method)


# --- calibration ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeriesModel:
    """Synthetic step times like the suite's: AR(1) noise on the log step time, a linear drift over the run, rare
    spikes (a loader stall), and a level shift between runs."""

    steps: int = 30
    mean_s: float = 0.05
    noise_sd: float = 0.08  # log-scale sd of a step
    ar: float = 0.5  # correlation of neighbouring steps
    drift: float = 0.04  # total relative drift over a run (a random sign per run)
    spike_rate: float = 0.02
    spike_factor: float = 3.0
    between_run_sd: float = 0.03  # log-scale shift of a whole run

    def run(self, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
        shocks = rng.normal(0.0, self.noise_sd * math.sqrt(1 - self.ar ** 2), self.steps)
        noise = np.empty(self.steps)
        noise[0] = rng.normal(0.0, self.noise_sd)
        for i in range(1, self.steps):
            noise[i] = self.ar * noise[i - 1] + shocks[i]
        drift = rng.choice([-1.0, 1.0]) * self.drift * np.linspace(0.0, 1.0, self.steps)
        level = rng.normal(0.0, self.between_run_sd)
        times = self.mean_s * scale * np.exp(noise + drift + level)
        spikes = rng.random(self.steps) < self.spike_rate
        times[spikes] *= self.spike_factor
        return times


def calibrate(pairs: int = 200, steps: int = 30, change: float = 0.30, tolerance: float = DEFAULT_TOLERANCE,
              replicates: int = 500, seed: int = 0, model: SeriesModel | None = None) -> dict[str, Any]:
    """Error rates of :func:`ratio_test` over ``pairs`` synthetic pairs: the same configuration twice (a FAIL is a
    false FAIL) and a true throughput change of ``change`` (a PASS is a false PASS)."""
    model = model or SeriesModel(steps=steps)
    rng = np.random.default_rng(seed)
    same = {PASS: 0, FAIL: 0, INCONCLUSIVE: 0}
    changed = {PASS: 0, FAIL: 0, INCONCLUSIVE: 0}
    for index in range(pairs):
        recorded = model.run(rng)
        same[ratio_test(recorded, model.run(rng), tolerance, replicates=replicates, seed=index).verdict] += 1
        slower = model.run(rng, scale=1.0 / (1.0 - change))  # throughput down by `change`
        changed[ratio_test(recorded, slower, tolerance, replicates=replicates, seed=index).verdict] += 1
    return {"pairs": pairs, "steps": model.steps, "change": change, "tolerance": tolerance,
            "model": model.__dict__ if hasattr(model, "__dict__") else {},
            "same_configuration": {k: v / pairs for k, v in same.items()},
            "true_change": {k: v / pairs for k, v in changed.items()},
            "false_fail_rate": same[FAIL] / pairs, "false_pass_rate": changed[PASS] / pairs}

"""MLPerf's scoring of time-to-train runs, and the reference convergence point (RCP) check.

Written after MLCommons' mlperf-logging 4.1.68 (``result_summarizer/result_summarizer.py`` and
``rcp_checker/rcp_checker.py``), which cannot be called for a benchmark outside its own tables:

* a run's score is ``run_stop - run_start`` of its ``mlperf.log``, in minutes; a run converged when its
  ``run_stop`` says ``success``;
* a benchmark needs :data:`REQUIRED_RUNS` runs (MLPerf: 5 for the vision benchmarks, 10 for most others); the
  score is the olympic average: sorted, the fastest dropped and the slowest, the rest averaged; at most
  :data:`MAX_NOT_CONVERGED` run may fail to converge, and it is the slowest one dropped;
* the RCP: the reference's steps to the target over its seeds give an olympic mean and a standard deviation
  (population, as MLCommons computes it); the smallest acceptable mean is the lowest mean a set of submission runs
  with the same spread may have before a one-sided two-sample t-test (alpha 0.05, equal variances) says it
  converges faster than the reference (found by bisection to 1e-4). A submission's olympic mean of steps below it
  fails the RCP check (converging faster than the reference can is not allowed); between it and the reference mean,
  the score is scaled by reference mean / submission mean (so a faster convergence does not shorten the score).
  Error rate: an implementation that truly converges like the reference fails the check in at most 5 % of
  submissions (the test's alpha), fewer where the reference spread is overestimated.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from suite.config import RunConfig
from suite.figures import STEPS_TO_TARGET
from suite.results.mlperf_log import RunInterval
from suite.results.record import RunResult

REQUIRED_RUNS = 5
MAX_NOT_CONVERGED = 1
ALPHA = 0.05
TOLERANCE = 1e-4


@dataclass(frozen=True)
class RunScore:
    """One time-to-train run as scoring sees it."""

    label: str  # where it comes from (results folder and run id, or MLflow run id)
    seed: int
    converged: bool
    minutes: float | None  # run_start -> run_stop of its log
    steps_to_target: float | None
    problem: str | None = None  # why it cannot be scored (no log, no run_stop...): said, never skipped silently


@dataclass(frozen=True)
class Rcp:
    """A reference convergence point: steps to the target over the reference's seeds."""

    steps: tuple[float, ...]
    mean: float  # olympic mean
    stdev: float  # population standard deviation of every value
    min_acceptable_mean: float
    source: str

    @property
    def max_speedup(self) -> float:
        return self.mean / self.min_acceptable_mean if self.min_acceptable_mean else math.inf


def olympic_mean(values: Sequence[float], dropped_already: int = 0, max_dropped: int = 1) -> float | None:
    """The mean after dropping the ``max_dropped`` lowest and highest values, of which ``dropped_already`` of the
    highest were dropped before (runs that did not converge); ``None`` when nothing is left."""
    ordered = sorted(values)
    kept = ordered[max_dropped:len(ordered) - (max_dropped - dropped_already)]
    return statistics.fmean(kept) if kept else None


def _faster_p_value(subm_mean: float, ref_mean: float, stdev: float, subm_n: int, ref_n: int) -> float:
    """One-sided p-value that the submission converges faster (fewer steps), two-sample t-test, equal variances."""
    from scipy import stats

    t_stat, p_value = stats.ttest_ind_from_stats(subm_mean, stdev, subm_n, ref_mean, stdev, ref_n, equal_var=True)
    return float(p_value / 2 if t_stat < 0 else 1 - p_value / 2)


def rcp_of(steps: Sequence[float], source: str, submission_runs: int = REQUIRED_RUNS) -> Rcp:
    """The RCP of a reference's steps to target (at least 3 seeds: one dropped at each end)."""
    if len(steps) < 3:
        raise ValueError(f"an RCP needs at least 3 reference runs, got {len(steps)}")
    mean = olympic_mean(steps)
    assert mean is not None
    stdev = statistics.pstdev(steps)
    kept = len(steps) - 2
    low, high = 0.0, mean
    if stdev > 0:
        while high - low > TOLERANCE:  # the lowest mean the test does not call faster
            middle = (low + high) / 2
            if _faster_p_value(middle, mean, stdev, kept, submission_runs - 2) > ALPHA:
                high = middle
            else:
                low = middle
    return Rcp(tuple(steps), mean, stdev, (low + high) / 2 if stdev > 0 else mean, source)


@dataclass(frozen=True)
class Score:
    """MLPerf's score of a set of runs of one configuration, or why there is none."""

    runs: tuple[RunScore, ...]
    minutes: float | None  # the olympic average, scaled by the RCP normalization
    unscaled_minutes: float | None
    problems: tuple[str, ...]  # what keeps the set from a score (too few runs, too many not converged...)
    rcp: Rcp | None
    rcp_verdict: str  # PASS / FAIL / NOT CHECKED: ...
    normalization: float
    submission_mean_steps: float | None


def score_runs(runs: Sequence[RunScore], rcp: Rcp | None, rcp_missing: str = "no reference for this configuration",
               required: int = REQUIRED_RUNS) -> Score:
    """Score ``runs`` (all of one configuration) the MLPerf way; per-run figures are kept whatever the outcome."""
    usable = [r for r in runs if r.problem is None]
    converged = [r for r in usable if r.converged and r.minutes is not None]
    problems = [f"{r.label}: {r.problem}" for r in runs if r.problem is not None]
    seeds = Counter(r.seed for r in usable)
    shared = sorted(seed for seed, count in seeds.items() if count > 1)
    if shared:  # one seed run twice is one run's chance counted twice (issue 49)
        problems.append(f"{sum(seeds[seed] for seed in shared)} runs share seed(s) {', '.join(map(str, shared))}: "
                        "MLPerf scores runs of distinct seeds")
    if len(usable) < required:
        problems.append(f"{len(usable)} scorable run(s) of the {required} the rules require")
    not_converged = len(usable) - len(converged)
    if not_converged > MAX_NOT_CONVERGED:
        problems.append(f"{not_converged} run(s) did not reach the target; at most {MAX_NOT_CONVERGED} may")
    unscaled = None if problems else olympic_mean([r.minutes for r in converged if r.minutes is not None],
                                                  dropped_already=not_converged)
    steps = [r.steps_to_target for r in converged if r.steps_to_target is not None]
    # the submission's steps: converged runs, one dropped at each end (a run that did not converge counts as infinite)
    subm_steps = olympic_mean(steps + [math.inf] * not_converged) if len(steps) + not_converged >= 3 else None
    normalization, verdict = 1.0, f"NOT CHECKED: {rcp_missing}"
    if rcp is not None and subm_steps is not None:
        if subm_steps >= rcp.min_acceptable_mean:
            normalization = max(1.0, rcp.mean / subm_steps)
            verdict = "PASS" + (f": faster than the reference mean, the score is scaled by {normalization:.4f}"
                                if normalization > 1 else "")
        else:
            verdict = (f"FAIL: mean steps to target {subm_steps:.1f} below the smallest acceptable mean "
                       f"{rcp.min_acceptable_mean:.1f} (reference mean {rcp.mean:.1f})")
            problems.append("the RCP check failed")
    elif rcp is not None:
        verdict = "NOT CHECKED: fewer than 3 runs with steps to target"
    minutes = None if problems or unscaled is None else unscaled * normalization
    return Score(tuple(runs), minutes, unscaled, tuple(problems), rcp, verdict, normalization, subm_steps)


def steps_band(rcp: Rcp, confidence: float = 0.95) -> tuple[float, float]:
    """Where one more run of the reference's implementation falls with probability ``confidence`` (a normal
    prediction interval from the reference's seeds: mean +- t * s * sqrt(1 + 1/n), s the sample deviation)."""
    from scipy import stats

    n = len(rcp.steps)
    mean, spread = statistics.fmean(rcp.steps), statistics.stdev(rcp.steps)
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * spread * math.sqrt(1 + 1 / n)
    return max(0.0, mean - half), mean + half


def run_score(result: RunResult, interval: RunInterval | str, label: str) -> RunScore:
    """A run's figures for scoring: its log's run_start -> run_stop (``interval``; a string says why it cannot be
    read) and steps to target; converged means run_stop says ``success``."""
    if isinstance(interval, str):
        return RunScore(label, result.config.seed, False, None, None, interval)
    converged = interval.status == "success"
    steps = result.metrics.get(STEPS_TO_TARGET) if converged else None
    return RunScore(label, result.config.seed, converged, interval.minutes, steps)


def scoring_key(config: RunConfig) -> str:
    """Runs scored together: one configuration, any seed (MLPerf scores seeded runs of one system and recipe)."""
    return dataclasses.replace(config, seed=0).config_id


def transformers_line(version: str) -> str:
    """The transformers line a version belongs to, as the quality reference keys its runs: ``transformers-5``
    (one line per major from 5 on), ``transformers-4.55`` before."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return f"transformers-{major}" if major >= 5 else f"transformers-{major}.{minor}"


def reference_rcp(data: dict[str, Any], config: RunConfig, transformers_version: str | None,
                  source: str) -> Rcp | str:
    """The RCP a quality reference (``reference/tiny_quality_reference.json``) gives for ``config``'s runs, or why
    none applies (another configuration, another transformers line, too few reference runs)."""
    reference_config = data.get("config")
    if not isinstance(reference_config, dict):
        return f"{source} records no configuration"
    if scoring_key(RunConfig.from_dict(reference_config)) != scoring_key(config):
        return f"{source} is for another configuration ({RunConfig.from_dict(reference_config).describe()})"
    if not transformers_version:
        return "the runs do not record their transformers version"
    line = transformers_line(transformers_version)
    runs = (data.get("lines") or {}).get(line, {}).get("runs", [])
    steps = [float(r[STEPS_TO_TARGET]) for r in runs if r.get("reached")]
    if len(steps) < 3:
        return f"{source} has {len(steps)} reference run(s) for {line} (an RCP needs 3 or more)"
    return rcp_of(steps, f"{source} ({line}, {len(steps)} seeds)")

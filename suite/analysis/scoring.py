"""Scoring repeated runs of one configuration, the MLPerf way.

MLPerf Training drops the fastest and the slowest of its repeated runs and averages the rest. Here the
measured quantity is throughput: with at least 3 repeats, the highest and lowest throughput are dropped
and the rest averaged; with fewer, all are averaged (and the method says so). The spread is reported as
the coefficient of variation over all repeats. A failed repeat fails the configuration's score: it is
never dropped as an outlier.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from suite.config import RunConfig
from suite.figures import THROUGHPUT_SAMPLES_PER_S
from suite.results.record import FAILED, FINISHED, RunResult

METRIC = THROUGHPUT_SAMPLES_PER_S


@dataclass(frozen=True)
class ConfigScore:
    config_id: str
    config: RunConfig
    status: str
    reason: str | None
    repeats: int
    throughput_values: tuple[float, ...]
    throughput_score: float | None
    throughput_cv: float | None
    dropped_repeats: tuple[int, ...]
    loss_digests_identical: bool
    method: str

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "config": self.config.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ConfigScore":
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**{**values, "config": RunConfig.from_dict(data["config"])})


def score_values(values: Sequence[float]) -> tuple[float, float | None, tuple[int, ...], str]:
    """MLPerf-style score of throughput values: (score, CV over all values, indices dropped, method)."""
    if not values:
        raise ValueError("score_values needs at least one value")
    order = sorted(range(len(values)), key=values.__getitem__)
    if len(values) >= 3:
        dropped: tuple[int, ...] = (order[0], order[-1])
        kept = [v for i, v in enumerate(values) if i not in dropped]
        method = "mean after dropping the highest and the lowest throughput (MLPerf-style)"
    else:
        dropped, kept = (), list(values)
        method = f"mean of all {len(values)} value(s): fewer than 3, nothing dropped"
    cv = statistics.stdev(values) / statistics.fmean(values) if len(values) >= 2 else None
    return statistics.fmean(kept), cv, dropped, method


def score_repeats(results: Sequence[RunResult]) -> ConfigScore:
    """Score the repeats (all of one configuration, in repeat order)."""
    if not results:
        raise ValueError("score_repeats needs at least one result")
    config = results[0].config
    if any(r.config != config for r in results):
        raise ValueError("score_repeats got results of different configurations")
    config_id = config.config_id
    digests_identical = len({r.loss_digest for r in results}) == 1
    failed = [r for r in results if r.status != FINISHED]
    if failed:
        first = failed[0]
        return ConfigScore(config_id, config, FAILED,
                           f"repeat {first.repeat} of {len(results)} {first.status}: {first.reason}", len(results),
                           tuple(r.metrics.get(METRIC, float("nan")) for r in results), None, None, (),
                           digests_identical, "not scored: a repeat did not finish")
    values = [r.metrics[METRIC] for r in results]
    score, cv, dropped, method = score_values(values)
    return ConfigScore(config_id, config, FINISHED, None, len(values), tuple(values), score, cv,
                       tuple(results[i].repeat for i in dropped), digests_identical, method)

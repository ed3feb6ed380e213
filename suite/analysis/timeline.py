"""Where a matrix's wall time went: inside the configurations' warm-up and measured windows, and around them."""

from __future__ import annotations

import time
from typing import Sequence

from suite.figures import EVAL_TIME_S, IN_WINDOW_FRACTION, IN_WINDOW_S, MATRIX_WALL_S, MEASURED_WALL_S, WARMUP_WALL_S
from suite.results.record import RunResult

#: The parts of a matrix's wall time (:func:`matrix_timing`), in order, with the words the timing line says them in
#: (:func:`suite.analysis.summary.timing_line`); they add up to ``matrix_wall_s``.
TIMELINE = (("before_first_s", "before the first configuration"), (IN_WINDOW_S, "in warm-up + measured windows"),
            ("evaluation_s", "evaluating"), ("setup_and_teardown_s", "setting configurations up and down"),
            ("between_configurations_s", "between configurations"), ("after_last_s", "after the last"))


def matrix_timing(results: Sequence[RunResult], started_at: float, setup_mlflow_s: float | None
                  ) -> dict[str, float]:
    """Where a matrix's wall time went: from the runner's start to now (the report, written after, is not in it),
    the part inside the configurations' warm-up and measured windows, and its share (``in_window_fraction``).

    The rest is partitioned along the runs measured here (each from its process's start of the run to its end, on
    the machine's clock; :data:`TIMELINE`): the runner's start up to the first run (imports of the first process,
    the runner's own set-up), each run's final and periodic evaluations (``eval_time_s``), the rest of each run (its
    set-up, first step, teardown and result files), the time between runs (recording a run, waiting for the next
    process: its imports where it was not started ahead) and the time after the last run (recording, scores)."""
    now = time.time()
    wall = max(1e-9, now - started_at)
    here = [r for r in results if not r.recorded_elsewhere]
    windows = sum(r.metrics.get(WARMUP_WALL_S, 0.0) + r.metrics.get(MEASURED_WALL_S, 0.0) for r in here)
    timing = {MATRIX_WALL_S: wall, IN_WINDOW_S: windows, IN_WINDOW_FRACTION: windows / wall}
    timed = sorted((r for r in here if r.started_at is not None and r.ended_at is not None
                    and started_at <= r.started_at <= r.ended_at <= now), key=lambda r: float(r.started_at or 0))
    if timed and len(timed) == len(here):
        lives = [(float(r.started_at or 0), float(r.ended_at or 0)) for r in timed]
        evaluation = sum(r.metrics.get(EVAL_TIME_S, 0.0) for r in timed)
        gaps = [later[0] - earlier[1] for earlier, later in zip(lives, lives[1:])]
        if all(gap >= 0 for gap in gaps):  # one run at a time, as run_matrix runs them
            timing.update(before_first_s=lives[0][0] - started_at, evaluation_s=evaluation,
                          setup_and_teardown_s=sum(end - start for start, end in lives) - windows - evaluation,
                          between_configurations_s=sum(gaps), after_last_s=now - lives[-1][1])
    if setup_mlflow_s is not None:
        timing["setup_mlflow_s"] = setup_mlflow_s
    return timing

"""Quality during a run: when to evaluate, what each evaluation measured, and MLPerf's time-to-train.

The workload's :meth:`~suite.workload.Workload.evaluate` runs every ``eval_every`` measured steps (every
:data:`DEFAULT_EVAL_EVERY` with a quality target) and always once at the end. Evaluations happen between steps:
the step clock is restarted after each, so evaluation time is never in a measured step; it is recorded on its
own (``eval_time_s``). With ``target_quality``, training stops at the first evaluation whose ``eval_accuracy``
reaches it: ``time_to_train_s`` is the wall time from ``run_start`` to the end of that evaluation (MLPerf's
headline) and ``steps_to_target`` the training steps taken, warm-up included. A run that stops without reaching
the target is FAILED with the best figure it reached, never a success. Under torch.distributed only rank 0
evaluates; the decision to stop is broadcast (on the host group, :mod:`suite.run.ranks`) so that every rank stops at
the same step.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from mlperf_logging.mllog import constants

from suite.config import RunConfig
from suite.errors import SuiteError
from suite.figures import EVAL_COUNT, EVAL_TIME_S, STEPS_TO_TARGET, TIME_TO_TRAIN_S
from suite.results.mlperf_log import MlperfLog
from suite.results.record import RunResult
from suite.run.ranks import HostGroup

if TYPE_CHECKING:
    from suite.workload import Workload

#: Evaluation cadence (measured steps) when a quality target is set and no --eval-every is given.
DEFAULT_EVAL_EVERY = 25


def evaluation_every(config: RunConfig) -> int | None:
    """Measured steps between evaluations: ``--eval-every``, else :data:`DEFAULT_EVAL_EVERY` with a quality target;
    ``None``: at the end of the run only."""
    return config.eval_every or (DEFAULT_EVAL_EVERY if config.target_quality is not None else None)


class QualityTargetNotReached(SuiteError):
    """The run ended (``max_steps``) without reaching its quality target."""


class QualityTracker:
    def __init__(self, config: RunConfig, workload: Workload, mlperf: MlperfLog, emit_event: Callable[..., None],
                 rank: int, host: HostGroup | None, run_started: float, global_batch: int) -> None:
        """``host``: the ranks' host group under torch.distributed (``None`` for one process)."""
        self.config, self.workload, self.mlperf, self.emit_event = config, workload, mlperf, emit_event
        self.rank, self.host, self.run_started, self.global_batch = rank, host, run_started, global_batch
        self.every = evaluation_every(config)
        self.evaluations: list[dict[str, Any]] = []
        self.eval_time_s = 0.0
        self.reached: dict[str, Any] | None = None
        self.available = True  # False once the workload says it has no evaluation

    def due(self, steps_done: int) -> bool:
        measured = steps_done - self.config.warmup_steps
        every = self.every
        return self.available and every is not None and every > 0 and measured > 0 and measured % every == 0

    def evaluate(self, steps_done: int) -> bool:
        """Evaluate now (rank 0); True when the quality target is met, on every rank."""
        stop = False
        if self.rank == 0:
            stop = self._evaluate_here(steps_done)
        if self.host is not None:
            stop = self.host.broadcast_flag(stop, src=0)
        return stop

    def _evaluate_here(self, steps_done: int) -> bool:
        samples = steps_done * self.global_batch
        self.mlperf.start(constants.EVAL_START, metadata={"samples_count": samples})
        started = time.perf_counter()
        figures = self.workload.evaluate()
        elapsed = time.perf_counter() - started
        if figures is None:
            self.mlperf.end(constants.EVAL_STOP, metadata={"samples_count": samples, "status": "no evaluation"})
            self.available = False
            if self.config.target_quality is not None:
                raise SuiteError(f"workload {self.config.workload!r} has no evaluation: a quality target cannot apply")
            return False
        self.eval_time_s += elapsed
        self.mlperf.event(constants.EVAL_ACCURACY, figures["eval_accuracy"], metadata={"samples_count": samples})
        self.mlperf.end(constants.EVAL_STOP, metadata={"samples_count": samples})
        record = {"step": steps_done, "samples_count": samples, EVAL_TIME_S: elapsed,
                  "since_run_start_s": time.monotonic() - self.run_started, **figures}
        self.evaluations.append(record)
        self.emit_event(eval_accuracy=figures["eval_accuracy"], step=steps_done, total=self.config.total_steps,
                        loss=None)
        target = self.config.target_quality
        if target is not None and self.reached is None and figures["eval_accuracy"] >= target:
            self.reached = record
            return True
        return False

    def finish(self, result: RunResult, steps_done: int) -> None:
        """The last evaluation (unless one just ran), then the figures into ``result``; raises
        :class:`QualityTargetNotReached` when a target was set and not met (after recording everything)."""
        if self.available and self.rank == 0 and (not self.evaluations or self.evaluations[-1]["step"] != steps_done):
            if self.reached is None:
                self._evaluate_here(steps_done)
        if self.rank != 0 or not self.evaluations:
            return
        last = self.evaluations[-1]
        for key, value in last.items():
            if key.startswith("eval_") and key != EVAL_TIME_S:
                result.metrics[key] = float(value)
        result.metrics[EVAL_TIME_S] = self.eval_time_s
        result.metrics[EVAL_COUNT] = float(len(self.evaluations))
        result.facts["evaluations"] = self.evaluations
        target = self.config.target_quality
        if target is None:
            return
        best = max(self.evaluations, key=lambda e: e["eval_accuracy"])
        result.facts["quality_target"] = {"metric": "eval_accuracy", "target": target,
                                          "reached": self.reached is not None, "eval_every": self.every,
                                          "best": best["eval_accuracy"], "best_step": best["step"]}
        if self.reached is not None:
            result.metrics[TIME_TO_TRAIN_S] = self.reached["since_run_start_s"]
            result.metrics[STEPS_TO_TARGET] = float(self.reached["step"])
            return
        raise QualityTargetNotReached(
            f"quality target eval_accuracy >= {target:g} not reached in {steps_done} steps (best "
            f"{best['eval_accuracy']:.4g} at step {best['step']})")

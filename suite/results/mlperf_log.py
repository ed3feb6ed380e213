"""MLPerf-format logging through MLCommons' own ``mlperf_logging.mllog``.

Each configuration's process writes ``mlperf.log`` (``:::MLLOG {json}`` lines) beside its result.
This wrapper adds what mllog leaves to the caller: values are checked to be JSON-serialisable before
logging (mllog would log an error line and drop the event), and every interval started must be ended
(:meth:`MlperfLog.close` raises on an unmatched start). The log is checked with MLCommons' compliance
checker against our ruleset, :data:`RULESET`.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlperf_logging.mllog import constants

#: The entry file of our ruleset (MLCommons' format): common rules, then the benchmark's file for the log's division,
#: found in the rules folder beside the workload's module (``mlperf_rules/<division>_<name>.yaml``).
RULESET = Path(__file__).parent / "mlperf_rules" / "common.yaml"
#: mllog intervals end with a different key than they start with.
START_OF = {constants.INIT_STOP: constants.INIT_START, constants.RUN_STOP: constants.RUN_START,
            constants.BLOCK_STOP: constants.BLOCK_START, constants.EPOCH_STOP: constants.EPOCH_START,
            constants.EVAL_STOP: constants.EVAL_START}
STOP_OF = {start: stop for stop, start in START_OF.items()}
_ids = itertools.count()


class MlperfLog:
    """An mllog logger writing to one file; ``MlperfLog(None)`` logs nothing."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._open: list[str] = []  # started intervals, innermost last
        self.write_error: str | None = None  # set when the file could not be written completely
        self._logger: logging.Logger | None = None
        self._mllog: Any = None
        self._train_samples: int | None = None
        if self.path is None:
            return
        from mlperf_logging.mllog import mllog

        self._logger = logging.getLogger(f"suite.mlperf_log.{next(_ids)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(self.path, mode="w")
        self._logger.addHandler(self._handler)
        # stack offset 2: report the caller of this wrapper as the event's file and line
        self._mllog = mllog.MLLogger(logger=self._logger, default_stack_offset=2)

    def _with_epoch(self, key: str, value: Any, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        """``epoch_num`` (MLPerf's position in the training set: samples seen / ``train_samples``) added to every
        event that carries a ``samples_count``, once ``train_samples`` has been logged."""
        if key == "train_samples" and isinstance(value, int) and value > 0:
            self._train_samples = value
        if metadata and "samples_count" in metadata and self._train_samples and "epoch_num" not in metadata:
            return {**metadata, "epoch_num": round(metadata["samples_count"] / self._train_samples, 4)}
        return metadata

    @staticmethod
    def _check(key: str, value: Any, metadata: dict[str, Any] | None) -> None:
        try:
            json.dumps({"value": value, "metadata": metadata})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"mllog event {key!r} is not JSON-serialisable: {exc}") from exc

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllog is not None:
            metadata = self._with_epoch(key, value, metadata)
            self._check(key, value, metadata)
            self._mllog.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllog is not None:
            if key in self._open:
                raise ValueError(f"mllog interval {key!r} started twice")
            metadata = self._with_epoch(key, value, metadata)
            self._check(key, value, metadata)
            self._open.append(key)
            self._mllog.start(key=key, value=value, metadata=metadata)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self._mllog is not None:
            start = START_OF.get(key, key)
            if start not in self._open:
                raise ValueError(f"mllog interval {key!r} ended without {start!r}")
            metadata = self._with_epoch(key, value, metadata)
            self._check(key, value, metadata)
            self._open.remove(start)
            self._mllog.end(key=key, value=value, metadata=metadata)

    def abort(self, reason: str) -> None:
        """End every open interval, innermost first, with status ``aborted`` and the ``reason`` (MLPerf's rules ask an
        aborted run to say why)."""
        for start in reversed(list(self._open)):
            self.end(STOP_OF.get(start, start), metadata={"status": "aborted", "reason": reason})

    def close(self) -> None:
        """Flush and close; raises if an interval was left open."""
        if self._logger is None:
            return
        self._logger.removeHandler(self._handler)
        try:
            self._handler.close()
        except OSError as exc:  # a full disk: the log is incomplete, the run itself goes on
            self.write_error = f"cannot write {self.path}: {exc.strerror or exc}"
        self._logger = self._mllog = None
        if self._open:
            raise ValueError(f"mllog intervals never ended: {', '.join(sorted(self._open))}")


#: The largest mlperf.log read (a run's own is ~10 kB; one per evaluation adds ~1 kB).
LOG_MAX_BYTES = 64 * 2**20
#: The longest ``:::MLLOG`` line handed to MLCommons' checker, whose parser costs the square of a line's length
#: (``re.sub(".*:::MLLOG ", ...)`` per line: a 200 kB line took minutes); the suite's own are under 2 kB.
LOG_MAX_LINE = 16 * 2**10
_TOKEN = ":::MLLOG "


def log_lines(log_path: str | Path) -> list[str]:
    """The lines of an mlperf.log, read as a regular file of at most :data:`LOG_MAX_BYTES` (a FIFO or a huge file
    is refused at once), decoded as MLCommons' parser decodes them (latin-1); ``ValueError`` names the file and the
    bound where it is not one to parse."""
    from suite.fileio import read_regular_file

    path = Path(log_path)
    try:
        data = read_regular_file(path, LOG_MAX_BYTES, "mlperf.log")
    except FileNotFoundError:
        raise ValueError(f"no mlperf.log at {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    lines = data.decode("latin-1").splitlines()
    for number, line in enumerate(lines, 1):
        if len(line) > LOG_MAX_LINE and _TOKEN in line:
            raise ValueError(f"{path}:{number}: an MLLOG line of {len(line):,} characters, over the limit of "
                             f"{LOG_MAX_LINE:,}: not a log the suite wrote")
    return lines


def parse_log(log_path: str | Path, ruleset: str) -> tuple[list[Any], list[tuple[str, str]]]:
    """``(loglines, errors)`` of an mlperf.log as MLCommons' ``mlp_parser.parse_file`` gives them for ``ruleset``
    (its own ``string_to_logline`` builds each line), after :func:`log_lines`' bounds; each line is cut at its last
    ``:::MLLOG`` in linear time, the same cut the parser's quadratic ``re.sub(".*:::MLLOG ")`` makes."""
    import importlib

    parser = importlib.import_module("mlperf_logging.compliance_checker.mlp_parser.ruleset_"
                                     + ruleset.replace(".", ""))
    loglines: list[Any] = []
    errors: list[tuple[str, str]] = []
    for line in log_lines(log_path):
        cut = line.rfind(_TOKEN)
        if cut < 0:
            continue
        text = line[cut:].strip()
        try:
            loglines.append(parser.string_to_logline(len(loglines) + len(errors), text))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            errors.append((text, f"{type(exc).__name__}: {exc}"))
    return loglines, errors


def check_compliance(log_path: str | Path, ruleset: str | Path = RULESET) -> tuple[bool, str]:
    """Run MLCommons' compliance checker on ``log_path`` with our ruleset; (passed, checker output). A log over
    :func:`log_lines`' bounds is refused before the checker sees it."""
    try:
        log_lines(log_path)
    except ValueError as exc:
        return False, str(exc)
    log_output = Path(log_path).with_suffix(".compliance.log")
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--config", str(Path(ruleset).resolve()),
         "--log_output", str(log_output), str(log_path)],
        capture_output=True, text=True,
    )
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


#: ``run_stop``'s reason for a run without a quality target: MLPerf's ``success`` means the target was reached.
THROUGHPUT_ONLY = ("a throughput measurement: no quality target was declared (--target-quality), so this is not a "
                   "time-to-train result")


def run_stop_metadata(config: Any) -> dict[str, str]:
    """``run_stop`` of a run that ended normally: ``success`` only where a quality target was declared (and so
    reached: a missed one fails the run), else ``aborted`` with the reason (MLPerf's meaning of the status)."""
    if config.target_quality is not None:
        return {"status": "success"}
    return {"status": "aborted", "reason": THROUGHPUT_ONLY}


def default_submission_org() -> str:
    """The MLPerf log's submission_org when none is given: ``unknown`` (a closed run must name its org)."""
    return "unknown"


def default_platform(device_facts: dict[str, Any], world_size: int) -> str:
    """The platform from the device's facts, e.g. ``8x NVIDIA H100 80GB HBM3``."""
    return f"{world_size}x {device_facts.get('device_name') or 'unknown device'}"


def log_disclosures(mlperf: MlperfLog, config: Any, device_facts: dict[str, Any], numerics: dict[str, str],
                    world_size: int, config_filename: str, recipe_deviations: list[str]) -> dict[str, Any]:
    """The submission metadata and the v6.1 disclosures MLCommons' stock ``common.yaml`` requires, from what ran;
    returns them (recorded in the run's facts). The division is ``closed`` only for a run that follows the
    workload's published recipe exactly (no deviations) and names its submitting org, whatever was asked; asking
    ``closed`` for another configuration, or without ``--submission-org``, is refused before anything runs (see
    ``suite.run.matrix.resolve``)."""
    division = "closed" if not recipe_deviations and config.submission_org else "open"  # closed: an org is named
    values = {
        constants.SUBMISSION_ORG: config.submission_org or default_submission_org(),
        constants.SUBMISSION_PLATFORM: config.submission_platform or default_platform(device_facts, world_size),
        constants.SUBMISSION_DIVISION: config.submission_division or division,
        constants.SUBMISSION_STATUS: "research",
        constants.LOWEST_NUMERICAL_PRECISION_IN_LINEAR: numerics["linear"],
        constants.LOWEST_NUMERICAL_PRECISION_IN_ATTN: numerics["attn"],
        constants.LOWEST_NUMERICAL_PRECISION_IN_COMM: numerics["comm"],
        constants.TENSOR_PARALLELISM: 1,  # data parallel only (DDP): one model replica per device
        constants.PIPELINE_PARALLELISM: 1,
        constants.CONTEXT_PARALLELISM: 1,
        constants.EXPERT_PARALLELISM: 1,
        constants.MICRO_BATCH_SIZE: config.batch_size,
        constants.CONFIG_FILENAME: config_filename,
    }
    for key, value in values.items():
        mlperf.event(key, value)
    return {**values, "recipe_deviations": recipe_deviations}


@dataclass(frozen=True)
class StockCheck:
    """What MLCommons' stock ``common.yaml`` says of a log."""

    ruleset: str
    problems: tuple[str, ...]  # failed checks and parse errors: empty means the log passes
    warnings: tuple[str, ...]
    not_applicable: tuple[str, ...]  # the division/benchmark configs common.yaml enqueues (MLPerf benchmarks only)

    @property
    def passed(self) -> bool:
        return not self.problems


def newest_training_ruleset() -> str:
    """The newest ``training_X.Y.Z`` ruleset of the installed mlperf-logging."""
    from mlperf_logging.compliance_checker import mlp_compliance

    folder = Path(mlp_compliance.__file__).parent
    versions = [p.name.split("_", 1)[1] for p in folder.iterdir() if re.fullmatch(r"training_\d+\.\d+\.\d+", p.name)]
    return max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))


def check_stock_common(log_path: str | Path, ruleset: str | None = None) -> StockCheck:
    """Check ``log_path`` with exactly the rules of MLCommons' stock ``training_<ruleset>/common.yaml`` (newest
    installed by default), through the checker's own parser and rule engine.

    ``common.yaml`` then enqueues ``<division>_common.yaml``, whose only rule accepts MLPerf's own benchmark names
    and enqueues a benchmark-specific ``<division>_<benchmark>.yaml``: neither can apply to a benchmark that is not
    an MLPerf one (for such a benchmark the checker's command line even crashes opening the missing file). Those
    enqueued configs are reported as :attr:`StockCheck.not_applicable`, never silently passed.
    """
    from mlperf_logging.compliance_checker import mlp_compliance

    ruleset = ruleset or newest_training_ruleset()
    common = Path(mlp_compliance.__file__).parent / f"training_{ruleset}" / "common.yaml"
    checker = mlp_compliance.make_checker("training", ruleset, False, False)
    loglines, errors = parse_log(log_path, ruleset)
    mlp_compliance.enqueued_configs.clear()
    try:
        checker.configured_checks(loglines, str(common))
        enqueued = tuple(mlp_compliance.enqueued_configs)
    finally:
        mlp_compliance.enqueued_configs.clear()
    problems = [f"parse error: {error}: {line}" for line, error in errors]
    problems += [*checker.overwritable.values(), *checker.not_overwritable]
    if not loglines:
        problems.append("no MLLOG lines")
    return StockCheck(ruleset, tuple(problems), tuple(checker.warnings.values()), enqueued)


@dataclass(frozen=True)
class RunInterval:
    """What MLPerf's result summarizer reads of a log: run_start and run_stop (ms) and run_stop's status."""

    start_ms: float
    stop_ms: float
    status: str

    @property
    def minutes(self) -> float:
        return (self.stop_ms - self.start_ms) / 60_000


def run_interval(log_path: str | Path, ruleset: str | None = None) -> RunInterval:
    """run_start -> run_stop of ``log_path``, read with the checker's own parser; a :class:`ValueError` saying what
    is missing or impossible (no file, no run_start, no run_stop, no status, a time that is not a finite number, a
    run_stop before its run_start)."""
    path = Path(log_path)
    loglines, _ = parse_log(path, ruleset or newest_training_ruleset())
    found = {line.key: line for line in reversed(loglines) if line.key in ("run_start", "run_stop")}
    for key in ("run_start", "run_stop"):
        if key not in found:
            raise ValueError(f"{path.name} has no {key}")
    metadata = found["run_stop"].value.get("metadata")
    status = metadata.get("status") if isinstance(metadata, dict) else None
    if not isinstance(status, str):
        raise ValueError(f"{path.name}: run_stop has no status")
    start, stop = float(found["run_start"].timestamp), float(found["run_stop"].timestamp)
    if not (math.isfinite(start) and math.isfinite(stop)):
        raise ValueError(f"{path.name}: run_start or run_stop has a time that is not a finite number")
    if stop < start:
        raise ValueError(f"{path.name}: run_stop ({stop:.0f} ms) comes before run_start ({start:.0f} ms): impossible")
    return RunInterval(start, stop, status)


def interval_or_reason(log_path: str | Path | None, missing: str) -> RunInterval | str:
    """:func:`run_interval` of ``log_path``, or why it cannot be read (``missing`` where there is no path at all):
    scoring lists the reason beside the run instead of failing the whole set."""
    if log_path is None:
        return missing
    try:
        return run_interval(log_path)
    except ValueError as exc:
        return str(exc)

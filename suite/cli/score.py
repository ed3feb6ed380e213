"""``suite score``: MLPerf's score of time-to-train runs (results folders and MLflow runs), with the RCP check."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import suite.cli.options as options
from suite.analysis.published import load_quality_reference
from suite.analysis.time_to_train import (
    REQUIRED_RUNS,
    Rcp,
    Score,
    reference_rcp,
    run_score,
    score_runs,
    scoring_key,
)
from suite.cli.display import say, warn_unusable
from suite.cli.options import looks_like_run_id
from suite.errors import SuiteError
from suite.fileio import dumps_json
from suite.results.mlperf_log import RunInterval, interval_or_reason
from suite.results.record import RunResult, distinct_runs
from suite.results.store import ResultsStore
from suite.text import visible
from suite.workload import workload_class_or_base

#: (the run, its manifest, its log's run_start -> run_stop or why not, where it comes from)
Entry = tuple[RunResult, "dict[str, Any] | None", "RunInterval | str", str]


def add_parsers(sub: Any) -> None:
    """``suite score``."""
    score = sub.add_parser(
        "score", help="MLPerf's score of time-to-train runs: the olympic average over the runs the rules require, "
                      "and the check against the reference convergence points",
        description=f"Score time-to-train runs (runs with --target-quality) the MLPerf way, one score per "
                    f"configuration over its seeds: each run's time is run_start -> run_stop of its mlperf.log; "
                    f"{REQUIRED_RUNS} runs are required, the fastest and the slowest are dropped and the rest "
                    "averaged (at most one may miss the target: it is the slowest dropped). The mean steps to "
                    "target is checked against the quality reference's (RCP); a faster convergence is scaled back. "
                    "Every run is listed with what it gave or what is missing; a set that cannot be scored ends "
                    "with one line saying why (exit 2).")
    score.add_argument("results", nargs="+", metavar="RESULTS",
                       help="results folders and/or MLflow run ids (a matrix run or one configuration run)")
    score.add_argument("--reference", default=None, metavar="NAME_OR_PATH",
                       help="the quality reference giving the RCP: a name under reference/ or a JSON file "
                            "(default: the workload's own)")
    score.add_argument("--json", action="store_true", help="the scores as JSON")
    options.add_tracking_option(score, " for MLflow run ids")
    score.set_defaults(func=cmd_score)


def _entries(args: argparse.Namespace) -> list[Entry]:
    entries: list[Entry] = []
    gateway = None
    for target in args.results:
        if Path(target).is_dir():
            store = ResultsStore(Path(target))
            results = store.results()
            warn_unusable(results, Path(target) / "results.json")
            for result in results:
                interval = interval_or_reason(store.mlperf_log_of(result), "no run folder")
                entries.append((result, store.manifest_of(result), interval, f"{target} {result.config.config_id}"))
        elif looks_like_run_id(target):
            from suite.tracking.mlflow_gateway import MlflowGateway
            from suite.tracking.reading import time_to_train_records

            gateway = gateway or MlflowGateway(args.tracking_uri)
            entries += [(result, manifest, interval, f"MLflow {result.mlflow_run_id or target}")
                        for result, manifest, interval in time_to_train_records(gateway, target)]
        else:
            raise SuiteError(f"no such results folder: {target} (nor an MLflow run id: 32 hexadecimal digits)")
    return entries


def _transformers(entries: Sequence[Entry]) -> str | None:
    versions = {str((manifest or {}).get("packages", {}).get("transformers")) for _, manifest, _, _ in entries
                if manifest and (manifest.get("packages") or {}).get("transformers")}
    return versions.pop() if len(versions) == 1 else None


def _distinct(entries: list[Entry]) -> list[Entry]:
    """Each run once, however many times its record is given (the same folder twice, a copy of it): a run scored
    twice would weigh twice in the score."""
    kept, repeated = distinct_runs([result for result, _, _, _ in entries])
    if repeated:
        say(f"suite: warning: {len(repeated)} run(s) given more than once (run uid {', '.join(repeated[:3])}"
            f"{', ...' if len(repeated) > 3 else ''}): each is scored once", file=sys.stderr)
    chosen = {id(result) for result in kept}
    return [entry for entry in entries if id(entry[0]) in chosen]


def _workloads_reference(timed: Sequence[Entry]) -> str:
    """The quality reference of the runs' workload (:attr:`suite.workload.Workload.quality_reference`)."""
    workloads = sorted({result.config.workload for result, _, _, _ in timed})
    if len(workloads) != 1:
        raise SuiteError(f"runs of several workloads ({', '.join(workloads)}): give --reference")
    reference = workload_class_or_base(workloads[0]).quality_reference
    if reference is None:
        raise SuiteError(f"workload {workloads[0]!r} publishes no quality reference (RCP): give --reference")
    return reference


def cmd_score(args: argparse.Namespace, argv: Sequence[str]) -> int:
    entries = _distinct(_entries(args))
    timed = [e for e in entries if e[0].config.target_quality is not None]
    if not timed:
        raise SuiteError(f"none of the {len(entries)} run(s) is a time-to-train run (one with --target-quality): "
                         "nothing to score")
    path, reference = load_quality_reference(args.reference or _workloads_reference(timed))
    groups: dict[str, list[Entry]] = {}
    for entry in timed:
        groups.setdefault(scoring_key(entry[0].config), []).append(entry)
    scores = []
    for members in groups.values():
        config = members[0][0].config
        rcp = reference_rcp(reference, config, _transformers(members), path.name)
        runs = [run_score(result, interval, label) for result, _, interval, label in members]
        scores.append((config, score_runs(runs, rcp if isinstance(rcp, Rcp) else None,
                                          rcp if isinstance(rcp, str) else "")))
    if args.json:
        print(dumps_json([{"config": config.to_dict(), **asdict(score)} for config, score in scores], indent=2))
    else:
        for config, score in scores:
            _print_score(config.describe(), score, len(entries) - len(timed))
    refused = [(config, score) for config, score in scores if score.minutes is None]
    if refused:
        config, score = refused[0]
        raise SuiteError(f"no MLPerf score for {config.describe()}: {'; '.join(score.problems)}"
                         + (f" (and {len(refused) - 1} more configuration(s))" if len(refused) > 1 else ""))
    return 0


def _print_score(name: str, score: Score, ignored: int) -> None:
    say(visible(f"{name} (any seed): {len(score.runs)} time-to-train run(s)"
                + (f"; {ignored} throughput run(s) left out" if ignored else "")))
    for run in sorted(score.runs, key=lambda r: r.seed):
        figures = (f"{run.minutes:.4f} min, {run.steps_to_target:.0f} steps to target" if run.converged and
                   run.minutes is not None and run.steps_to_target is not None else
                   f"{run.minutes:.4f} min, target not reached" if run.minutes is not None else "not scored")
        say(visible(f"  seed {run.seed}: {figures}" + (f" ({run.problem})" if run.problem else "")
                    + f"  [{run.label}]"))
    if score.rcp is not None:
        say(visible(f"  reference (RCP): {score.rcp.source}: mean {score.rcp.mean:.1f} steps, smallest acceptable "
                    f"mean {score.rcp.min_acceptable_mean:.1f}" + (f"; these runs: {score.submission_mean_steps:.1f}"
                                                                   if score.submission_mean_steps is not None else "")))
    say(visible(f"  RCP check: {score.rcp_verdict}"))
    if score.minutes is not None:
        say(f"  score: {score.minutes:.4f} min (olympic average of {len(score.runs)} runs: the fastest and the "
            "slowest dropped" + (f"; scaled by {score.normalization:.4f}" if score.normalization > 1 else "") + ")")

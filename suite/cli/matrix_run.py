"""Running a matrix from the command line: the spec from the options, the devices refused before anything starts, the
results folder and MLflow recorder, the report at the end, the dry run, and the exit status."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from suite.analysis.summary import timing_line
from suite.cli.display import PlainProgress, RichProgress, say, stamp
from suite.cli.tables import print_results_table, print_scores_table
from suite.config import MatrixSpec, RunConfig, param_text
from suite.devices.probe import probe
from suite.errors import ConfigError, SuiteError
from suite.fileio import check_cache_writable
from suite.meters.setup import process_started_at
from suite.redact import redact_argv, redact_uri
from suite.registry import default_workload, load_workload
from suite.results.environment import git_state, host_facts, package_versions
from suite.results.files import MatrixInfo
from suite.results.record import FINISHED, dataset_warning
from suite.results.store import ResultsStore
from suite.run.estimate import estimate, format_duration
from suite.run.matrix import resolve, run_matrix, shard_of, start_first
from suite.text import visible
from suite.tracking.stores import check_reachable, default_tracking_uri, normalize_uri, sqlite_path

if TYPE_CHECKING:
    from suite.run.matrix import MatrixOutcome
    from suite.tracking.mlflow_recorder import MlflowRecorder
    from suite.workload import Workload


def spec_from_args(args: argparse.Namespace) -> MatrixSpec:
    """The matrix the options describe. The command line's schema is the configuration's: every option of a
    :class:`MatrixSpec` field has the field's name as its destination (``tests/test_cli.py`` holds it), so the spec
    takes each field the command's parser has, and the dataclass defaults for the rest."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(MatrixSpec) if hasattr(args, f.name)}
    given["workload"] = given.get("workload") or default_workload()  # left out: the one this distribution ships
    given["preset"] = args.preset or load_workload(given["workload"]).default_preset
    return MatrixSpec.from_dict(given)


@dataclasses.dataclass
class MatrixRun:
    outcome: MatrixOutcome
    store: ResultsStore  # the results folder, still locked: the caller adds its own files, then releases it
    tracking_uri: str | None  # None: MLflow is not installed here, the folder alone holds the records
    recorder: MlflowRecorder | None  # None without MLflow
    where: dict[str, Any]


def _refuse_memory_limit(devices: Sequence[str]) -> None:
    """--memory-limit where a device's driver reserves address space far beyond what a process uses: refused."""
    from suite.registry import load_device

    for device in devices:
        if not load_device(device).traits.address_space_limit_ok:
            raise ConfigError(f"--memory-limit caps the address space (RLIMIT_AS), which the {device} driver "
                              "reserves far beyond the memory a process uses (the CUDA driver maps about twice "
                              "the GPU memory): every configuration would fail 'out of memory' falsely; leave "
                              f"--memory-limit out for device {device}")


def _say_outcome(outcome: MatrixOutcome, store: ResultsStore, recorder: MlflowRecorder | None,
                 tracking_uri: str | None, report: bool) -> dict[str, str]:
    """The tables, the time line, warnings and errors on the terminal, the report written; returns where each record
    is."""
    info, output = store.matrix_info, store.root
    print_results_table(outcome.results)
    say(timing_line(outcome.results, outcome.timing), file=sys.stderr)
    changed = dataset_warning(info.dataset_changes)  # run_matrix grouped the runs by the data they read
    if changed:
        say(f"suite: warning: {visible(changed)}", file=sys.stderr)
    if info.repeats > 1:
        print_scores_table(outcome.scores)
    where = {"results": str(store.root / "results.json"),
             **(recorder.describe() if recorder is not None else
                {"mlflow": f"not recorded (MLflow is not installed here): suite upload {output}"})}
    written = _write_report(store.root, recorder, outcome) if report else None
    if written is not None:
        where["report"] = str(written)
    for error in outcome.recorder_errors:
        say(f"suite: error: {error}\nsuite: the results folder holds every run; record them into MLflow with: "
              f"suite upload {output} --tracking-uri {redact_uri(tracking_uri or '')}", file=sys.stderr)
    if outcome.recording_error is not None:
        kept = (f"{len(outcome.results)} run(s) kept in {outcome.rescue_file}; after freeing space: "
                f"suite recover {output} --from {outcome.rescue_file}") if outcome.rescue_file else \
            "no place could take a rescue copy either: the runs are printed below as JSON"
        say(f"suite: error: {outcome.reason}; {kept}", file=sys.stderr)
        if outcome.rescue_file is None:
            print(json.dumps([r.to_dict() for r in outcome.results]))
    return where


def run_recorded(spec: MatrixSpec, configs: Sequence[RunConfig] | None, args: argparse.Namespace,
                 argv: Sequence[str], kind: str = "matrix") -> MatrixRun:
    """Run ``configs`` (default: the matrix of ``spec``) into a new results folder and MLflow; print tables.
    Everything is validated before the folder is created; the folder stays locked in the returned run."""
    started_at = getattr(args, "started_at", None) or process_started_at()
    check_cache_writable()
    workload_cls, resolved = resolve(spec)
    if configs is not None:  # same resolution (batch size from the preset) for a hand-made list
        resolved = [dataclasses.replace(c, batch_size=resolved[0].batch_size) for c in configs]
    memory_limit = getattr(args, "memory_limit", None)
    if memory_limit:
        _refuse_memory_limit(spec.devices)
    refuse_unavailable_devices(spec.devices)
    # the first configurations' processes start now: their imports overlap the checks and MLflow's set-up below
    first = start_first(resolved, getattr(args, "repeats", 1), int(memory_limit * 2**30) if memory_limit else None) \
        if getattr(args, "start_ahead", True) else []
    # MLflow's import (~1.7 s here) only now, beside those processes' imports, not before them
    from suite.tracking.mlflow_gateway import MlflowGateway, mlflow_missing
    from suite.tracking.mlflow_recorder import MlflowRecorder

    try:
        missing = mlflow_missing()
        if missing is not None and args.tracking_uri:
            raise ConfigError(f"--tracking-uri needs MLflow, which cannot be imported here ({missing}): leave it "
                              "out to record to the results folder only, then `suite upload FOLDER --tracking-uri URI` "
                              "from a machine with MLflow")
        tracking_uri = None if missing is not None else args.tracking_uri or default_tracking_uri()
        if tracking_uri is not None:
            check_reachable(tracking_uri)
        store = _create_store(spec, workload_cls, resolved, args, argv, kind, tracking_uri, memory_limit, started_at)
    except BaseException:
        for process in first:
            process.cancel()
        raise
    info, output = store.matrix_info, store.root
    try:
        recorder = None
        if tracking_uri is not None:
            recorder = MlflowRecorder(MlflowGateway(tracking_uri), args.experiment,
                                      system_metrics_interval_s=args.system_metrics_interval or None)
        else:
            say(f"suite: MLflow is not installed here ({missing}): recording to the results folder only; record it "
                f"into MLflow later, from any machine with MLflow: suite upload {output}", file=sys.stderr)
        history = _history(tracking_uri, resolved, info.repeats) if tracking_uri is not None else None
        # a live display only on a terminal: piped into a file or a CI log, each configuration's start and result
        # is a line as it happens (rich prints nothing until the end where it cannot redraw)
        display = PlainProgress() if args.no_progress or not sys.stderr.isatty() \
            else RichProgress(len(resolved) * info.repeats, history)
        say(f"suite: {len(resolved)} configuration(s) of {spec.workload}/{spec.preset} -> {output}", file=sys.stderr)
        with display:
            handed, first = first, []  # run_matrix owns them from here
            outcome = run_matrix(resolved, store, [recorder] if recorder is not None else [], display,
                                 start_ahead=getattr(args, "start_ahead", True), started_at=started_at, started=handed)
    except BaseException:
        for process in first:
            process.cancel()
        store.release()
        raise
    where = _say_outcome(outcome, store, recorder, tracking_uri, getattr(args, "report", True))
    return MatrixRun(outcome, store, tracking_uri, recorder, where)


def refuse_unavailable_devices(devices: Sequence[str]) -> None:
    """Refuse, before anything is created, a matrix naming a device that is not here: one line with the reason
    ``suite devices`` gives (asked in a short-lived process: this one must not hold the device its configuration
    processes need)."""

    absent = {name: a.reason for name, a in probe(devices).items() if not a.available}
    if absent:
        raise ConfigError("; ".join(f"device {name!r} is not available here: {reason}"
                                    for name, reason in absent.items()) + " (see suite devices)")


def _create_store(spec: MatrixSpec, workload_cls: type[Workload], resolved: Sequence[RunConfig],
                  args: argparse.Namespace, argv: Sequence[str], kind: str, tracking_uri: str | None,
                  memory_limit: float | None, started_at: float) -> ResultsStore:
    """The workload's check of its inputs, then the new results folder with the matrix's facts (locked); the matrix
    began at ``started_at`` (the process's start: its wall time counts from there)."""

    prepared = dict(workload_cls.prepare(resolved[0]))
    for warning in prepared.pop("warnings", []):
        say(f"suite: warning: {visible(warning)}", file=sys.stderr)

    when = stamp()
    node = f"-node{args.node_rank}" if spec.nnodes > 1 else ""
    output = args.output or Path("suite-results") / ((when if kind == "matrix" else f"{kind}-{when}") + node)
    tags = {f"version.{k}": v for k, v in package_versions().items()}
    tags.update({k: param_text(v) for k, v in git_state().items()})
    tags.update({f"host.{k}": param_text(v) for k, v in host_facts().items()})
    params: dict[str, Any] = {k: v for k, v in vars(spec).items()}
    params["memory_limit_gib"] = getattr(args, "memory_limit", None)
    params.update({f"prepared.{k}": v for k, v in prepared.items()})
    name = (f"{spec.workload}-{spec.preset}-{when}" if kind == "matrix" else f"{kind}-{spec.workload}-{when}") + node
    if spec.nnodes > 1:
        tags["suite.node_rank"] = str(args.node_rank)
    info = MatrixInfo(name=name, workload=spec.workload, command=["suite", *redact_argv(argv)], kind=kind,
                      repeats=getattr(args, "repeats", 1),
                      memory_limit_bytes=int(memory_limit * 2**30) if memory_limit else None,
                      experiment=args.experiment, tags=tags, params={k: param_text(v) for k, v in params.items()},
                      tracking_uri=redact_uri(normalize_uri(tracking_uri)) if tracking_uri else None,
                      matrix_id=getattr(args, "matrix_id", None),
                      shard="{}/{}".format(*args.shard) if getattr(args, "shard", None) else None,
                      started_at=started_at)
    return ResultsStore.create(output, info)


def _write_report(folder: Path, recorder: MlflowRecorder | None, outcome: MatrixOutcome) -> Path | None:
    """report.html and report.md into the results folder, attached to the MLflow matrix run; a report that cannot
    be made is a warning (the runs are recorded either way)."""
    from suite.report import mlflow_summary, write_report
    from suite.report.content import from_folder

    if not any(r.status == FINISHED and not r.recorded_elsewhere for r in outcome.results) \
            or outcome.recording_error is not None:
        return None
    try:
        content = from_folder(folder, None)  # beside the workload's own published reference
        files = write_report(content, folder)
    except SuiteError as exc:
        say(f"suite: warning: no report: {visible(exc)}", file=sys.stderr)
        return None
    if recorder is not None and recorder.parent_run_id and not outcome.recorder_errors:
        try:
            recorder.attach_report(*mlflow_summary(content), [files.html, files.markdown, *files.images])
        except Exception as exc:  # noqa: BLE001 - MLflow is optional: the report is in the folder
            say(f"suite: warning: the report is not attached to MLflow run {recorder.parent_run_id}: "
                  f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
    return files.html


def matrix_exit_status(run: MatrixRun) -> int:
    outcome = run.outcome
    return 0 if outcome.status == FINISHED and not outcome.recorder_errors and not outcome.recording_error else 1


# --- commands --------------------------------------------------------------------------------------
def _history(tracking_uri: str, configs: Sequence[RunConfig], repeats: int) -> Any:
    """The store's durations of earlier runs of these configurations (see suite.run.estimate), or None."""
    from suite.tracking.mlflow_gateway import MlflowGateway

    try:
        gateway = MlflowGateway(tracking_uri)
        return estimate(configs, gateway.finished_durations([c.config_id for c in configs]), repeats,
                        gateway.matrix_overheads())
    except SuiteError:
        return None


def shard_and_matrix_id(spec: MatrixSpec, args: argparse.Namespace) -> list[RunConfig] | None:
    """This invocation's shard of the matrix (``--shard I/N``; ``None`` without it), and the matrix id that the
    shards, or the nodes of a multi-node matrix, share (``args.matrix_id``, derived where not given)."""

    if spec.nnodes == 1 and args.shard is None:
        return None
    configs = resolve(spec)[1]
    if spec.nnodes > 1 and not args.matrix_id:  # the nodes' matrix runs share one id: the same options, the same id
        import hashlib

        identity = json.dumps([spec.rdzv_endpoint, sorted(c.config_id for c in configs)])
        args.matrix_id = f"nodes-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    if args.shard is None:
        return None
    if not args.matrix_id:
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        if not job:
            raise ConfigError("--shard needs --matrix-id ID, the same for every shard of the matrix (in a Slurm array "
                              "job it defaults to slurm-$SLURM_ARRAY_JOB_ID)")
        args.matrix_id = f"slurm-{job}"
    return shard_of(configs, *args.shard)


def dry_run(spec: MatrixSpec, args: argparse.Namespace, configs: Sequence[RunConfig] | None = None) -> int:
    """What ``suite run`` would do, created nothing: the configurations, the folder, the store, the duration."""

    configs = list(configs) if configs is not None else resolve(spec)[1]
    repeats = getattr(args, "repeats", 1)
    tracking_uri = args.tracking_uri or default_tracking_uri()
    output = args.output or Path("suite-results") / "<time of the run>"
    try:
        check_reachable(tracking_uri)
    except SuiteError as exc:  # said below, as suite run would say it; no history to read
        history, store_note = None, f" (suite run would refuse it: {exc})"
    else:
        history = _history(tracking_uri, configs, repeats)
        store_note = "" if history is not None else " (its history could not be read: no estimate)"
    history = history or estimate(configs, {}, repeats)
    shard = f" (shard {args.shard[0]}/{args.shard[1]} of matrix {args.matrix_id})" if args.shard else ""
    print(f"dry run of {len(configs)} configuration(s){shard} x {repeats} repeat(s) of {spec.workload}/{spec.preset}, "
          f"batch {configs[0].batch_size}, {spec.steps} measured + {spec.warmup_steps} warm-up steps; nothing is "
          "created")
    availability = probe(sorted({c.device for c in configs}))
    for config in configs:
        seconds, runs = history.per_config[config.config_id], history.history[config.config_id]
        when = f"{format_duration(seconds)} (median of {runs} earlier run(s))" if seconds is not None else "unknown"
        absent = availability[config.device]
        print(f"  {config.describe():<70} {config.config_id}  {when}"
              + ("" if absent.available else f"  [device unavailable here: {absent.reason}]"))
    unavailable = sorted(name for name, a in availability.items() if not a.available)
    if unavailable:
        print(f"suite run would refuse this matrix: device(s) {', '.join(unavailable)} not available here")
    database = sqlite_path(tracking_uri)
    print(f"output: {output}" + (" (exists: suite run would refuse it)" if args.output and output.exists() else ""))
    print(f"store: {redact_uri(tracking_uri)}" + (" (not there yet: suite run creates it)" if database is not None
                                      and not database.is_file() else "") + store_note)
    print(f"estimated duration: {history.total_text()}")
    return 0


def matrix_size(args: argparse.Namespace) -> int:
    size = getattr(args, "repeats", 1)
    for axis in ("devices", "workers", "loaders", "precisions", "engines"):
        size *= len(getattr(args, axis, None) or (None,))
    return size

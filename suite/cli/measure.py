"""Commands that measure: ``suite run``, ``suite tune``, ``suite bench-loader``, ``suite bench-overhead``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import suite.cli.options as options
from suite.analysis.summary import timing_line
from suite.cli.display import (
    PlainProgress,
    RichProgress,
    print_results_table,
    print_scores_table,
    print_tune_table,
    stamp,
)
from suite.config import FILE_RUN_OPTIONS, TOKENIZER_MODES, MatrixSpec, RunConfig, load_config_file, param_text
from suite.errors import ConfigError, SuiteError
from suite.fileio import write_json_atomic
from suite.results.record import FINISHED, dataset_warning
from suite.text import visible


# --- parsers ---------------------------------------------------------------------------------------
def add_parsers(sub: Any) -> None:
    run = sub.add_parser("run", help="run a benchmark matrix and record it in MLflow and a results folder",
                         description="Run every configuration of the matrix device x workers x loader x precision x "
                                     "engine, each in a fresh process, and record it in a results folder "
                                     "(results.json, one folder per run) and MLflow.")
    run.add_argument("--config", type=Path, default=None, metavar="FILE",
                     help="JSON or TOML file with matrix fields (workload, preset, devices, workers, loaders, "
                          "precisions, engines, steps, warmup_steps, seed, batch_size, dataset, weights, "
                          "skip_bad_samples, nproc_per_node, nnodes, rdzv_endpoint, prefetch_factor, max_image_pixels, "
                          "max_image_bytes, max_caption_bytes, loader_memory_gib, allow_outside_links, timeout_s, "
                          "loader_timeout_s, "
                          "eval_every, "
                          "target_quality, max_steps, submission_org, submission_platform, submission_division, "
                          "clear_caches) and "
                          f"{', '.join(FILE_RUN_OPTIONS)}; options given on the command line win")
    options.add_configuration_options(run, matrix=True)
    run.add_argument("--nproc-per-node", type=options.int_at_least(1), default=1,
                     help="processes (devices) per configuration, launched with torchrun over the device's "
                          "distributed backend (gloo on CPU, nccl, hccl): global batch = batch size x N, global "
                          "throughput over the slowest rank, host RAM summed over ranks (default: 1)")
    run.add_argument("--nnodes", type=options.int_at_least(1), default=1,
                     help="nodes per configuration: start the same `suite run` on every node with --rdzv-endpoint; "
                          "torchrun meets at it (c10d rendezvous) for each configuration, global batch = batch size x "
                          "nproc-per-node x nnodes, and the node that holds global rank 0 records the run (host RAM: "
                          "that node's) (default: 1)")
    run.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                     help="with --nnodes > 1: where the nodes' torchrun meet, the same on every node (e.g. the first "
                          "node's address and a free port)")
    run.add_argument("--node-rank", type=options.non_negative_int, default=0,
                     help="with --nnodes > 1: this node's number, for its records and its results folder (torchrun's "
                          "rendezvous assigns the ranks)")
    run.add_argument("--prefetch-factor", type=options.int_at_least(1), default=None,
                     help="batches each loader worker prepares ahead (default: torch's, 2); see `suite tune`")
    run.add_argument("--repeats", type=options.int_at_least(1), default=1,
                     help="run each configuration N times, each in a fresh process, and score it the MLPerf way "
                          "(drop the highest and lowest throughput, mean of the rest; spread as CV) (default: 1)")
    run.add_argument("--memory-limit", type=options.positive_float, default=None, metavar="GIB",
                     help="cap each configuration's address space (its process and loader workers) at GIB GiB; "
                          "a configuration that needs more fails with the reason, and the matrix goes on")
    run.add_argument("--skip-bad-samples", action="store_true",
                     help="leave out samples whose image cannot be decoded (found by decoding every image once) "
                          "and record their count (metric skipped_samples) and names; default: a bad sample "
                          "fails the configuration, naming the file")
    run.add_argument("--weights", default=None,
                     help="pretrained checkpoint (local path or hub id); default: random init of the preset")
    run.add_argument("--tokenizer", choices=TOKENIZER_MODES, default="auto",
                     help="for a preset built on a checkpoint's tokenizer (large), without --weights: auto uses it "
                          "when it is on this machine (hub cache), else a local stand-in with the same vocabulary "
                          "size, length and padding (recorded as such; nothing fetched); hub insists on the real "
                          "one, fetched if needed (default: %(default)s)")
    options.add_output_option(run, "./suite-results/<time>; a new folder, never one holding results")
    options.add_recording_options(run)
    run.add_argument("--shard", type=options.shard, default=None, metavar="I/N",
                     help="run only shard I (from 0) of N of the expanded matrix: every N-th configuration in the "
                          "order of their ids, so the shards of a Slurm array or Kubernetes indexed Job cover the "
                          "matrix exactly once whatever order the options list; needs --matrix-id (or "
                          "$SLURM_ARRAY_JOB_ID)")
    run.add_argument("--matrix-id", default=None, metavar="ID",
                     help="the id every shard of one matrix shares: MLflow tag suite.matrix_id, so `suite compare` "
                          "and `suite report` of any shard's matrix run see the whole matrix (default with --shard: "
                          "slurm-$SLURM_ARRAY_JOB_ID in a Slurm array job)")
    run.add_argument("--report", action=argparse.BooleanOptionalAction,
                     default=os.environ.get("SUITE_REPORT", "1").lower() not in ("0", "false", "no", "off"),
                     help="write report.html / report.md into the results folder and attach them to the MLflow "
                          "matrix run (default: on; $SUITE_REPORT=0 turns it off; a few seconds per matrix)")
    run.add_argument("--start-ahead", action=argparse.BooleanOptionalAction, default=True,
                     help="start each configuration's (fresh) process ahead of its turn, once the configuration before "
                          "has done its measured steps and evaluation, so its imports overlap that one's exit and "
                          "recording instead of adding to the matrix (default: on)")
    run.add_argument("--dry-run", action="store_true",
                     help="print the expanded matrix (a line per configuration with its id), the output folder, the "
                          "store and the estimated duration (from earlier runs of the same configurations in the "
                          "store); create nothing")
    run.set_defaults(func=cmd_run)

    tune = sub.add_parser(
        "tune", help="find the smallest dataloader_num_workers / prefetch factor equivalent to the best",
        description="Run one configuration over dataloader_num_workers 0..--max-workers and, for workers > 0, "
                    "each --prefetch-factors value (each a recorded run, as `suite run`), recommend the fastest "
                    "setting unless a smaller one is equivalent to it within --tolerance (the 90 % interval of "
                    "their throughput ratio, from both runs' step times, inside the band: the audit's test; a "
                    "busy-host point never is), and plot throughput and host PSS "
                    "(tune.png, tune.json in the results folder; logged to the MLflow tune run with the pick as "
                    "tags).")
    options.add_configuration_options(tune, matrix=False, steps_default=20)
    tune.add_argument("--max-workers", type=options.non_negative_int, default=None,
                      help="largest num_workers tried (default: the core count)")
    tune.add_argument("--prefetch-factors", type=options.parse_list(options.int_at_least(1), "prefetch factors"),
                      default=(2,), help="prefetch factors tried for workers > 0, comma-separated (default: 2, "
                                         "torch's)")
    tune.add_argument("--tolerance", type=options.float_above(0.0, inclusive=True), default=0.10,
                      help="the equivalence band, a fraction of the best throughput (default: %(default)s; 0: always "
                           "the fastest)")
    options.add_output_option(tune, "./suite-results/tune-<time>")
    options.add_recording_options(tune)
    tune.set_defaults(func=cmd_tune)

    bench = sub.add_parser(
        "bench-loader", help="the reference input pipeline vs ours (closed: same output; open: PSNR) in one run",
        description="Measure the workload's image input pipelines side by side on the same images in one run: "
                    "images/s per worker and end-to-end batches/s through a DataLoader, in interleaved rounds; "
                    "ratios to the reference pipeline and fidelity (closed: max deviation, open: PSNR).")
    bench.add_argument("--workload", default=options.DEFAULT_WORKLOAD)
    bench.add_argument("--dataset", default=None, help="as `suite run` (default: synthetic)")
    bench.add_argument("--images", type=options.int_at_least(1), default=480, help="images per pass (default: 480)")
    bench.add_argument("--image-size", type=options.int_at_least(8), default=294,
                       help="output side (default: 294, the published recipe's)")
    bench.add_argument("--batch-size", type=options.int_at_least(1), default=48, help="default: 48, the reference's")
    bench.add_argument("--num-workers", type=options.non_negative_int, default=None,
                       help="default: the core count")
    bench.add_argument("--rounds", type=options.int_at_least(1), default=3,
                       help="interleaved rounds; figures are medians over them (default: 3)")
    bench.add_argument("--train-steps", type=options.non_negative_int, default=200,
                       help="also train the tiny preset this many steps with the closed and the open pipelines and "
                            "compare the quality reached (eval_accuracy); 0: skip (default: %(default)s)")
    bench.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    options.add_output_option(bench, "none; with a folder, the figures go to DIR/bench-loader.json")
    bench.set_defaults(func=cmd_bench_loader)

    overhead = sub.add_parser(
        "bench-overhead", help="the suite's step time with every tracker on vs a bare hand-written loop",
        description="Train one configuration in one process, alternating blocks of steps of a bare hand-written "
                    "loop and of the suite's own step loop with every tracker on (synchronized step timer, "
                    "MLPerf log, host RAM sampler in a separate process, MLflow system metrics). The overhead "
                    "is measured by decomposition: the suite's per-step code timed where it runs, over the bare "
                    "step time, plus the tracker process's CPU share of the machine; mean and 95 % interval over "
                    "the blocks, with the paired suite-over-bare step time ratio as a cross-check. Also measures "
                    "the host RAM sampler's own cost.")
    options.add_configuration_options(overhead, matrix=False, steps_default=10)
    overhead.add_argument("--workers", type=options.non_negative_int, default=0,
                          help="dataloader_num_workers (default: 0)")
    overhead.add_argument("--blocks", type=options.int_at_least(1), default=6,
                          help="blocks of each kind, alternating (default: 6)")
    overhead.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    options.add_output_option(overhead, "none; with a folder, the figures go to DIR/bench-overhead.json")
    overhead.set_defaults(func=cmd_bench_overhead)


# --- shared ----------------------------------------------------------------------------------------
def merge_config_file(args: argparse.Namespace, argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options over the config file's fields over the defaults."""
    if getattr(args, "config", None) is None:
        return args
    parser = argparse.ArgumentParser(prog="suite")  # this module's commands, options left out where not given
    add_parsers(parser.add_subparsers(dest="command"))
    for parsers in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):  # no public accessor
        for action in parsers.choices["run"]._actions:
            action.default = argparse.SUPPRESS
    given = vars(parser.parse_args(argv))
    merged = vars(args).copy()
    for name, value in load_config_file(args.config).items():
        if name not in given:
            merged[name] = value
    return argparse.Namespace(**merged)


def spec_from_args(args: argparse.Namespace) -> MatrixSpec:
    from suite.registry import load_workload

    preset = args.preset or load_workload(args.workload).default_preset
    return MatrixSpec.from_dict(dict(
        workload=args.workload, preset=preset, devices=args.devices, workers=args.workers,
        loaders=args.loaders, precisions=args.precisions, engines=getattr(args, "engines", ("suite",)),
        steps=args.steps, warmup_steps=args.warmup_steps, seed=args.seed, batch_size=args.batch_size,
        dataset=args.dataset, weights=getattr(args, "weights", None), tokenizer=getattr(args, "tokenizer", "auto"),
        skip_bad_samples=getattr(args, "skip_bad_samples", False),
        nproc_per_node=getattr(args, "nproc_per_node", 1), prefetch_factor=getattr(args, "prefetch_factor", None),
        nnodes=getattr(args, "nnodes", 1), rdzv_endpoint=getattr(args, "rdzv_endpoint", None),
        max_image_pixels=args.max_image_pixels, max_image_bytes=args.max_image_bytes,
        max_caption_bytes=getattr(args, "max_caption_bytes", None),
        loader_memory_gib=getattr(args, "loader_memory_gib", None),
        allow_outside_links=args.allow_outside_links, timeout_s=args.timeout_s, loader_timeout_s=args.loader_timeout_s,
        eval_every=args.eval_every, target_quality=args.target_quality, max_steps=args.max_steps,
        submission_org=args.submission_org, submission_platform=args.submission_platform,
        submission_division=args.submission_division, clear_caches=args.clear_caches))


@dataclasses.dataclass
class MatrixRun:
    outcome: Any
    store: Any  # the results folder, still locked: the caller adds its own files, then releases it
    tracking_uri: str
    recorder: Any
    where: dict[str, Any]


def run_recorded(spec: MatrixSpec, configs: Sequence[RunConfig] | None, args: argparse.Namespace,
                 argv: Sequence[str], kind: str = "matrix") -> MatrixRun:
    """Run ``configs`` (default: the matrix of ``spec``) into a new results folder and MLflow; print tables.
    Everything is validated before the folder is created; the folder stays locked in the returned run."""
    from suite.meters.setup import process_started_at
    from suite.run.matrix import resolve, run_matrix, start_first
    from suite.tracking.mlflow_gateway import MlflowGateway, check_reachable, default_tracking_uri
    from suite.tracking.mlflow_recorder import MlflowRecorder

    started_at = getattr(args, "started_at", None) or process_started_at()
    workload_cls, resolved = resolve(spec)
    if configs is not None:  # same resolution (batch size from the preset) for a hand-made list
        resolved = [dataclasses.replace(c, batch_size=resolved[0].batch_size) for c in configs]
    memory_limit = getattr(args, "memory_limit", None)
    if memory_limit:
        from suite.registry import load_device

        for device in spec.devices:
            if not load_device(device).address_space_limit_ok:
                raise ConfigError(f"--memory-limit caps the address space (RLIMIT_AS), which the {device} driver "
                                  "reserves far beyond the memory a process uses (the CUDA driver maps about twice "
                                  "the GPU memory): every configuration would fail 'out of memory' falsely; leave "
                                  f"--memory-limit out for device {device}")
    refuse_unavailable_devices(spec.devices)
    # the first configurations' processes start now: their imports overlap the checks and MLflow's set-up below
    first = start_first(resolved, getattr(args, "repeats", 1), int(memory_limit * 2**30) if memory_limit else None) \
        if getattr(args, "start_ahead", True) else []
    try:
        tracking_uri = args.tracking_uri or default_tracking_uri()
        check_reachable(tracking_uri)
        store = _create_store(spec, workload_cls, resolved, args, argv, kind, tracking_uri, memory_limit)
    except BaseException:
        for process in first:
            process.cancel()
        raise
    info, output = store.matrix_info, store.root
    try:
        recorder = MlflowRecorder(MlflowGateway(tracking_uri), args.experiment,
                                  system_metrics_interval_s=args.system_metrics_interval or None)
        display = PlainProgress() if args.no_progress else RichProgress(len(resolved) * info.repeats,
                                                                        _history(tracking_uri, resolved, info.repeats))
        print(f"suite: {len(resolved)} configuration(s) of {spec.workload}/{spec.preset} -> {output}", file=sys.stderr)
        with display:
            handed, first = first, []  # run_matrix owns them from here
            outcome = run_matrix(resolved, store, [recorder], display, start_ahead=getattr(args, "start_ahead", True),
                                 started_at=started_at, started=handed)
    except BaseException:
        for process in first:
            process.cancel()
        store.release()
        raise
    print_results_table(outcome.results)
    print(timing_line(outcome.results, outcome.timing), file=sys.stderr)
    changed = dataset_warning(info.dataset_changes)  # run_matrix grouped the runs by the data they read
    if changed:
        print(f"suite: warning: {visible(changed)}", file=sys.stderr)
    if info.repeats > 1:
        print_scores_table(outcome.scores)
    where = {"results": str(store.root / "results.json"), **recorder.describe()}
    report = _write_report(store.root, recorder, outcome) if getattr(args, "report", True) else None
    if report is not None:
        where["report"] = str(report)
    for error in outcome.recorder_errors:
        print(f"suite: error: {error}\nsuite: the results folder holds every run; record them into MLflow with: "
              f"suite upload {output} --tracking-uri {tracking_uri}", file=sys.stderr)
    if outcome.recording_error is not None:
        kept = (f"{len(outcome.results)} run(s) kept in {outcome.rescue_file}; after freeing space: "
                f"suite recover {output} --from {outcome.rescue_file}") if outcome.rescue_file else \
            "no place could take a rescue copy either: the runs are printed below as JSON"
        print(f"suite: error: {outcome.reason}; {kept}", file=sys.stderr)
        if outcome.rescue_file is None:
            print(json.dumps([r.to_dict() for r in outcome.results]))
    return MatrixRun(outcome, store, tracking_uri, recorder, where)


def refuse_unavailable_devices(devices: Sequence[str]) -> None:
    """Refuse, before anything is created, a matrix naming a device that is not here: one line with the reason
    ``suite devices`` gives (asked in a short-lived process: this one must not hold the device its configuration
    processes need)."""
    from suite.devices.probe import probe

    absent = {name: a.reason for name, a in probe(devices).items() if not a.available}
    if absent:
        raise ConfigError("; ".join(f"device {name!r} is not available here: {reason}"
                                    for name, reason in absent.items()) + " (see suite devices)")


def _create_store(spec: MatrixSpec, workload_cls: Any, resolved: Sequence[RunConfig], args: argparse.Namespace,
                  argv: Sequence[str], kind: str, tracking_uri: str, memory_limit: float | None) -> Any:
    """The workload's check of its inputs, then the new results folder with the matrix's facts (locked)."""
    from suite.results.environment import git_state, host_facts, package_versions
    from suite.results.store import MatrixInfo, ResultsStore
    from suite.tracking.mlflow_gateway import normalize_uri

    prepared = dict(workload_cls.prepare(resolved[0]))
    for warning in prepared.pop("warnings", []):
        print(f"suite: warning: {visible(warning)}", file=sys.stderr)

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
    info = MatrixInfo(name=name, workload=spec.workload, command=["suite", *argv], kind=kind,
                      repeats=getattr(args, "repeats", 1),
                      memory_limit_bytes=int(memory_limit * 2**30) if memory_limit else None,
                      experiment=args.experiment, tags=tags, params={k: param_text(v) for k, v in params.items()},
                      tracking_uri=normalize_uri(tracking_uri), matrix_id=getattr(args, "matrix_id", None),
                      shard="{}/{}".format(*args.shard) if getattr(args, "shard", None) else None)
    return ResultsStore.create(output, info)


def _write_report(folder: Path, recorder: Any, outcome: Any) -> Path | None:
    """report.html and report.md into the results folder, attached to the MLflow matrix run; a report that cannot
    be made is a warning (the runs are recorded either way)."""
    from suite.report import DEFAULT_REFERENCE, mlflow_summary, write_report
    from suite.report.content import from_folder

    if not any(r.status == FINISHED and not r.recorded_elsewhere for r in outcome.results) \
            or outcome.recording_error is not None:
        return None
    try:
        content = from_folder(folder, DEFAULT_REFERENCE)
        files = write_report(content, folder)
    except SuiteError as exc:
        print(f"suite: warning: no report: {visible(exc)}", file=sys.stderr)
        return None
    if recorder.parent_run_id and not outcome.recorder_errors:
        try:
            recorder.attach_report(*mlflow_summary(content), [files.html, files.markdown, *files.images])
        except Exception as exc:  # noqa: BLE001 - MLflow is optional: the report is in the folder
            print(f"suite: warning: the report is not attached to MLflow run {recorder.parent_run_id}: "
                  f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
    return files.html


def _exit_status(run: MatrixRun) -> int:
    outcome = run.outcome
    return 0 if outcome.status == FINISHED and not outcome.recorder_errors and not outcome.recording_error else 1


# --- commands --------------------------------------------------------------------------------------
def _history(tracking_uri: str, configs: Sequence[RunConfig], repeats: int) -> Any:
    """The store's durations of earlier runs of these configurations (see suite.run.estimate), or None."""
    from suite.run.estimate import estimate
    from suite.tracking.mlflow_gateway import MlflowGateway

    try:
        return estimate(configs, MlflowGateway(tracking_uri).finished_durations([c.config_id for c in configs]),
                        repeats)
    except SuiteError:
        return None


def _shard_and_matrix_id(spec: MatrixSpec, args: argparse.Namespace) -> list[RunConfig] | None:
    """This invocation's shard of the matrix (``--shard I/N``; ``None`` without it), and the matrix id that the
    shards, or the nodes of a multi-node matrix, share (``args.matrix_id``, derived where not given)."""
    from suite.run.matrix import resolve, shard_of

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
    from suite.devices.probe import probe
    from suite.run.estimate import estimate, format_duration
    from suite.run.matrix import resolve
    from suite.tracking.mlflow_gateway import default_tracking_uri, sqlite_path

    configs = list(configs) if configs is not None else resolve(spec)[1]
    repeats = getattr(args, "repeats", 1)
    tracking_uri = args.tracking_uri or default_tracking_uri()
    output = args.output or Path("suite-results") / "<time of the run>"
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
    print(f"store: {tracking_uri}" + (" (not there yet: suite run creates it)" if database is not None
                                      and not database.is_file() else "") + store_note)
    print(f"estimated duration: {history.total_text()}")
    return 0


def _matrix_size(args: argparse.Namespace) -> int:
    size = getattr(args, "repeats", 1)
    for axis in ("devices", "workers", "loaders", "precisions", "engines"):
        size *= len(getattr(args, axis, None) or (None,))
    return size


def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    args = merge_config_file(args, argv)
    if not args.dry_run and sys.stderr.isatty():  # said before the heavy imports (torch, transformers, MLflow)
        print(f"suite: {_matrix_size(args)} run(s) of {args.workload}: preparing (model library, dataset, tokenizer, "
              "MLflow store)...", file=sys.stderr, flush=True)
    spec = spec_from_args(args)
    configs = _shard_and_matrix_id(spec, args)
    if configs == []:
        print(f"suite: shard {args.shard[0]}/{args.shard[1]} holds no configuration of this matrix: nothing to run")
        return 0
    if args.dry_run:
        return dry_run(spec, args, configs)
    run = run_recorded(spec, configs, args, argv)
    run.store.release()
    print("\n".join(f"{k}: {v}" for k, v in run.where.items()))
    return _exit_status(run)


def cmd_tune(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from suite.analysis import tune
    from suite.tracking.side_runs import log_tune

    max_workers = args.max_workers if args.max_workers is not None else (os.cpu_count() or 1)
    args.workers = tuple(range(0, max_workers + 1))
    spec = spec_from_args(args)
    configs = tune.sweep_configs(spec, args.prefetch_factors)
    run = run_recorded(spec, configs, args, argv, kind="tune")
    try:
        outcome = tune.analyse(run.outcome.results, args.tolerance)
        title = (f"suite tune: {spec.workload}/{spec.preset} on {spec.devices[0]}, loader {spec.loaders[0]}, "
                 f"{spec.precisions[0]}, batch {run.outcome.results[0].config.batch_size}")
        png = tune.plot(outcome, run.store.path("tune.png"), title)
        summary = run.store.write_json("tune.json", outcome.to_dict())
    finally:
        run.store.release()
    if run.recorder.parent_run_id and not run.outcome.recorder_errors:
        log_tune(run.recorder.gateway, run.recorder.parent_run_id, outcome, [png, summary])
    best, pick = outcome.best, outcome.recommended
    print_tune_table(outcome)
    print(f"best: {best.label} ({best.throughput_samples_per_s:.1f} samples/s, 95 % interval "
          f"[{best.ci_low:.1f}, {best.ci_high:.1f}])\n"
          f"recommended: {pick.label} ({pick.throughput_samples_per_s:.1f} samples/s, [{pick.ci_low:.1f}, "
          f"{pick.ci_high:.1f}]: not significantly slower than the best; host PSS "
          f"{(pick.host_ram_peak_pss_bytes or 0) / 2**20:.0f} MiB)\n"
          f"plot: {png}\nsummary: {summary}")
    busy = [p.label for p in outcome.points if p.contended]
    if busy:
        print(f"suite: warning: the host was busy with other work while measuring {', '.join(busy)}: those figures "
              "are not the machine's; run again on a quiet host", file=sys.stderr)
    print("\n".join(f"{k}: {v}" for k, v in run.where.items()))
    return _exit_status(run)


def _write_figures(folder: Path | None, name: str, figures: dict[str, Any]) -> None:
    if folder is None:
        return
    if folder.exists() and not folder.is_dir():
        raise SuiteError(f"--output {folder} is a file, not a folder")
    try:
        write_json_atomic(folder / name, figures)
    except OSError as exc:
        raise SuiteError(f"cannot write {folder / name}: {exc.strerror or exc}") from None


def cmd_bench_loader(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from suite.registry import load_workload

    figures = load_workload(args.workload).loader_benchmark(
        dict(dataset=args.dataset, images=args.images, image_size=args.image_size, batch_size=args.batch_size,
             num_workers=args.num_workers, rounds=args.rounds, train_steps=args.train_steps),
        progress=(lambda message: None) if args.json else (lambda message: print(f"  {message}", file=sys.stderr)))
    _write_figures(args.output, "bench-loader.json", figures)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    from rich.table import Table

    from suite.cli.display import wide_console

    table = Table(title=f"input pipelines, {figures['settings']['num_workers']} worker(s), batch "
                        f"{figures['settings']['batch_size']}, image {figures['settings']['image_size']}")
    for column in ("pipeline", "images/s per worker", "end-to-end images/s", "batches/s", "vs reference"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    reference = figures["pipelines"]["reference"]["end_to_end_batches_per_s"]
    for name, row in figures["pipelines"].items():
        table.add_row(name, f"{row['images_per_s_per_worker']:.0f}", f"{row['end_to_end_images_per_s']:.0f}",
                      f"{row['end_to_end_batches_per_s']:.2f}", f"{row['end_to_end_batches_per_s'] / reference:.2f}x")
    wide_console().print(table)
    fidelity = figures["fidelity"]
    print(f"closed: max deviation from the reference {fidelity['closed_max_abs_error']:.2g} after normalization "
          f"({'within' if fidelity['closed_within_tolerance'] else 'NOT within'} 1/255); "
          f"open: PSNR {figures['open_psnr_db']:.1f} dB against the reference")
    training = figures.get("training")
    if training:
        print(f"training ({training['steps']} steps, tiny preset): eval_accuracy closed "
              f"{training['closed']['eval_accuracy']:.3f}, open {training['open']['eval_accuracy']:.3f} "
              f"({training['open_vs_closed_eval_accuracy']:+.3f})")
    return 0


def cmd_bench_overhead(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from suite.run.matrix import resolve
    from suite.run.overhead import run_overhead

    args.workers = (args.workers,)
    workload_cls, (config,) = resolve(spec_from_args(args))
    for warning in workload_cls.prepare(config).get("warnings", []):
        print(f"suite: warning: {visible(warning)}", file=sys.stderr)
    figures = run_overhead(config, args.blocks, progress=(lambda message: None) if args.json
                           else (lambda message: print(f"  {message}", file=sys.stderr)))
    _write_figures(args.output, "bench-overhead.json", figures)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    sampler = figures["ram_sampler"]
    low, high = figures["overhead_ci95"]
    paired_low, paired_high = figures["paired_overhead_ci95"]
    print(f"overhead {figures['overhead_fraction']:+.2%} (95 % interval {low:+.2%} .. {high:+.2%}; by decomposition "
          f"over {args.blocks} blocks of {args.steps} steps, bare step {figures['bare_step_time_s'] * 1000:.1f} ms)")
    for name, part in figures["decomposition"].items():
        amount = (f"{part['wall_s_per_step'] * 1e6:8.1f} us/step" if "wall_s_per_step" in part
                  else f"{part['cpu_cores']:8.3f} cores ")
        print(f"  {name:<16} {amount} {part['fraction_of_step']:+.3%}  {part['what']}")
    print(f"cross-check, paired suite/bare step time - 1: {figures['paired_overhead_fraction']:+.2%} "
          f"({paired_low:+.2%} .. {paired_high:+.2%}: the machine's noise)\n"
          f"host RAM sampler: RSS {sampler['rss_sample_cpu_s'] * 1000:.2f} ms CPU every "
          f"{sampler['interval_s'] * 1000:.0f} ms, PSS {sampler['pss_sample_cpu_s'] * 1000:.1f} ms CPU every "
          f"{sampler['pss_interval_s']:.1f} s = {sampler['cpu_fraction_of_one_core']:.1%} of one core "
          f"({sampler['cpu_fraction_of_one_core_if_pss_every_sample']:.0%} if PSS were read every sample)")
    return 0

"""The ``suite`` command line.

``suite run`` with no arguments runs the default CPU matrix (tiny BridgeTower preset, synthetic
New-Yorker-like data, ``dataloader_num_workers`` 0, 1, 2) into a local MLflow store (``./mlflow.db``)
and writes ``results.json`` in the output directory. ``suite list`` shows workloads, presets and devices;
``suite audit`` re-runs a recorded matrix and checks it; ``suite compare`` sets it beside published results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from suite.audit import DEFAULT_LOSS_RTOL, DEFAULT_THROUGHPUT_TOLERANCE
from suite.config import (
    DEFAULT_SEED,
    DEFAULT_STEPS,
    DEFAULT_WARMUP_STEPS,
    ENGINES,
    LOADERS,
    PRECISIONS,
    MatrixSpec,
    RunConfig,
)
from suite.errors import ConfigError, SuiteError
from suite.fileio import write_json_atomic
from suite.results import FINISHED, RunResult
from suite.scoring import ConfigScore

DEFAULT_WORKLOAD = "bridgetower"


# --- option parsers: each raises ArgumentTypeError quoting the bad value -------------------------
def _parse_list(item: Callable[[str], Any], what: str) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
        try:
            return tuple(item(p) for p in parts)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid {what} in {text!r}: {exc}") from None
    return parse


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def _add_one_configuration_options(parser: argparse.ArgumentParser) -> None:
    """The options of commands that measure one configuration (`suite tune`, `suite bench-overhead`)."""
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD)
    parser.add_argument("--preset", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--loader", type=_choice(LOADERS), default="cpu")
    parser.add_argument("--precision", type=_choice(PRECISIONS), default="fp32")
    parser.add_argument("--warmup-steps", type=_int_at_least(0), default=DEFAULT_WARMUP_STEPS)
    parser.add_argument("--batch-size", type=_int_at_least(1), default=None)
    parser.add_argument("--dataset", default=None)


def build_parser(suppress_run_defaults: bool = False) -> argparse.ArgumentParser:
    """The CLI parser; ``suppress_run_defaults`` leaves out `suite run` options not given (for merging
    them over a config file)."""
    parser = argparse.ArgumentParser(prog="suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="run a benchmark matrix and record it in MLflow and results.json",
                         description="Run every configuration of the matrix device x workers x loader x precision, "
                                     "each in a fresh process, and record it in MLflow and results.json.")
    run.add_argument("--config", type=Path, default=None, metavar="FILE",
                     help="JSON or TOML file with matrix fields (workload, preset, devices, workers, loaders, "
                          "precisions, steps, warmup_steps, seed, batch_size, dataset, weights, skip_bad_samples) "
                          "and repeats, memory_limit, experiment; options given on the command line win")
    run.add_argument("--workload", default=DEFAULT_WORKLOAD, help="workload plugin name (default: %(default)s)")
    run.add_argument("--preset", default=None,
                     help="workload preset, e.g. tiny (default, random init) or large (the published recipe)")
    run.add_argument("--device", dest="devices", type=_parse_list(str, "device names"), default=("cpu",),
                     help="device adapter(s), comma-separated (default: cpu); see `suite list`")
    run.add_argument("--workers", type=_parse_list(_non_negative_int, "worker counts"), default=(0, 1, 2),
                     help="dataloader_num_workers values, comma-separated (default: 0,1,2)")
    run.add_argument("--loader", dest="loaders", type=_parse_list(_choice(LOADERS), "loaders"), default=("cpu",),
                     help="cpu: decode+preprocess in loader workers (the reference); cpu-fast: the same with our "
                          "faster pipeline of equal output; device: workers read encoded bytes, the device "
                          "decodes; dali: NVIDIA DALI decodes them. Comma-separated (default: cpu)")
    run.add_argument("--precision", dest="precisions", type=_parse_list(_choice(PRECISIONS), "precisions"),
                     default=("fp32",), help="fp32 and/or bf16 (autocast), comma-separated (default: fp32)")
    run.add_argument("--engine", dest="engines", type=_parse_list(_choice(ENGINES), "engines"), default=("suite",),
                     help="suite: the suite's own loop (default); hf-trainer: transformers' Trainer (GaudiTrainer on "
                          "Gaudi2) as the published benchmark, timed with the suite's accounting and also recording "
                          "the trainer's own train_samples_per_second. Comma-separated: both side by side")
    run.add_argument("--steps", type=_int_at_least(1), default=DEFAULT_STEPS,
                     help="measured steps per configuration (default: %(default)s)")
    run.add_argument("--warmup-steps", type=_int_at_least(0), default=DEFAULT_WARMUP_STEPS,
                     help="warm-up steps excluded from every metric but the loss, on every device "
                          "(default: %(default)s, as the reference's throughput_warmup_steps)")
    run.add_argument("--batch-size", type=_int_at_least(1), default=None,
                     help="per-device batch size (default: the preset's fixed one; recorded either way)")
    run.add_argument("--nproc-per-node", type=_int_at_least(1), default=1,
                     help="processes (devices) per configuration, launched with torchrun over the device's "
                          "distributed backend (gloo on CPU, nccl, hccl): global batch = batch size x N, global "
                          "throughput over the slowest rank, host RAM summed over ranks (default: 1)")
    run.add_argument("--prefetch-factor", type=_int_at_least(1), default=None,
                     help="batches each loader worker prepares ahead (default: torch's, 2); see `suite tune`")
    run.add_argument("--repeats", type=_int_at_least(1), default=1,
                     help="run each configuration N times, each in a fresh process, and score it the MLPerf way "
                          "(drop the highest and lowest throughput, mean of the rest; spread as CV) (default: 1)")
    run.add_argument("--memory-limit", type=_positive_float, default=None, metavar="GIB",
                     help="cap each configuration's address space (its process and loader workers) at GIB GiB; "
                          "a configuration that needs more fails with the reason, and the matrix goes on")
    run.add_argument("--seed", type=_int_at_least(0), default=DEFAULT_SEED, help="seed of every RNG (default: 42)")
    run.add_argument("--dataset", default=None,
                     help="'synthetic' (default, generated locally), 'newyorker' (the published dataset from the "
                          "hub, pinned revision) or an imagefolder path (images + metadata.jsonl)")
    run.add_argument("--skip-bad-samples", action="store_true",
                     help="leave out samples whose image cannot be decoded (found by decoding every image once) "
                          "and record their count (metric skipped_samples) and names; default: a bad sample "
                          "fails the configuration, naming the file")
    run.add_argument("--weights", default=None,
                     help="pretrained checkpoint (local path or hub id); default: random init of the preset")
    run.add_argument("--output", type=Path, default=None,
                     help="output directory for results.json and run logs (default: ./suite-results/<time>)")
    run.add_argument("--tracking-uri", default=None,
                     help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db)")
    run.add_argument("--experiment", default=None, help="MLflow experiment name (default: the workload name)")
    run.add_argument("--system-metrics-interval", type=float, default=1.0, metavar="SECONDS",
                     help="sample MLflow system metrics (CPU, RAM, NVIDIA GPU, Gaudi HPU where present) on each "
                          "configuration's run every SECONDS; 0 turns them off (default: %(default)s)")
    run.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")

    if suppress_run_defaults:
        for action in run._actions:  # noqa: SLF001 - argparse exposes no public accessor
            action.default = argparse.SUPPRESS
    sub.add_parser("list", help="list workloads with their presets, and device adapters with availability")

    audit = sub.add_parser(
        "audit", help="re-run a recorded matrix from its manifests and give a verdict per check",
        description="Audit TARGET: a results directory, an MLflow run id (matrix or configuration), or a "
                    "published-results file (reference/*.json). Checks: batch size logged = used, equal warm-up "
                    "accounting, loader requested = loader run, re-run from the manifest with identical inputs, "
                    "loss digest (bit-identical on the same device kind, else within --loss-rtol), throughput "
                    "within the noise band, package drift. Exit status 1 when a check fails.")
    audit.add_argument("target", help="results directory, MLflow run id, or reference JSON file")
    audit.add_argument("--tracking-uri", default=None,
                       help="MLflow store of the target run and of the audit record (default: as `suite run`)")
    audit.add_argument("--output", type=Path, default=None,
                       help="where re-runs and audit.json go (default: ./suite-results/audit-<time>)")
    audit.add_argument("--no-rerun", action="store_true", help="check the records only")
    audit.add_argument("--loss-rtol", type=float, default=DEFAULT_LOSS_RTOL,
                       help="relative loss tolerance across device kinds (default: %(default)s)")
    audit.add_argument("--throughput-tolerance", type=float, default=DEFAULT_THROUGHPUT_TOLERANCE,
                       help="smallest throughput noise band, relative; 3 x the recorded CV when repeats were "
                            "scored (default: %(default)s)")
    audit.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")

    upload = sub.add_parser("upload", help="record a results directory into MLflow, skipping runs already there",
                            description="Record the runs of a results directory (results.json, scores.json, "
                                        "run folders) into MLflow: for a matrix whose tracking server was "
                                        "unreachable, or to copy it to another store. Runs already recorded are "
                                        "found by their uids and not duplicated.")
    upload.add_argument("directory", type=Path, help="results directory written by `suite run`")
    upload.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: as `suite run`)")

    compare = sub.add_parser(
        "compare", help="configurations side by side with speed-ups and plots; beside published results",
        description="Show configurations (device x workers x loader x precision) side by side with the metrics and "
                    "the speed-up over a baseline, and write PNG plots (throughput, host RAM and device memory vs "
                    "dataloader_num_workers), also logged to the MLflow matrix run. With --reference, also the "
                    "published ratios beside the measured ones.")
    compare.add_argument("results", nargs="?", default=None,
                         help="results directory or MLflow matrix run id (or use --experiment / --filter)")
    compare.add_argument("--experiment", default=None, help="all configuration runs of this MLflow experiment")
    compare.add_argument("--filter", dest="filter_string", default=None,
                         help="MLflow search filter on configuration runs, e.g. \"params.device = 'cpu'\"")
    compare.add_argument("--baseline", default=None,
                         help="configuration the speed-ups are relative to (part of its id, e.g. nw0-cpu-fp32); "
                              "default: the first")
    compare.add_argument("--plots", type=Path, default=None,
                         help="folder for the PNG plots (default: <results>/plots or ./suite-results/compare-<time>)")
    compare.add_argument("--reference", default=None,
                         help="published results name (e.g. bridgetower_hf_blog_2023) or path")
    compare.add_argument("--tracking-uri", default=None, help="MLflow store (default: as `suite run`)")

    tune = sub.add_parser(
        "tune", help="find the smallest dataloader_num_workers / prefetch factor within a few %% of the best",
        description="Run one configuration over dataloader_num_workers 0..--max-workers and, for workers > 0, "
                    "each --prefetch-factors value (each a recorded run, as `suite run`), recommend the smallest "
                    "setting whose throughput is within --tolerance of the best, and plot throughput and host PSS "
                    "(tune.png, tune.json; logged to the MLflow tune run with the pick as tags).")
    _add_one_configuration_options(tune)
    tune.add_argument("--max-workers", type=_non_negative_int, default=None,
                      help="largest num_workers tried (default: the core count)")
    tune.add_argument("--prefetch-factors", type=_parse_list(_int_at_least(1), "prefetch factors"), default=(2,),
                      help="prefetch factors tried for workers > 0, comma-separated (default: 2, torch's)")
    tune.add_argument("--tolerance", type=float, default=0.05,
                      help="a setting within this fraction of the best throughput is good enough (default: 0.05)")
    tune.add_argument("--steps", type=_int_at_least(1), default=20, help="measured steps per setting (default: 20)")
    tune.add_argument("--seed", type=_int_at_least(0), default=DEFAULT_SEED)
    tune.add_argument("--output", type=Path, default=None, help="default: ./suite-results/tune-<time>")
    tune.add_argument("--tracking-uri", default=None)
    tune.add_argument("--experiment", default=None)
    tune.add_argument("--system-metrics-interval", type=float, default=1.0, metavar="SECONDS")
    tune.add_argument("--no-progress", action="store_true")

    bench = sub.add_parser(
        "bench-loader", help="the reference input pipeline vs ours (closed: same output; open: PSNR) in one run",
        description="Measure the workload's image input pipelines side by side on the same images in one run: "
                    "images/s per worker and end-to-end batches/s through a DataLoader, in interleaved rounds; "
                    "ratios to the reference pipeline and fidelity (closed: max deviation, open: PSNR).")
    bench.add_argument("--workload", default=DEFAULT_WORKLOAD)
    bench.add_argument("--dataset", default=None, help="as `suite run` (default: synthetic)")
    bench.add_argument("--images", type=_int_at_least(1), default=480, help="images per pass (default: 480)")
    bench.add_argument("--image-size", type=_int_at_least(8), default=294,
                       help="output side (default: 294, the published recipe's)")
    bench.add_argument("--batch-size", type=_int_at_least(1), default=48, help="default: 48, the reference's")
    bench.add_argument("--num-workers", type=_non_negative_int, default=None, help="default: the core count")
    bench.add_argument("--rounds", type=_int_at_least(1), default=3,
                       help="interleaved rounds; figures are medians over them (default: 3)")
    bench.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    bench.add_argument("--output", type=Path, default=None, help="also write the JSON figures to this file")

    overhead = sub.add_parser(
        "bench-overhead", help="the suite's step time with every tracker on vs a bare hand-written loop",
        description="Train one configuration in one process, alternating blocks of steps of a bare hand-written "
                    "loop and of the suite's own step loop with every tracker on (synchronized step timer, "
                    "MLPerf log, host RAM sampler in a separate process, MLflow system metrics); the overhead "
                    "is the median over block pairs of the suite's step time over the bare loop's, minus 1. "
                    "Also measures the tracker process's CPU share and the host RAM sampler's own cost.")
    _add_one_configuration_options(overhead)
    overhead.add_argument("--workers", type=_non_negative_int, default=0, help="dataloader_num_workers (default: 0)")
    overhead.add_argument("--steps", type=_int_at_least(1), default=10, help="steps per block (default: 10)")
    overhead.add_argument("--blocks", type=_int_at_least(1), default=6,
                          help="blocks of each kind, alternating (default: 6)")
    overhead.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    overhead.add_argument("--output", type=Path, default=None, help="also write the JSON figures to this file")

    sub.add_parser("devices", help="every device adapter: availability, reason, detected hardware")
    return parser


# --- progress display -------------------------------------------------------------------------------
class RichProgress:
    """Two bars: configurations of the matrix, and steps of the current configuration."""

    def __init__(self, count: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=self.console)
        self._matrix = self._bars.add_task("configurations", total=count, info="")
        self._steps = self._bars.add_task("steps", total=None, info="")

    def __enter__(self) -> "RichProgress":
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def config_started(self, config: RunConfig, index: int, count: int) -> None:
        self._bars.reset(self._steps, total=None, description=config.config_id, info="starting")

    def event(self, config: RunConfig, event: dict[str, Any]) -> None:
        if "step" in event:
            self._bars.update(self._steps, completed=event["step"], total=event["total"],
                              info=f"loss {event['loss']:.4f}")
        elif "phase" in event:
            self._bars.update(self._steps, info=event["phase"], total=event.get("total"))

    def config_ended(self, result: RunResult) -> None:
        self._bars.advance(self._matrix)
        self.console.print(_summary_line(result), soft_wrap=True)


class PlainProgress:
    def __init__(self) -> None:
        self._started = 0.0

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def config_started(self, config: RunConfig, index: int, count: int) -> None:
        self._started = time.time()
        print(f"[{index + 1}/{count}] {config.config_id}", file=sys.stderr, flush=True)

    def event(self, config: RunConfig, event: dict[str, Any]) -> None:
        pass

    def config_ended(self, result: RunResult) -> None:
        print(_summary_line(result), file=sys.stderr, flush=True)


def _summary_line(result: RunResult) -> str:
    config_id = RunConfig.from_dict(result.config).config_id
    if result.status != FINISHED:
        return f"  {config_id}: {result.status}: {result.reason}"
    m = result.metrics
    mib = 2**20
    parts = [f"{m['throughput_samples_per_s']:.1f} samples/s", f"p50 {m['step_time_p50_s'] * 1000:.0f} ms",
             f"data-wait {m['data_wait_fraction']:.0%}"]
    if "host_ram_peak_pss_bytes" in m:
        parts.append(f"host PSS {m['host_ram_peak_pss_bytes'] / mib:.0f} MiB")
    if "host_ram_peak_rss_bytes" in m:
        parts.append(f"RSS {m['host_ram_peak_rss_bytes'] / mib:.0f} MiB")
    return f"  {config_id}: " + ", ".join(parts)


def print_results_table(results: Sequence[RunResult]) -> None:
    """One row per configuration: the headline metrics, or the failure reason."""
    from rich.console import Console
    from rich.table import Table

    mib = 2**20
    table = Table(title="results")
    for column in ("configuration", "status", "samples/s", "p50 ms", "p99 ms", "data-wait", "device peak MiB",
                   "host PSS MiB", "host RSS MiB"):
        if column == "configuration":
            table.add_column(column, no_wrap=True)
        elif column == "status":
            table.add_column(column, overflow="fold", max_width=60)
        else:
            table.add_column(column, justify="right")
    def fmt(metrics: dict[str, float], key: str, scale: float = 1.0, pattern: str = "{:.0f}") -> str:
        return pattern.format(metrics[key] * scale) if key in metrics else "-"

    for result in results:
        config_id = RunConfig.from_dict(result.config).config_id + (f" #{result.repeat}" if result.repeat else "")
        m = result.metrics
        if result.status == FINISHED:
            table.add_row(config_id, result.status, fmt(m, "throughput_samples_per_s", pattern="{:.1f}"),
                          fmt(m, "step_time_p50_s", 1000), fmt(m, "step_time_p99_s", 1000),
                          fmt(m, "data_wait_fraction", pattern="{:.0%}"), fmt(m, "device_peak_memory_bytes", 1 / mib),
                          fmt(m, "host_ram_peak_pss_bytes", 1 / mib), fmt(m, "host_ram_peak_rss_bytes", 1 / mib))
        else:
            table.add_row(config_id, f"{result.status}: {result.reason}", *["-"] * 7)
    Console(width=max(Console().width, 140)).print(table)


def print_scores_table(scores: Sequence[ConfigScore]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="scores over repeats")
    for column in ("configuration", "status", "repeats", "score samples/s", "CV", "dropped", "losses identical"):
        table.add_column(column)
    for score in scores:
        table.add_row(score.config_id, score.status if not score.reason else f"{score.status}: {score.reason}",
                      str(score.repeats),
                      "-" if score.throughput_score is None else f"{score.throughput_score:.1f}",
                      "-" if score.throughput_cv is None else f"{score.throughput_cv:.1%}",
                      ",".join(map(str, score.dropped_repeats)) or "-", str(score.loss_digests_identical))
    Console(width=max(Console().width, 140)).print(table)


# --- commands ---------------------------------------------------------------------------------------
#: `suite run` options a config file may set besides the matrix fields (MatrixSpec).
FILE_RUN_OPTIONS = {"repeats": int, "memory_limit": (int, float), "experiment": str}


def load_config_file(path: Path) -> dict[str, Any]:
    """A config file's fields; unknown fields and wrongly typed run options are errors naming them."""
    import dataclasses
    import json

    if not path.is_file():
        raise ConfigError(f"config file does not exist: {path}")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(path.read_text())
        else:
            data = json.loads(path.read_text())
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table/object of fields")
    spec_fields = {f.name for f in dataclasses.fields(MatrixSpec)}
    unknown = sorted(set(data) - spec_fields - set(FILE_RUN_OPTIONS))
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(unknown)}; valid fields: "
                          f"{', '.join(sorted(spec_fields | set(FILE_RUN_OPTIONS)))}")
    for name, kind in FILE_RUN_OPTIONS.items():
        if name in data and (isinstance(data[name], bool) or not isinstance(data[name], kind)):
            raise ConfigError(f"{path}: {name} must be a {getattr(kind, '__name__', 'number')}, got {data[name]!r}")
    if data.get("repeats", 1) < 1:
        raise ConfigError(f"{path}: repeats must be >= 1, got {data['repeats']}")
    if "memory_limit" in data and not data["memory_limit"] > 0:
        raise ConfigError(f"{path}: memory_limit must be > 0 (GiB), got {data['memory_limit']}")
    return data


def _merge_config_file(args: argparse.Namespace, argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options over the config file's fields over the defaults."""
    if args.config is None:
        return args
    given = vars(build_parser(suppress_run_defaults=True).parse_args(argv))
    merged = vars(args).copy()
    for name, value in load_config_file(args.config).items():
        if name not in given:
            merged[name] = value
    return argparse.Namespace(**merged)


def _spec_from_args(args: argparse.Namespace) -> MatrixSpec:
    from suite.registry import load_workload

    preset = args.preset or load_workload(args.workload).default_preset
    return MatrixSpec.from_dict(dict(
        workload=args.workload, preset=preset, devices=args.devices, workers=args.workers,
        loaders=args.loaders, precisions=args.precisions, engines=args.engines, steps=args.steps,
        warmup_steps=args.warmup_steps, seed=args.seed, batch_size=args.batch_size, dataset=args.dataset,
        weights=args.weights, skip_bad_samples=args.skip_bad_samples, nproc_per_node=args.nproc_per_node,
        prefetch_factor=args.prefetch_factor))


@dataclasses.dataclass
class _MatrixRun:
    outcome: Any
    output: Path
    tracking_uri: str
    mlflow: Any
    where: dict[str, Any]


def _run_recorded(spec: MatrixSpec, configs: Sequence[RunConfig] | None, args: argparse.Namespace,
                  argv: Sequence[str], kind: str = "matrix") -> _MatrixRun:
    """Run ``configs`` (default: the matrix of ``spec``) recorded in MLflow and results.json; print tables."""
    from suite.environment import git_state, host_facts, package_versions
    from suite.recorders import JsonResultsRecorder, MatrixInfo, MlflowRecorder, default_tracking_uri
    from suite.runner import resolve, run_matrix

    workload_cls, resolved = resolve(spec)
    if configs is not None:  # same resolution (batch size from the preset) for a hand-made list
        resolved = [dataclasses.replace(c, batch_size=resolved[0].batch_size) for c in configs]
    tracking_uri = args.tracking_uri or default_tracking_uri()
    check_tracking_uri(tracking_uri)
    prepared = workload_cls.prepare(resolved[0])

    stamp = time.strftime("%Y%m%d-%H%M%S")
    output = args.output or Path("suite-results") / (stamp if kind == "matrix" else f"{kind}-{stamp}")
    tags = {f"version.{k}": v for k, v in package_versions().items()}
    tags.update({k: str(v) for k, v in git_state().items()})
    tags.update({f"host.{k}": str(v) for k, v in host_facts().items()})
    tags["suite.kind"] = kind
    params = {k: str(v) for k, v in vars(spec).items()}
    params["memory_limit_gib"] = str(args.memory_limit)
    params.update({f"prepared.{k}": str(v) for k, v in prepared.items()})
    name = f"{spec.workload}-{spec.preset}-{stamp}" if kind == "matrix" else f"{kind}-{spec.workload}-{stamp}"
    info = MatrixInfo(name=name, workload=spec.workload, command=["suite", *argv], output_dir=output,
                      repeats=args.repeats,
                      memory_limit_bytes=int(args.memory_limit * 2**30) if args.memory_limit else None,
                      experiment=args.experiment, tags=tags, params=params)
    mlflow_recorder = MlflowRecorder(tracking_uri, args.experiment,
                                     system_metrics_interval_s=args.system_metrics_interval or None)
    json_recorder = JsonResultsRecorder(output)
    display = PlainProgress() if args.no_progress else RichProgress(len(resolved) * args.repeats)
    print(f"suite: {len(resolved)} configuration(s) of {spec.workload}/{spec.preset} -> {output}", file=sys.stderr)
    with display:
        outcome = run_matrix(resolved, output, [mlflow_recorder, json_recorder], info, display)
    print_results_table(outcome.results)
    if args.repeats > 1:
        print_scores_table(outcome.scores)
    where = {**json_recorder.describe(), **mlflow_recorder.describe()}
    for error in outcome.recorder_errors:
        print(f"suite: error: {error}\nsuite: results.json holds every run; record them into MLflow with: "
              f"suite upload {output} --tracking-uri {tracking_uri}", file=sys.stderr)
    return _MatrixRun(outcome, output, tracking_uri, mlflow_recorder, where)


def _cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    args = _merge_config_file(args, argv)
    run = _run_recorded(_spec_from_args(args), None, args, argv)
    print("\n".join(f"{k}: {v}" for k, v in run.where.items()))
    return 0 if run.outcome.status == FINISHED and not run.outcome.recorder_errors else 1


def _cmd_tune(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from suite import tune

    max_workers = args.max_workers if args.max_workers is not None else (os.cpu_count() or 1)
    args.workers = tuple(range(0, max_workers + 1))
    args.devices, args.loaders, args.precisions = (args.device,), (args.loader,), (args.precision,)
    args.prefetch_factor, args.nproc_per_node, args.weights, args.skip_bad_samples = None, 1, None, False
    args.engines = ("suite",)
    args.repeats, args.memory_limit = 1, None
    spec = _spec_from_args(args)
    configs = tune.sweep_configs(spec, args.prefetch_factors)
    run = _run_recorded(spec, configs, args, argv, kind="tune")
    outcome = tune.analyse(run.outcome.results, args.tolerance)
    title = (f"suite tune: {spec.workload}/{spec.preset} on {args.device}, loader {args.loader}, "
             f"{args.precision}, batch {run.outcome.results[0].config['batch_size']}")
    png = tune.plot(outcome, run.output / "tune.png", title)
    summary = run.output / "tune.json"
    write_json_atomic(summary, outcome.to_dict())
    if run.mlflow.parent_run_id and not run.outcome.recorder_errors:
        tune.log_to_mlflow(run.tracking_uri, run.mlflow.parent_run_id, outcome, [png, summary])
    best, pick = outcome.best, outcome.recommended
    print(f"best: {best.label} ({best.throughput_samples_per_s:.1f} samples/s)\n"
          f"recommended: {pick.label} ({pick.throughput_samples_per_s:.1f} samples/s, within "
          f"{args.tolerance:.0%} of the best, host PSS {(pick.host_ram_peak_pss_bytes or 0) / 2**20:.0f} MiB)\n"
          f"plot: {png}\nsummary: {summary}")
    print("\n".join(f"{k}: {v}" for k, v in run.where.items()))
    return 0 if run.outcome.status == FINISHED and not run.outcome.recorder_errors else 1


def _cmd_bench_loader(args: argparse.Namespace) -> int:
    from suite.registry import load_workload

    figures = load_workload(args.workload).loader_benchmark(
        dict(dataset=args.dataset, images=args.images, image_size=args.image_size, batch_size=args.batch_size,
             num_workers=args.num_workers, rounds=args.rounds),
        progress=(lambda message: None) if args.json else (lambda message: print(f"  {message}", file=sys.stderr)))
    if args.output:
        write_json_atomic(args.output, figures)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"input pipelines, {figures['settings']['num_workers']} worker(s), batch "
                        f"{figures['settings']['batch_size']}, image {figures['settings']['image_size']}")
    for column in ("pipeline", "images/s per worker", "end-to-end images/s", "batches/s", "vs reference"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    reference = figures["pipelines"]["reference"]["end_to_end_batches_per_s"]
    for name, row in figures["pipelines"].items():
        table.add_row(name, f"{row['images_per_s_per_worker']:.0f}", f"{row['end_to_end_images_per_s']:.0f}",
                      f"{row['end_to_end_batches_per_s']:.2f}", f"{row['end_to_end_batches_per_s'] / reference:.2f}x")
    Console().print(table)
    fidelity = figures["fidelity"]
    print(f"closed: max deviation from the reference {fidelity['closed_max_abs_error']:.2g} after normalization "
          f"({'within' if fidelity['closed_within_tolerance'] else 'NOT within'} 1/255); "
          f"open: PSNR {figures['open_psnr_db']:.1f} dB against the reference")
    return 0


def _cmd_bench_overhead(args: argparse.Namespace) -> int:
    from suite.overhead import run_overhead
    from suite.registry import load_workload
    from suite.runner import resolve

    preset = args.preset or load_workload(args.workload).default_preset
    spec = MatrixSpec(workload=args.workload, preset=preset, devices=(args.device,), workers=(args.workers,),
                      loaders=(args.loader,), precisions=(args.precision,), steps=args.steps,
                      warmup_steps=args.warmup_steps, batch_size=args.batch_size, dataset=args.dataset)
    workload_cls, (config,) = resolve(spec)
    workload_cls.prepare(config)
    figures = run_overhead(config, args.blocks, progress=(lambda message: None) if args.json
                           else (lambda message: print(f"  {message}", file=sys.stderr)))
    if args.output:
        write_json_atomic(args.output, figures)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    sampler = figures["ram_sampler"]
    print(f"bare loop: {figures['bare_step_time_s'] * 1000:.1f} ms/step; suite with every tracker: "
          f"{figures['suite_step_time_s'] * 1000:.1f} ms/step; overhead {figures['overhead_fraction']:+.2%} "
          f"(median over {args.blocks} pairs of alternating blocks of {args.steps} steps)\n"
          f"host RAM sampler: RSS {sampler['rss_sample_cpu_s'] * 1000:.2f} ms CPU every "
          f"{sampler['interval_s'] * 1000:.0f} ms, PSS {sampler['pss_sample_cpu_s'] * 1000:.1f} ms CPU every "
          f"{sampler['pss_interval_s']:.1f} s = {sampler['cpu_fraction_of_one_core']:.1%} of one core "
          f"({sampler['cpu_fraction_of_one_core_if_pss_every_sample']:.0%} if PSS were read every sample)")
    return 0


def _cmd_devices() -> int:
    from rich.console import Console
    from rich.table import Table

    from suite.registry import device_names, load_device

    table = Table(title="device adapters")
    for column in ("device", "available", "reason", "detected", "backend", "loaders"):
        table.add_column(column)
    for name in device_names():
        cls = load_device(name)
        avail = cls.availability()
        detected = ", ".join(f"{k}={v}" for k, v in avail.details.items())
        table.add_row(name, "yes" if avail.available else "no", avail.reason or "-", detected or "-",
                      cls.distributed_backend, ",".join(cls.supported_loaders))
    Console(width=max(Console().width, 160)).print(table)
    return 0


def _cmd_list() -> int:
    from suite.registry import device_names, load_device, load_workload, workload_names

    print("workloads:")
    for name in workload_names():
        cls = load_workload(name)
        for preset in cls.presets.values():
            default = " (default)" if preset.name == cls.default_preset else ""
            print(f"  {name}/{preset.name}{default}: batch {preset.batch_size}; {preset.description}")
    print("devices:")
    for name in device_names():
        avail = load_device(name).availability()
        state = "available" if avail.available else f"unavailable: {avail.reason}"
        print(f"  {name}: {state}")
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the running configuration is recorded as KILLED."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _load_recorded(target: str, tracking_uri: str | None) -> Any:
    from suite.audit import load_directory, load_mlflow_run
    from suite.recorders import default_tracking_uri

    path = Path(target)
    if path.is_dir():
        return load_directory(path)
    if path.suffix == ".json" or "/" in target:
        raise SuiteError(f"no such results directory: {target}")
    return load_mlflow_run(target, tracking_uri or default_tracking_uri())


def _print_checks(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    colours = {"PASS": "green", "FAIL": "red", "WARN": "yellow", "SKIP": "dim"}
    table = Table(title=f"audit of {report.target}")
    for column in ("subject", "check", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(c.subject, c.name, f"[{colours[c.verdict]}]{c.verdict}[/]", c.detail)
    Console(width=max(Console().width, 160)).print(table)


def _cmd_audit(args: argparse.Namespace) -> int:
    from suite.audit import audit_recorded, audit_reference, log_audit_to_mlflow
    from suite.recorders import default_tracking_uri

    target = Path(args.target)
    if target.is_file():
        report = audit_reference(target)
        _print_checks(report)
        return 0 if report.passed else 1
    recorded = _load_recorded(args.target, args.tracking_uri)
    output = args.output or Path("suite-results") / f"audit-{time.strftime('%Y%m%d-%H%M%S')}"
    output.mkdir(parents=True, exist_ok=True)
    display = PlainProgress() if args.no_progress else RichProgress(len(recorded.results))
    with display:
        report = audit_recorded(recorded, args.target, output, rerun=not args.no_rerun, loss_rtol=args.loss_rtol,
                                throughput_tolerance=args.throughput_tolerance, progress=display)
    write_json_atomic(output / "audit.json", report.as_dict())
    workload = recorded.results[0].config["workload"] if recorded.results else "audit"
    run_id = log_audit_to_mlflow(report, args.tracking_uri or default_tracking_uri(), workload, output / "audit.json")
    _print_checks(report)
    print(f"audit: {output / 'audit.json'}\nmlflow audit run: {run_id}")
    return 0 if report.passed else 1


def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail before anything runs when an HTTP tracking server does not answer its health check."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            if response.status != 200:
                raise SuiteError(f"MLflow tracking server {uri} answered /health with HTTP {response.status}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SuiteError(f"MLflow tracking server {uri} is unreachable ({reason}); start it or pass another "
                         "--tracking-uri") from exc


def _cmd_upload(args: argparse.Namespace) -> int:
    from suite.recorders import default_tracking_uri
    from suite.upload import upload

    uri = args.tracking_uri or default_tracking_uri()
    check_tracking_uri(uri)
    report = upload(args.directory, uri)
    print(f"recorded {report.recorded} run(s), {report.already_there} already in MLflow; "
          f"matrix run {report.parent_run_id} at {uri}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from suite.audit import load_directory
    from suite.compare import compare, load_reference, measured_table, reference_table
    from suite.comparison import plot, rows_from_mlflow, rows_from_results, speedups
    from suite.recorders import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri()
    rows: list = []
    plots_dir = args.plots
    if args.results and Path(args.results).is_dir():
        recorded = load_directory(Path(args.results))
        rows = rows_from_results([r.to_dict() for r in recorded.results], recorded.scores)
        plots_dir = plots_dir or Path(args.results) / "plots"
    elif args.results or args.experiment or args.filter_string:
        rows = rows_from_mlflow(uri, run_id=args.results, experiment=args.experiment, filter_string=args.filter_string)
    elif not args.reference:
        raise SuiteError("give RESULTS (a results directory or MLflow run id), --experiment, --filter or --reference")
    console = Console(width=max(Console().width, 140))
    if rows:
        base, ratios = speedups(rows, args.baseline)
        table = Table(title=f"configurations (speed-up over {base.config_key})")
        for column in ("configuration", "samples/s", "speed-up", "p50 ms", "data-wait", "device peak MiB",
                       "host PSS MiB", "host RSS MiB"):
            table.add_column(column, justify="left" if column == "configuration" else "right")
        for row, ratio in zip(rows, ratios, strict=True):
            m = row.metrics
            table.add_row(row.config_key, f"{m['throughput_samples_per_s']:.1f}", f"{ratio:.2f}x",
                          *[f"{m[k] * s:.0f}" if k in m else "-" for k, s in (("step_time_p50_s", 1000),)],
                          f"{m['data_wait_fraction']:.0%}" if "data_wait_fraction" in m else "-",
                          *[f"{m[k] / 2**20:.0f}" if k in m else "-" for k in (
                              "device_peak_memory_bytes", "host_ram_peak_pss_bytes", "host_ram_peak_rss_bytes")])
        console.print(table)
        plots_dir = plots_dir or Path("suite-results") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
        pngs = plot(rows, plots_dir)
        print("plots: " + ", ".join(str(p) for p in pngs))
        parents = sorted({r.parent_run_id for r in rows if r.parent_run_id})
        if parents:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            for parent in parents:
                for png in pngs:
                    client.log_artifact(parent, str(png), artifact_path="plots")
            print(f"plots logged to MLflow run(s): {', '.join(parents)}")
    if args.reference:
        path, data = load_reference(args.reference)
        table = Table(title=f"{data.get('title', path.stem)}: published vs measured ratios")
        for column in ("ratio", "published", "measured", "measured / published"):
            table.add_column(column, justify="left" if column == "ratio" else "right")
        for ratio_row in compare(reference_table(data), measured_table(rows)):
            both = ratio_row.published is not None and ratio_row.measured is not None
            table.add_row(ratio_row.name, "-" if ratio_row.published is None else f"{ratio_row.published:.3f}",
                          "-" if ratio_row.measured is None else f"{ratio_row.measured:.3f}",
                          f"{ratio_row.measured / ratio_row.published:.3f}" if both else "-")
        console.print(table)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if args.command == "run":
            return _cmd_run(args, argv)
        if args.command == "tune":
            return _cmd_tune(args, argv)
        if args.command == "bench-loader":
            return _cmd_bench_loader(args)
        if args.command == "bench-overhead":
            return _cmd_bench_overhead(args)
        if args.command == "devices":
            return _cmd_devices()
        if args.command == "audit":
            return _cmd_audit(args)
        if args.command == "compare":
            return _cmd_compare(args)
        if args.command == "upload":
            return _cmd_upload(args)
        return _cmd_list()
    except SuiteError as exc:
        print(f"suite: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("suite: interrupted; every ended configuration and the interrupted one are in results.json "
              "and MLflow", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)

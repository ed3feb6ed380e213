"""Options declared once and shared by the commands that take them.

Every value is checked when it is parsed: each parser raises ``ArgumentTypeError`` quoting the bad value, and
argparse prints it with the subcommand's usage (exit status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Sequence

from suite.config import DEFAULT_SEED, DEFAULT_STEPS, DEFAULT_WARMUP_STEPS, DIVISIONS, ENGINES, LOADERS, PRECISIONS

#: What ``--workload`` says when it is not given (:func:`suite.registry.default_workload`, resolved after parsing).
WORKLOAD_HELP = "workload plugin name (default: the one this distribution ships; see `suite list`)"


# --- value parsers --------------------------------------------------------------------------------
def parse_list(item: Callable[[str], Any], what: str) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
        try:
            return tuple(item(p) for p in parts)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid {what} in {text!r}: {exc}") from None
    return parse


def parse_one(item: Callable[[str], Any], what: str) -> Callable[[str], tuple[Any, ...]]:
    """One value, stored as a 1-tuple so that one-configuration commands share the matrix's fields."""
    def parse(text: str) -> tuple[Any, ...]:
        try:
            return (item(text.strip()),)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: {exc}") from None
    return parse


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value


def choice(choices: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return text
    return parse


def float_above(minimum: float, inclusive: bool = False) -> Callable[[str], float]:
    """A number ``> minimum`` (``>= minimum`` when ``inclusive``)."""
    relation = ">=" if inclusive else ">"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {relation} {minimum:g}, got {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"must be {relation} {minimum:g}, got {text}")
        return value
    return parse


positive_float = float_above(0)
non_negative_float = float_above(0, inclusive=True)


def shard(text: str) -> tuple[int, int]:
    """``I/N``: shard I (0-based) of N."""
    index, slash, count = text.partition("/")
    try:
        if not slash:
            raise ValueError
        parsed = int(index), int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (shard I of N, I counted from 0), got {text!r}") from None
    if parsed[1] < 1 or not 0 <= parsed[0] < parsed[1]:
        raise argparse.ArgumentTypeError(f"shard {text}: N must be >= 1 and I in 0..N-1")
    return parsed


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An integer ``>= minimum`` (and ``<= maximum`` where given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value
    return parse


# --- option groups --------------------------------------------------------------------------------
def add_configuration_options(parser: argparse.ArgumentParser, matrix: bool, steps_default: int = DEFAULT_STEPS
                              ) -> None:
    """What defines the configurations to measure. ``matrix``: the axes take comma-separated lists (`suite run`);
    otherwise one value each (tune, bench-overhead). The fields are the same either way (devices, loaders...)."""
    many = parse_list if matrix else parse_one
    plural = "(s), comma-separated" if matrix else ""
    parser.add_argument("--workload", default=None, help=WORKLOAD_HELP)
    parser.add_argument("--preset", default=None,
                        help="workload preset, e.g. tiny (default, random init) or large (the published recipe)")
    parser.add_argument("--device", dest="devices", type=many(str, "device names"), default=("cpu",),
                        help=f"device adapter{plural} (default: cpu); see `suite devices`")
    parser.add_argument("--loader", dest="loaders", type=many(choice(LOADERS), "loaders"), default=("cpu",),
                        help="cpu: decode+preprocess in loader workers (the reference); cpu-fast: the same with our "
                             "faster pipeline of equal output; device: workers read encoded bytes, the device "
                             f"decodes; dali: NVIDIA DALI decodes them{'. Comma-separated' if matrix else ''} "
                             "(default: cpu)")
    parser.add_argument("--precision", dest="precisions", type=many(choice(PRECISIONS), "precisions"),
                        default=("fp32",), help=f"fp32 or bf16 (autocast){plural} (default: fp32)")
    parser.add_argument("--steps", type=int_at_least(1), default=steps_default,
                        help="measured steps per configuration (default: %(default)s)")
    parser.add_argument("--warmup-steps", type=int_at_least(0), default=DEFAULT_WARMUP_STEPS,
                        help="warm-up steps excluded from every metric but the loss, on every device "
                             "(default: %(default)s, as the reference's throughput_warmup_steps)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=None,
                        help="per-device batch size (default: the preset's fixed one; recorded either way)")
    parser.add_argument("--seed", type=int_at_least(0), default=DEFAULT_SEED, help="seed of every RNG (default: 42)")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                        help="deterministic kernels (bit-identical re-runs; the default); --no-deterministic runs as "
                             "the published method did, faster on CUDA, and is recorded as such (default: on)")
    parser.add_argument("--dataset", default=None,
                        help="the workload's dataset: a name it knows or a path (default: the workload's own; "
                             "`suite list` says what each workload takes)")
    _add_quality_options(parser)
    _add_bound_options(parser)
    if matrix:
        parser.add_argument("--workers", type=parse_list(non_negative_int, "worker counts"), default=(0, 1, 2),
                            help="dataloader_num_workers values, comma-separated (default: 0,1,2)")
        parser.add_argument("--engine", dest="engines", type=parse_list(choice(ENGINES), "engines"),
                            default=("suite",),
                            help="suite: the suite's own loop (default); hf-trainer: transformers' Trainer "
                                 "(GaudiTrainer on Gaudi2) as the published benchmark, timed with the suite's "
                                 "accounting and also recording the trainer's own train_samples_per_second. "
                                 "Comma-separated: both side by side")


def _add_quality_options(parser: argparse.ArgumentParser) -> None:
    quality = parser.add_argument_group("quality (held-out evaluation) and MLPerf submission metadata")
    quality.add_argument("--eval-every", type=int_at_least(1), default=None, metavar="N",
                         help="evaluate quality every N measured steps (off the clock; always once at the end)")
    quality.add_argument("--eval-samples", type=int_at_least(2), default=None, metavar="N",
                         help="evaluate on the first N held-out pairs only (default: all): a smoke run of the large "
                              "preset on a CPU is then not its evaluation; recorded, refused for a closed run")
    quality.add_argument("--target-quality", type=float_above(0), default=None, metavar="R",
                         help="train until eval_accuracy (mean retrieval recall@1) reaches R, at most --max-steps; "
                              "records time_to_train_s and steps_to_target; a run that never reaches R is FAILED")
    quality.add_argument("--max-steps", type=int_at_least(1), default=None, metavar="N",
                         help="with --target-quality: the most measured steps (default: 10 x --steps)")
    quality.add_argument("--submission-org", default=None,
                         help="MLPerf log submission_org (default: unknown; a closed-division run must give it)")
    quality.add_argument("--submission-platform", default=None,
                         help="MLPerf log submission_platform (default: from the device, e.g. '1x NVIDIA H100 ...')")
    quality.add_argument("--submission-division", type=choice(DIVISIONS), default=None,
                         help="open or closed (default: closed only for a run that follows the published recipe "
                              "exactly and gives --submission-org, else open; closed is refused for any other run)")
    quality.add_argument("--clear-caches", action="store_true",
                         help="drop the OS page cache before each configuration (MLPerf's cache_clear; needs root)")


def _add_bound_options(parser: argparse.ArgumentParser) -> None:
    bounds = parser.add_argument_group("bounds and time limits (recorded; not part of a configuration's identity)")
    bounds.add_argument("--max-image-pixels", type=int_at_least(1), default=None, metavar="N",
                        help="refuse an image whose header declares more pixels, before decoding it, with every "
                             "loader (default: Pillow's decompression-bomb limit, 89,478,485)")
    bounds.add_argument("--max-image-bytes", type=int_at_least(1), default=None, metavar="N",
                        help="refuse an image file larger than this (default: 64 MiB)")
    bounds.add_argument("--max-caption-bytes", type=int_at_least(1), default=None, metavar="N",
                        help="refuse a dataset whose metadata holds a longer caption (UTF-8 bytes), naming the line, "
                             "before anything runs (default: 64 KiB; a caption is tokenized to at most 128 tokens)")
    bounds.add_argument("--loader-memory", dest="loader_memory_gib", type=positive_float, default=None,
                        metavar="GIB", help="what the loader workers together may allocate at once to decode and "
                                            "preprocess images; each worker refuses, before decoding, an image that "
                                            "needs more than its equal share (default: 4 GiB)")
    bounds.add_argument("--allow-outside-links", action="store_true",
                        help="follow symbolic links in the dataset folder that lead outside it (refused by default)")
    bounds.add_argument("--timeout", dest="timeout_s", type=non_negative_float, default=None, metavar="SECONDS",
                        help="kill a configuration (and its loader workers) that runs longer and record it FAILED "
                             "'timed out'; the matrix goes on (default: 900 s + 60 s per step; 0: no limit)")
    bounds.add_argument("--loader-timeout", dest="loader_timeout_s", type=non_negative_float, default=None,
                        metavar="SECONDS", help="fail a configuration whose loader workers deliver no batch for this "
                                                "long, naming the sample they were reading (default: 300; 0: none)")


def add_recording_options(parser: argparse.ArgumentParser) -> None:
    """Where runs are recorded in MLflow, and how they are shown while they run."""
    add_tracking_option(parser)
    parser.add_argument("--experiment", default=None, help="MLflow experiment name (default: the workload name)")
    parser.add_argument("--system-metrics-interval", type=non_negative_float, default=1.0, metavar="SECONDS",
                        help="sample MLflow system metrics (CPU, RAM, NVIDIA GPU, Gaudi HPU where present) on each "
                             "configuration's run every SECONDS; 0 turns them off (default: %(default)s)")
    add_progress_option(parser)


def add_tracking_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    parser.add_argument("--tracking-uri", default=None,
                        help=f"MLflow tracking URI{what} (default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db)")


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")


def add_output_option(parser: argparse.ArgumentParser, default: str, *aliases: str) -> None:
    """``--output DIR``: the folder this command writes (never an existing results folder)."""
    parser.add_argument("--output", *aliases, type=Path, default=None, metavar="DIR",
                        help=f"output folder (default: {default})")


def looks_like_run_id(text: str) -> bool:
    """Whether ``text`` is spelled as an MLflow run id (32 hexadecimal digits)."""
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text.lower())

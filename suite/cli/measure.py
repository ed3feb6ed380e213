"""Commands that measure: ``suite run``, ``suite tune``, ``suite bench-loader``, ``suite bench-overhead``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import suite.cli.options as options
from suite.analysis import tune
from suite.cli.display import say
from suite.cli.matrix_run import (
    dry_run,
    matrix_exit_status,
    matrix_size,
    run_recorded,
    shard_and_matrix_id,
    spec_from_args,
)
from suite.cli.tables import print_tune_table
from suite.config import TOKENIZER_MODES
from suite.config.labels import FILE_RUN_OPTIONS, load_config_file
from suite.config.settings import MAX_REPEATS


# --- parsers ---------------------------------------------------------------------------------------
def add_parsers(sub: Any) -> None:
    """``suite run`` and ``suite tune``."""
    _add_run_parser(sub)
    _add_tune_parser(sub)


def _add_run_parser(sub: Any) -> None:
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
                          "eval_every, eval_samples, "
                          "target_quality, max_steps, submission_org, submission_platform, submission_division, "
                          "clear_caches) and "
                          f"{', '.join(FILE_RUN_OPTIONS)}; options given on the command line win")
    options.add_configuration_options(run, matrix=True)
    _add_scale_out_options(run)
    _add_run_options(run)
    options.add_output_option(run, "./suite-results/<time>; a new folder, never one holding results")
    options.add_recording_options(run)
    run.set_defaults(func=cmd_run)


def _add_scale_out_options(run: argparse.ArgumentParser) -> None:
    """Several processes, several nodes, a scheduler's shards."""
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
    run.add_argument("--shard", type=options.shard, default=None, metavar="I/N",
                     help="run only shard I (from 0) of N of the expanded matrix: every N-th configuration in the "
                          "order of their ids, so the shards of a Slurm array or Kubernetes indexed Job cover the "
                          "matrix exactly once whatever order the options list; needs --matrix-id (or "
                          "$SLURM_ARRAY_JOB_ID)")
    run.add_argument("--matrix-id", default=None, metavar="ID",
                     help="the id every shard of one matrix shares: MLflow tag suite.matrix_id, so `suite compare` "
                          "and `suite report` of any shard's matrix run see the whole matrix (default with --shard: "
                          "slurm-$SLURM_ARRAY_JOB_ID in a Slurm array job)")


def _add_run_options(run: argparse.ArgumentParser) -> None:
    """What each configuration runs with, and what the matrix does around it."""
    run.add_argument("--prefetch-factor", type=options.int_at_least(1), default=None,
                     help="batches each loader worker prepares ahead (default: torch's, 2); see `suite tune`")
    run.add_argument("--repeats", type=options.int_at_least(1, MAX_REPEATS), default=1,
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


def _add_tune_parser(sub: Any) -> None:
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


def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    args = merge_config_file(args, argv)
    if not args.dry_run and sys.stderr.isatty():  # said before the heavy imports (torch, transformers, MLflow)
        say(f"suite: {matrix_size(args)} run(s) of {args.workload}: preparing (model library, dataset, tokenizer, "
            "MLflow store)...", file=sys.stderr)
    spec = spec_from_args(args)
    configs = shard_and_matrix_id(spec, args)
    if configs == []:
        say(f"suite: shard {args.shard[0]}/{args.shard[1]} holds no configuration of this matrix: nothing to run")
        return 0
    if args.dry_run:
        return dry_run(spec, args, configs)
    run = run_recorded(spec, configs, args, argv)
    run.store.release()
    say("\n".join(f"{k}: {v}" for k, v in run.where.items()))
    return matrix_exit_status(run)


def cmd_tune(args: argparse.Namespace, argv: Sequence[str]) -> int:
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
    if run.recorder is not None and run.recorder.parent_run_id and not run.outcome.recorder_errors:
        log_tune(run.recorder.gateway, run.recorder.parent_run_id, outcome, [png, summary])
    best, pick = outcome.best, outcome.recommended
    print_tune_table(outcome)
    say(f"best: {best.label} ({best.throughput_samples_per_s:.1f} samples/s, 95 % interval "
          f"[{best.ci_low:.1f}, {best.ci_high:.1f}])\n"
          f"recommended: {pick.label} ({pick.throughput_samples_per_s:.1f} samples/s, [{pick.ci_low:.1f}, "
          f"{pick.ci_high:.1f}]: not significantly slower than the best; host anon "
          + (f"{pick.host_ram_peak_pss_anon_bytes / 2**20:.0f} MiB" if pick.host_ram_peak_pss_anon_bytes else "-")
          + f", PSS {(pick.host_ram_peak_pss_bytes or 0) / 2**20:.0f} MiB)\n"
          f"plot: {png}\nsummary: {summary}")
    busy = [p.label for p in outcome.points if p.contended]
    if busy:
        say(f"suite: warning: the host was busy with other work while measuring {', '.join(busy)}: those figures "
              "are not the machine's; run again on a quiet host", file=sys.stderr)
    say("\n".join(f"{k}: {v}" for k, v in run.where.items()))
    return matrix_exit_status(run)

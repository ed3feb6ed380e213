"""``suite bench-loader`` and ``suite bench-overhead``: figures printed as JSON and, with ``--output``, written
beside."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import suite.cli.options as options
from suite.cli.display import say, wide_console
from suite.cli.matrix_run import spec_from_args
from suite.errors import SuiteError
from suite.fileio import dumps_json, write_json_atomic
from suite.registry import load_workload
from suite.run.matrix import resolve
from suite.run.overhead import run_overhead
from suite.text import visible


def add_parsers(sub: Any) -> None:
    """``suite bench-loader`` and ``suite bench-overhead``."""
    bench = sub.add_parser(
        "bench-loader", help="the reference input pipeline vs ours (closed: same output; open: PSNR) in one run",
        description="Measure the workload's image input pipelines side by side on the same images in one run: "
                    "images/s per worker and end-to-end batches/s through a DataLoader, in interleaved rounds; "
                    "ratios to the reference pipeline and fidelity (closed: max deviation, open: PSNR).")
    bench.add_argument("--workload", default=None, help=options.WORKLOAD_HELP)
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

    figures = load_workload(args.workload).loader_benchmark(
        dict(dataset=args.dataset, images=args.images, image_size=args.image_size, batch_size=args.batch_size,
             num_workers=args.num_workers, rounds=args.rounds, train_steps=args.train_steps),
        progress=(lambda message: None) if args.json else (lambda message: print(f"  {message}", file=sys.stderr)))
    _write_figures(args.output, "bench-loader.json", figures)
    if args.json:
        print(dumps_json(figures, indent=2))
        return 0
    from rich.table import Table


    table = Table(title=f"input pipelines, {figures['settings']['num_workers']} worker(s), batch "
                        f"{figures['settings']['batch_size']}, image {figures['settings']['image_size']}")
    for column in ("pipeline", "images/s per worker", "end-to-end images/s", "batches/s", "vs reference"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    reference = figures["pipelines"]["reference"]["end_to_end_batches_per_s"]
    for name, row in figures["pipelines"].items():
        loader = row.get("loader")
        table.add_row(f"{name} (loader {loader})" if loader else f"{name} (no loader: compared only)",
                      f"{row['images_per_s_per_worker']:.0f}", f"{row['end_to_end_images_per_s']:.0f}",
                      f"{row['end_to_end_batches_per_s']:.2f}", f"{row['end_to_end_batches_per_s'] / reference:.2f}x")
    wide_console().print(table)
    fidelity = figures["fidelity"]
    say(f"closed (loader cpu-fast): max deviation from the reference (loader cpu) "
        f"{fidelity['closed_max_abs_error']:.2g} after normalization "
        f"({'within' if fidelity['closed_within_tolerance'] else 'NOT within'} 1/255); open (lossy, no loader runs "
        f"it): PSNR {figures['open_psnr_db']:.1f} dB against the reference")
    training = figures.get("training")
    if training:
        print(f"training ({training['steps']} steps, tiny preset): eval_accuracy closed "
              f"{training['closed']['eval_accuracy']:.3f}, open {training['open']['eval_accuracy']:.3f} "
              f"({training['open_vs_closed_eval_accuracy']:+.3f})")
    return 0


def cmd_bench_overhead(args: argparse.Namespace, argv: Sequence[str]) -> int:

    args.workers = (args.workers,)
    workload_cls, (config,) = resolve(spec_from_args(args))
    for warning in workload_cls.prepare(config).get("warnings", []):
        print(f"suite: warning: {visible(warning)}", file=sys.stderr)
    figures = run_overhead(config, args.blocks, progress=(lambda message: None) if args.json
                           else (lambda message: print(f"  {message}", file=sys.stderr)))
    _write_figures(args.output, "bench-overhead.json", figures)
    if args.json:
        print(dumps_json(figures, indent=2))
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

"""``suite bench-loader`` and ``suite bench-overhead``: figures printed as JSON and, with ``--output``, written
beside."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from suite.cli.display import wide_console
from suite.cli.matrix_run import spec_from_args
from suite.errors import SuiteError
from suite.fileio import write_json_atomic
from suite.registry import load_workload
from suite.run.matrix import resolve
from suite.run.overhead import run_overhead
from suite.text import visible


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
        print(json.dumps(figures, indent=2))
        return 0
    from rich.table import Table


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

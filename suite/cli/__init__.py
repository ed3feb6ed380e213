"""The ``suite`` command line.

`suite run` with no arguments runs the default CPU matrix (the default preset and data of the workload
this distribution ships, ``dataloader_num_workers`` 0, 1, 2) into a local MLflow store (``./mlflow.db``)
and a new results folder. ``suite list`` shows workloads, presets and devices; ``suite audit`` re-runs a
recorded matrix and checks it; ``suite compare`` sets configurations side by side and beside published results;
``suite report`` writes one shareable page of a matrix; ``suite recover`` / ``suite upload`` finish what a crash
left and record a folder into MLflow.

The parser and the entry point live in :mod:`.main`; commands in :mod:`.measure` (run, tune, bench-loader,
bench-overhead), :mod:`.records` (audit, compare, report, upload, recover) and :mod:`.inspect` (list, devices);
shared options in :mod:`.options`, what is shown in :mod:`.display`.
"""

from suite.cli.main import build_parser, main

__all__ = ["build_parser", "main"]

"""``suite mlperf``: what a submitter needs beside the logs, e.g. ``suite mlperf rules-path`` for MLCommons' checker."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from suite.results.mlperf_log import RULESET


def add_parsers(sub: Any) -> None:
    """``suite mlperf rules-path``."""
    mlperf = sub.add_parser(
        "mlperf", help="the suite's MLPerf ruleset: `suite mlperf rules-path` prints it for MLCommons' checker",
        description="Every configuration writes an mlperf.log. Check it with MLCommons' own command line and the "
                    "suite's ruleset (an absolute path: the checker looks relative ones up in its own package):\n\n"
                    '  python -m mlperf_logging.compliance_checker --config "$(suite mlperf rules-path)" '
                    "RESULTS/runs/<id>/mlperf.log",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = mlperf.add_subparsers(dest="mlperf_command", metavar="ACTION")
    actions.required = True
    rules = actions.add_parser("rules-path", help="print the absolute path of the ruleset's entry file (common.yaml)")
    rules.set_defaults(func=cmd_rules_path)


def cmd_rules_path(args: argparse.Namespace, argv: Sequence[str]) -> int:
    print(RULESET.resolve())
    return 0

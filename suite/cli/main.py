"""The ``suite`` parser and entry point: each subcommand names its handler with ``set_defaults(func=...)``."""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
from typing import NoReturn, Sequence

from suite.cli import audit, benches, export, inspect, measure, mlperf, records, score
from suite.errors import SuiteError
from suite.redact import redact_text
from suite.text import visible

DESCRIPTION = """`suite run` with no arguments runs the default CPU matrix (the default preset and data of the
workload this distribution ships, ``dataloader_num_workers`` 0, 1, 2) into a local MLflow store (``./mlflow.db``)
and a new results folder. ``suite list`` shows workloads, presets and devices; ``suite audit`` re-runs a
recorded matrix and checks it; ``suite compare`` sets configurations side by side and beside published results;
``suite report`` writes one shareable page of a matrix; ``suite recover`` / ``suite upload`` finish what a crash
left and record a folder into MLflow."""
#: The commands that run configurations (an interrupt records the one running).
MEASURING = ("run", "tune")


class SuiteParser(argparse.ArgumentParser):
    """argparse's parser, as the suite's commands answer: a refusal is the command's short usage line and the error
    (argparse's own usage of ``suite run`` is 22 lines before the one that matters), and help is plain text (the
    help strings' Markdown backticks left out)."""

    def short_usage(self) -> str:
        positionals = [action for action in self._actions if not action.option_strings
                       and action.help is not argparse.SUPPRESS]
        names = " ".join(action.metavar if isinstance(action.metavar, str) else action.dest.upper()
                         for action in positionals)
        return f"usage: {self.prog} [options]{' ' + names if names else ''}  ({self.prog} --help: every option)"

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.short_usage()}\n{self.prog}: error: {message}\n")

    def format_help(self) -> str:
        return super().format_help().replace("`", "")


def build_parser() -> argparse.ArgumentParser:
    """The CLI parser (its commands' parsers are :class:`SuiteParser` too: argparse makes them of its class)."""
    parser = SuiteParser(prog="suite", description=DESCRIPTION, allow_abbrev=False,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    measure.add_parsers(sub)
    benches.add_parsers(sub)
    audit.add_parsers(sub)
    records.add_parsers(sub)
    export.add_parsers(sub)
    mlperf.add_parsers(sub)
    score.add_parsers(sub)
    inspect.add_parsers(sub)
    for command in sub.choices.values():  # `--worker 0` is not `--workers 0`: an option is spelled out
        command.allow_abbrev = False
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The command line read; an option the command does not know is refused by that command's parser (its own
    usage line), with the options it does know that are spelled most alike."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # no public accessor
        own = command.choices[args.command]
        known = [o for action in own._actions for o in action.option_strings]
        hints = [f"{word} (did you mean {' or '.join(close)}?)" if close else word
                 for word in unknown
                 for close in [difflib.get_close_matches(word.split("=", 1)[0], known, n=2, cutoff=0.75)
                               if word.startswith("-") else []]]
        own.error(f"unrecognized arguments: {' '.join(hints)}")
    return args


def resolve_workload(args: argparse.Namespace) -> None:
    """``--workload`` left out: the workload this distribution ships (:func:`suite.registry.default_workload`)."""
    if hasattr(args, "workload") and args.workload is None:
        from suite.registry import default_workload

        args.workload = default_workload()


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the running configuration is recorded as KILLED."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    import time

    # where a matrix's wall time starts: this process's start when `suite` is the program, else this call
    started_at = time.time()
    if argv is None:
        from suite.meters.setup import process_started_at

        started_at = process_started_at()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(build_parser(), argv)
    args.started_at = started_at
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        resolve_workload(args)
        return args.func(args, argv)
    except SuiteError as exc:
        print(f"suite: error: {visible(redact_text(str(exc)))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("suite: interrupted" + ("; every ended configuration and the interrupted one are in results.json and "
                                      "MLflow" if args.command in MEASURING else ""), file=sys.stderr)
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, Terminated):  # launch wraps it to carry a result
            cause = cause.__cause__
        return 143 if cause is not None else 130
    finally:
        signal.signal(signal.SIGTERM, previous)

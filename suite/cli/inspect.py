"""Commands that describe what is installed: ``suite list``, ``suite devices`` and ``suite metrics``."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from suite.cli.display import wide_console
from suite.cli.options import WORKLOAD_HELP
from suite.devices.probe import probe
from suite.registry import device_names, load_device, load_workload, workload_names


def add_parsers(sub: Any) -> None:
    sub.add_parser("list", help="list workloads with their presets, and device adapters with availability"
                   ).set_defaults(func=cmd_list)
    sub.add_parser("devices", help="every device adapter: availability, reason, detected hardware"
                   ).set_defaults(func=cmd_devices)
    metrics = sub.add_parser("metrics", help="every metric a run records: name, unit, meaning, MLflow section, bounds",
                             description="The catalogue of figures (suite/figures.py) with the workload's own: every "
                                         "metric a run records, its unit, what it means, the MLflow section it is "
                                         "logged in (<group>/<name>), the values it can take (a recorded value "
                                         "outside them is shown as '-' with the reason), and whether configurations "
                                         "are compared by it; then the facts readers look into, with their types.")
    metrics.add_argument("--workload", default=None, help=WORKLOAD_HELP)
    metrics.add_argument("--json", action="store_true", help="as JSON: {figures: [...], facts: [...]}")
    metrics.set_defaults(func=cmd_metrics)


def cmd_metrics(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from rich.table import Table
    from rich.text import Text

    from suite.figures import FACTS
    from suite.fileio import dumps_json
    from suite.workload import catalogue_of

    figures = catalogue_of(args.workload).listing()
    if args.json:
        print(dumps_json({"workload": args.workload, "figures": figures, "facts": [f.as_dict() for f in FACTS]},
                         indent=2))
        return 0
    table = Table(title=f"metrics a run of {args.workload} records (suite/figures.py)")
    for column in ("name", "unit", "MLflow", "values", "compares", "meaning"):
        table.add_column(column, overflow="fold")
    for figure in figures:
        low, high = figure["minimum"], figure["maximum"]
        values = ("> " if figure["positive"] else ">= ") + f"{low:g}" if low is not None else ""
        values += (", " if values and high is not None else "") + (f"<= {high:g}" if high is not None else "")
        name = figure["pattern"] and f"{figure['name']} ({figure['pattern']})" or figure["name"]
        table.add_row(Text(name), Text(figure["unit"]), Text(f"{figure['group']}/" if figure["group"] else "-"),
                      Text(values or "finite"), "yes" if figure["compares"] else "", Text(figure["description"]))
    wide_console().print(table)
    return 0


def cmd_devices(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from rich.table import Table
    from rich.text import Text


    table = Table(title="device adapters")
    for column in ("device", "available", "reason", "detected", "backend", "loaders"):
        table.add_column(column)
    for name, avail in probe(device_names()).items():
        cls = load_device(name)
        detected = ", ".join(f"{k}={v}" for k, v in avail.details.items())
        table.add_row(name, "yes" if avail.available else "no", Text(avail.reason or "-"), Text(detected or "-"),
                      cls.traits.distributed_backend, ",".join(cls.traits.supported_loaders))
    wide_console().print(table)
    return 0


def cmd_list(args: argparse.Namespace, argv: Sequence[str]) -> int:

    print("workloads:")
    for name in workload_names():
        cls = load_workload(name)
        if cls.datasets:
            print(f"  {name} --dataset: {cls.datasets}")
        if cls.published_reference:
            print(f"  {name} published reference: {cls.published_reference} (suite report sets matrices beside it)")
        for preset in cls.presets.values():
            default = " (default)" if preset.name == cls.default_preset else ""
            print(f"  {name}/{preset.name}{default}: {preset.description}")
            facts = cls.describe_preset(preset.name)
            if "parameters" in facts:
                print(f"      {facts['parameters'] / 1e6:,.1f}M parameters, image {facts['image_size']}, batch "
                      f"{facts['batch_size']}, text length {facts['max_seq_length']}")
            for key in ("purpose", "fetches"):
                if facts.get(key):
                    print(f"      {key}: {facts[key]}")

    print("devices:")
    for name, avail in probe(device_names()).items():
        state = "available" if avail.available else f"unavailable: {avail.reason}"
        print(f"  {name}: {state}")
    return 0

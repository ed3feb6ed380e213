"""Commands that describe what is installed: ``suite list`` and ``suite devices``."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from suite.cli.display import wide_console
from suite.devices.probe import probe
from suite.registry import device_names, load_device, load_workload, workload_names


def add_parsers(sub: Any) -> None:
    sub.add_parser("list", help="list workloads with their presets, and device adapters with availability"
                   ).set_defaults(func=cmd_list)
    sub.add_parser("devices", help="every device adapter: availability, reason, detected hardware"
                   ).set_defaults(func=cmd_devices)


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

"""How the suite's metric names appear in MLflow: grouped by what they measure.

MLflow's UI puts metrics whose names share a prefix before ``/`` in one section of its charts (``system/`` is
MLflow's own), so each suite metric is logged as ``<group>/<name>`` (``throughput/throughput_samples_per_s``,
``memory/host_ram_peak_pss_bytes``...), byte figures also as MiB (``memory/host_ram_peak_pss_mib``) for people
reading the charts. Results folders keep the plain names; :func:`suite_name` reads them back.
"""

from __future__ import annotations

from typing import Iterable

MiB = 2**20

#: (group, name prefixes) in the order tried; a name matching none keeps its plain name (loss, repeats...).
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("throughput", ("throughput_", "model_flops_", "mfu")),
    ("step_time", ("step_time_", "measured_", "warmup_wall_")),
    ("setup", ("setup_", "in_window_")),
    ("memory", ("host_ram_", "device_peak_memory_")),
    ("input", ("data_wait_", "skipped_samples")),
    ("quality", ("eval_", "steps_to_target", "time_to_")),
    ("host", ("contention_", "load_average_")),
)
MIB_SUFFIX = "_mib"


def mlflow_name(name: str) -> str:
    """The MLflow key of a suite metric."""
    for group, prefixes in GROUPS:
        if name.startswith(prefixes):
            return f"{group}/{name}"
    return name


def suite_name(key: str) -> str | None:
    """The suite metric an MLflow key holds; ``None`` for a MiB copy (the bytes figure is the metric). Plain keys
    (runs recorded before the grouping, MLflow's ``system/`` metrics) are returned as they are."""
    group, slash, name = key.partition("/")
    if not slash or mlflow_name(name) != key:
        return key
    return None if name.endswith(MIB_SUFFIX) else name


def mlflow_metrics(metrics: Iterable[tuple[str, float, int, int]]) -> list[tuple[str, float, int, int]]:
    """(name, value, timestamp ms, step) rows with MLflow keys, plus a MiB copy of each byte figure."""
    out = []
    for name, value, timestamp, step in metrics:
        out.append((mlflow_name(name), value, timestamp, step))
        if name.endswith("_bytes"):
            out.append((mlflow_name(name.removesuffix("_bytes") + MIB_SUFFIX), value / MiB, timestamp, step))
    return out


def suite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """An MLflow run's metrics under the suite's names (MiB copies left out)."""
    out = {}
    for key, value in metrics.items():
        name = suite_name(key)
        if name is not None:
            out[name] = value
    return out

"""How the suite's metric names appear in MLflow: grouped by what they measure.

MLflow's UI puts metrics whose names share a prefix before ``/`` in one section of its charts (``system/`` is
MLflow's own), so each suite metric is logged as ``<group>/<name>``, its group the one its figure declares
(:mod:`suite.figures`: ``throughput/throughput_samples_per_s``, ``memory/host_ram_peak_pss_bytes``,
``host/host_cpu_cores_trainer``...), byte figures also as MiB (``memory/host_ram_peak_pss_mib``) for people reading
the charts. A name the catalogue does not know keeps its plain name. Results folders keep the plain names;
:func:`suite_name` reads both spellings back (runs logged before a figure had its group kept the plain one).
"""

from __future__ import annotations

from typing import Iterable

from suite.figures import CORE, Catalogue

MiB = 2**20
MIB_SUFFIX = "_mib"


def mlflow_name(name: str, catalogue: Catalogue = CORE) -> str:
    """The MLflow key of a suite metric: ``<group>/<name>`` with its figure's group."""
    figure = catalogue.get(name)
    return f"{figure.group}/{name}" if figure is not None and figure.group else name


def suite_name(key: str, catalogue: Catalogue = CORE) -> str | None:
    """The suite metric an MLflow key holds; ``None`` for a MiB copy (the bytes figure is the metric). Plain keys
    (runs recorded before their figure had a group, MLflow's ``system/`` metrics) are returned as they are."""
    group, slash, name = key.partition("/")
    if not slash:
        return key
    if name.endswith(MIB_SUFFIX) and mlflow_name(name.removesuffix(MIB_SUFFIX) + "_bytes", catalogue) == \
            f"{group}/{name.removesuffix(MIB_SUFFIX)}_bytes":
        return None
    return name if mlflow_name(name, catalogue) == key else key


def mlflow_metrics(metrics: Iterable[tuple[str, float, int, int]], catalogue: Catalogue = CORE
                   ) -> list[tuple[str, float, int, int]]:
    """(name, value, timestamp ms, step) rows with MLflow keys, plus a MiB copy of each byte figure."""
    out = []
    for name, value, timestamp, step in metrics:
        out.append((mlflow_name(name, catalogue), value, timestamp, step))
        if name.endswith("_bytes"):
            out.append((mlflow_name(name, catalogue).removesuffix("_bytes") + MIB_SUFFIX, value / MiB, timestamp,
                        step))
    return out


def suite_metrics(metrics: dict[str, float], catalogue: Catalogue = CORE) -> dict[str, float]:
    """An MLflow run's metrics under the suite's names (MiB copies left out)."""
    out = {}
    for key, value in metrics.items():
        name = suite_name(key, catalogue)
        if name is not None:
            out[name] = value
    return out

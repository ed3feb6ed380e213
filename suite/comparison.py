"""Configurations side by side: a table with speed-ups against a baseline, and plots like the blog's.

Rows come from a results directory, an MLflow matrix run, a whole experiment, or an MLflow filter
string. With repeats, a configuration's row holds its score. Plots (PNG, matplotlib): throughput vs
``dataloader_num_workers`` per device, loader and precision; host RAM (PSS, RSS) and device memory vs
``dataloader_num_workers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from suite.errors import SuiteError
from suite.results import FINISHED

MiB = 2**20


@dataclass(frozen=True)
class Row:
    device: str
    loader: str
    precision: str
    num_workers: int
    label: str  # workload/preset
    metrics: dict[str, float]
    mlflow_run_id: str | None = None
    parent_run_id: str | None = None

    @property
    def config_key(self) -> str:
        return f"{self.label} {self.device} nw{self.num_workers} {self.loader} {self.precision}"

    @property
    def series(self) -> str:
        return f"{self.device} / {self.loader} loader / {self.precision}"


def rows_from_results(results: Iterable[dict[str, Any]], scores: Iterable[dict[str, Any]] = ()) -> list[Row]:
    """Finished runs of a results directory; a configuration with a score is shown once, with its score."""
    scored = {}
    for score in scores:
        if score.get("throughput_score") is not None and score.get("repeats", 1) > 1:
            scored[score["config_id"]] = score
    rows, seen = [], set()
    for r in results:
        if r["status"] != FINISHED:
            continue
        c = r["config"]
        key = (c["device"], c["loader"], c["precision"], c["num_workers"], c["workload"], c["preset"])
        if key in seen:
            continue
        seen.add(key)
        metrics = dict(r["metrics"])
        config_id = f"{c['workload']}-{c['preset']}-{c['device']}-nw{c['num_workers']}-{c['loader']}-{c['precision']}"
        if config_id in scored:
            metrics["throughput_samples_per_s"] = scored[config_id]["throughput_score"]
            metrics["throughput_cv"] = scored[config_id]["throughput_cv"]
        rows.append(Row(c["device"], c["loader"], c["precision"], int(c["num_workers"]),
                        f"{c['workload']}/{c['preset']}", metrics, r.get("mlflow_run_id")))
    return rows


def rows_from_mlflow(tracking_uri: str, run_id: str | None = None, experiment: str | None = None,
                     filter_string: str | None = None) -> list[Row]:
    """Configuration runs (finished) of a matrix run, an experiment, or matching a filter string."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    clauses = ["tags.`suite.role` = 'configuration'", "attributes.status = 'FINISHED'"]
    try:
        if run_id:
            parent = client.get_run(run_id)
            experiment_ids = [parent.info.experiment_id]
            clauses.append(f"tags.`mlflow.parentRunId` = '{run_id}'")
        else:
            found = client.get_experiment_by_name(experiment) if experiment else None
            if experiment and found is None:
                raise SuiteError(f"no MLflow experiment {experiment!r} at {tracking_uri}")
            experiment_ids = [found.experiment_id] if found else [e.experiment_id for e in client.search_experiments()]
        if filter_string:
            clauses.append(f"({filter_string})" if " or " in filter_string.lower() else filter_string)
        runs = client.search_runs(experiment_ids, filter_string=" and ".join(clauses), max_results=5000)
    except MlflowException as exc:
        raise SuiteError(f"MLflow query failed: {exc.message.splitlines()[0]}") from exc
    rows = []
    for run in runs:
        p = run.data.params
        rows.append(Row(p["device"], p["loader"], p["precision"], int(p["num_workers"]),
                        f"{p['workload']}/{p['preset']}", dict(run.data.metrics), run.info.run_id,
                        run.data.tags.get("mlflow.parentRunId")))
    return sorted(rows, key=lambda r: (r.label, r.device, r.loader, r.precision, r.num_workers))


def speedups(rows: Sequence[Row], baseline: str | None = None) -> tuple[Row, list[float]]:
    """Throughput of each row over the baseline row's (default: the first row)."""
    if not rows:
        raise SuiteError("no finished configuration to compare")
    base = rows[0]
    if baseline:
        matches = [r for r in rows if baseline in r.config_key.replace(" ", "-") or baseline == r.mlflow_run_id]
        if not matches:
            raise SuiteError(f"baseline {baseline!r} matches no configuration; configurations: "
                             + ", ".join(r.config_key.replace(' ', '-') for r in rows))
        base = matches[0]
    reference = base.metrics["throughput_samples_per_s"]
    return base, [r.metrics["throughput_samples_per_s"] / reference for r in rows]


def finish_workers_axis(axis: Any, title: str, ylabel: str, workers: Sequence[int], legend_size: int) -> None:
    """Title, labels, ticks at the ``dataloader_num_workers`` values, y from 0, grid and legend."""
    axis.set_title(title)
    axis.set_xlabel("dataloader_num_workers")
    axis.set_ylabel(ylabel)
    axis.set_xticks(list(workers))
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=legend_size)


def plot(rows: Sequence[Row], directory: Path) -> list[Path]:
    """Write throughput.png and memory.png into ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    series: dict[str, list[Row]] = {}
    for row in rows:
        series.setdefault(f"{row.label}: {row.series}", []).append(row)
    for members in series.values():
        members.sort(key=lambda r: r.num_workers)

    workers = sorted({r.num_workers for r in rows})

    def finish(axis: Any, title: str, ylabel: str, legend_size: int) -> None:
        finish_workers_axis(axis, title, ylabel, workers, legend_size)

    def save(fig: Any, path: Path) -> Path:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, members in series.items():
        ax.plot([r.num_workers for r in members], [r.metrics["throughput_samples_per_s"] for r in members],
                marker="o", label=name)
    finish(ax, "Training throughput vs loader workers", "throughput (samples/s, measured steps)", 8)
    throughput_png = save(fig, directory / "throughput.png")

    fig, (host, device) = plt.subplots(1, 2, figsize=(12, 5))
    for name, members in series.items():
        xs = [r.num_workers for r in members]
        colour = None  # one colour per series: PSS solid, RSS dashed
        for key, style, what in (("host_ram_peak_pss_bytes", "-", "PSS"), ("host_ram_peak_rss_bytes", "--", "RSS")):
            ys = [r.metrics.get(key, float("nan")) / MiB for r in members]
            (line,) = host.plot(xs, ys, style, marker="o", color=colour, label=f"{name} ({what})")
            colour = line.get_color()
        device.plot(xs, [r.metrics.get("device_peak_memory_bytes", float("nan")) / MiB for r in members],
                    marker="o", label=name)
    finish(host, "Host RAM peak: training process + loader workers", "MiB", 7)
    finish(device, "Device peak memory", "MiB", 7)
    memory_png = save(fig, directory / "memory.png")
    return [throughput_png, memory_png]

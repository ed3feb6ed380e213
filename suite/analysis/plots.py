"""PNG plots like a published benchmark's chart (matplotlib, Agg): throughput and memory against
``dataloader_num_workers``, one line per configuration with the workers axis left out."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from suite.analysis.compare import THROUGHPUT, Row
from suite.analysis.host_ram_figures import HOST_RAM_FIGURES
from suite.figures import DEVICE_PEAK_MEMORY_BYTES
from suite.fileio import write_bytes_atomic
from suite.text import plot_text

MiB = 2**20


def finish_workers_axis(axis: Any, title: str, ylabel: str, workers: Sequence[int], legend_size: int) -> None:
    """Title, labels, ticks at the ``dataloader_num_workers`` values, y from 0, grid and legend."""
    axis.set_title(title)
    axis.set_xlabel("dataloader_num_workers")
    axis.set_ylabel(ylabel)
    axis.set_xticks(list(workers))
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=legend_size)


def series_name(row: Row) -> str:
    """A row's line: every axis but the worker count."""
    return f"{row.config.workload}/{row.config.preset} {row.config.describe(leave_out=('num_workers',))}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    save_figure(plt, fig, path)
    return path


def save_figure(plt: Any, fig: Any, path: Path, dpi: int = 120) -> None:
    """``fig`` laid out, drawn in the format of ``path``'s suffix and written as a new file renamed into place
    (:func:`suite.fileio.write_bytes_atomic`: a link at ``path`` is replaced, never written through); closed."""
    import io

    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix.lstrip(".") or "png", dpi=dpi)
    plt.close(fig)
    write_bytes_atomic(path, image.getvalue())


def lines_of(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """The plotted lines: the rows of one result set whose configurations differ in the worker count alone, by
    worker count; points of different sets or different configurations are never joined. Named by set and
    :func:`series_name`, with the configuration id (less its worker count) where two lines would share a name."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        key = (row.set_label, dataclasses.replace(row.config, num_workers=0).config_id)
        groups.setdefault(key, []).append(row)
    names = [plot_text((f"{label}: " if label else "") + series_name(members[0]))
             for (label, _), members in groups.items()]
    lines = {}
    for name, ((_, config_id), members) in zip(names, groups.items(), strict=True):
        members.sort(key=lambda r: r.config.num_workers)
        lines[name if names.count(name) == 1 else f"{name} [{config_id}]"] = members
    return lines


def plot(rows: Sequence[Row], directory: Path) -> list[Path]:
    """Write throughput.png and memory.png into ``directory``; returns their paths."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    series = lines_of(rows)
    workers = sorted({r.config.num_workers for r in rows})

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, members in series.items():
        ax.plot([r.config.num_workers for r in members], [r.metrics[THROUGHPUT] for r in members], marker="o",
                label=name)
    finish_workers_axis(ax, "Training throughput vs loader workers", "throughput (samples/s, measured steps)",
                        workers, 8)
    throughput_png = _save(plt, fig, directory / "throughput.png")

    fig, (host, device) = plt.subplots(1, 2, figsize=(12, 5))
    for name, members in series.items():
        xs = [r.config.num_workers for r in members]
        colour = None  # one colour per series: anon solid, PSS dash-dotted, RSS dashed
        for (key, label), style in zip(HOST_RAM_FIGURES, ("-", "-.", "--"), strict=True):
            what = label.removeprefix("host ")
            ys = [r.metrics.get(key, float("nan")) / MiB for r in members]
            (line,) = host.plot(xs, ys, style, marker="o", color=colour, label=f"{name} ({what})")
            colour = line.get_color()
        device.plot(xs, [r.metrics.get(DEVICE_PEAK_MEMORY_BYTES, float("nan")) / MiB for r in members],
                    marker="o", label=name)
    finish_workers_axis(host, "Host RAM peak: training process + loader workers", "MiB", workers, 7)
    on_host = any(r.device_memory_is_host for r in rows)
    finish_workers_axis(device, "Device peak memory" + ("\n(no memory of its own: the training process's host peak)"
                                                        if on_host else ""), "MiB", workers, 7)
    memory_png = _save(plt, fig, directory / "memory.png")
    return [throughput_png, memory_png]

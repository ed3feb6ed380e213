"""The report's charts (matplotlib, Agg), drawn like a published benchmark's: grouped bars per device, one bar per
``dataloader_num_workers`` value, the on-device-decode bars beside; plus host RAM and device memory.

Each chart is returned as a :class:`Chart` holding the figure as SVG (embedded in the HTML as a data URI) and PNG
(written beside the Markdown twin).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from suite.analysis.host_ram_figures import HOST_RAM_FIGURES
from suite.figures import DEVICE_PEAK_MEMORY_BYTES

MiB = 2**20

#: Bar colour per loader: the CPU loader as plain bars, on-device decode in a contrasting colour.
LOADER_COLOURS = {"cpu": "#4c72b0", "cpu-fast": "#55a868", "device": "#dd8452", "dali": "#c44e52"}


@dataclass(frozen=True)
class Bar:
    group: str  # the device (and whatever else sets this bar's group apart)
    loader: str
    workers: int
    value: float
    low: float | None = None  # 95 % interval, when known
    high: float | None = None
    flagged: bool = False  # measured on a busy host


@dataclass(frozen=True)
class Chart:
    name: str
    title: str
    svg: str
    png: bytes


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt: Any, fig: Any, name: str, title: str) -> Chart:
    fig.tight_layout()
    svg, png = io.StringIO(), io.BytesIO()
    fig.savefig(svg, format="svg")
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return Chart(name, title, svg.getvalue(), png.getvalue())


def _holds(bar: Bar) -> bool:
    """Whether the bar's interval holds its value (up to rounding: 20,000 equal runs give an interval a last bit
    off their score); an interval that does not is not drawn."""
    slack = 1e-9 * abs(bar.value)
    return (bar.low or 0.0) <= bar.value + slack and bar.value - slack <= (bar.high or 0.0)


def worker_ticks(members: Sequence[Bar]) -> list[str]:
    """A group's tick labels: the worker count, and the loader too where the group has several (Gaudi2's cpu and
    device bars at workers 2 read "2 cpu" and "2 device", not "2 2")."""
    several = len({b.loader for b in members}) > 1
    return [f"{b.workers}\n{b.loader}" if several else f"{b.workers}" for b in members]


def grouped_bars(name: str, title: str, bars: Sequence[Bar], ylabel: str,
                 value_text: Callable[[float], str] = lambda v: f"{v:.1f}") -> Chart:
    """Bars grouped by :attr:`Bar.group`; inside a group the CPU loader's bars by worker count first, then the
    other loaders'; each bar labelled with its value, an interval drawn where known, busy-host bars hatched."""
    plt = _pyplot()
    groups = list(dict.fromkeys(b.group for b in bars))
    loaders = list(dict.fromkeys(sorted((b.loader for b in bars), key=lambda name: (name != "cpu", name))))
    width = max(6.0, 1.0 + 0.55 * len(bars) + 0.6 * len(groups))
    fig, ax = plt.subplots(figsize=(min(width, 16.0), 4.6))
    x, ticks, labels, centres = 0.0, [], [], []
    for group in groups:
        members = sorted((b for b in bars if b.group == group), key=lambda b: (loaders.index(b.loader), b.workers))
        start = x
        for bar in members:
            colour = LOADER_COLOURS.get(bar.loader, "#8172b3")
            ax.bar(x, bar.value, width=0.8, color=colour, hatch="//" if bar.flagged else None,
                   edgecolor="black" if bar.flagged else colour)
            if bar.low is not None and bar.high is not None and _holds(bar):
                ax.errorbar(x, bar.value, yerr=[[max(0.0, bar.value - bar.low)], [max(0.0, bar.high - bar.value)]],
                            color="black", capsize=3, linewidth=1)
            top = max(bar.value, bar.high or bar.value)  # above the interval, not under its whisker
            ax.text(x, top, value_text(bar.value), ha="center", va="bottom", fontsize=8)
            ticks.append(x)
            x += 1.0
        labels += worker_ticks(members)
        centres.append(((start + x - 1.0) / 2, group))
        x += 0.8
    ax.set_xticks(ticks, labels=labels, fontsize=8)
    for centre, group in centres:
        ax.annotate(group, (centre, 0), xycoords=("data", "axes fraction"), xytext=(0, -28),
                    textcoords="offset points", ha="center", va="top", fontsize=9, fontweight="bold")
    ax.set_xlabel("dataloader_num_workers, grouped by device", labelpad=30)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0, top=max(b.high or b.value for b in bars) * 1.3 if bars else 1)  # room for labels, legend
    ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=LOADER_COLOURS.get(name, "#8172b3")) for name in loaders]
    names = [f"loader {name}" for name in loaders]
    if any(b.flagged for b in bars):
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="//"))
        names.append("busy host while measured")
    ax.legend(handles, names, fontsize=8, loc="upper left")
    return _finish(plt, fig, name, title)


#: the legend of each of :data:`HOST_RAM_FIGURES`' bars
_HOST_RAM_LEGEND = ("anon: allocated (compare by this)", "PSS: + share of the libraries",
                    "RSS: shared pages per process")


def memory_bars(rows: Sequence[Any], group_of: Callable[[Any], str]) -> Chart:
    """Host RAM peaks (anon, PSS, RSS) and the device peak per configuration; on a CPU the device figure is the
    training process's RSS high-water mark (VmHWM), labelled so."""
    plt = _pyplot()
    labels = [f"{group_of(r)}\n{r.config.num_workers} worker{'' if r.config.num_workers == 1 else 's'}"
              + (f"\nloader {r.config.loader}" if len({x.config.loader for x in rows}) > 1 else "") for r in rows]
    fig, (host, device) = plt.subplots(1, 2, figsize=(min(16.0, 4.0 + 1.1 * len(rows)), 4.6))
    xs = list(range(len(rows)))
    width = 0.8 / len(HOST_RAM_FIGURES)
    for n, ((key, _), what) in enumerate(zip(HOST_RAM_FIGURES, _HOST_RAM_LEGEND, strict=True)):
        host.bar([x + (n - (len(HOST_RAM_FIGURES) - 1) / 2) * width for x in xs],
                 [r.metrics.get(key, math.nan) / MiB for r in rows], width=width, label=what)  # unrecorded: no bar
    host.set_title("Host RAM peak: training process + loader workers", fontsize=10, wrap=True)
    host.set_ylabel("MiB")
    tallest = max((r.metrics.get(k, 0.0) / MiB for r in rows for k, _ in HOST_RAM_FIGURES), default=1.0)
    host.set_ylim(0, tallest * 1.35 or 1)  # the legend sits above the tallest bar, never over it
    host.legend(fontsize=8, loc="upper left")
    on_host = [r.device_memory_is_host for r in rows]
    device.bar(xs, [r.metrics.get(DEVICE_PEAK_MEMORY_BYTES, 0.0) / MiB for r in rows],
               color=["#bbbbbb" if host else "#dd8452" for host in on_host])
    device.set_title("Device peak memory" + (" (grey: a device with no memory of its own, the training process's "
                                             "host high-water mark)" if any(on_host) else ""),
                     fontsize=9 if any(on_host) else 11, wrap=True)
    device.set_ylabel("MiB")
    for axis in (host, device):
        axis.set_xticks(xs, labels=labels, fontsize=7)
        axis.grid(axis="y", alpha=0.3)
    return _finish(plt, fig, "memory", "Host RAM and device memory")

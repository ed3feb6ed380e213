"""The host RAM figures every run records, and how the tables, the report and the plots show them.

Three peaks over the run, of the same process tree (the training process and its loader workers), read by
:mod:`suite.meters.host_ram`:

* ``host_ram_peak_pss_anon_bytes`` (**host anon**): the anonymous part of PSS (``Pss_Anon + Pss_Shmem``), what the
  processes allocated themselves (heap, tensors, batches in shared memory), the pages they share among themselves
  split between them. The figure to compare configurations by: it moves neither with other processes that map
  the same libraries (the runner, a configuration process started ahead of its turn and idle) nor with how the
  page cache came to hold those libraries.
* ``host_ram_peak_pss_bytes`` (**host PSS**): that plus the tree's share of the file pages it maps (torch's and
  transformers' libraries): nearer to what the tree costs the machine, but the share moves with both of those
  (here by 10-20 MiB with a configuration's place in the matrix; docs/performance.md).
* ``host_ram_peak_rss_bytes`` (**host RSS**): every resident page counted once per process, shared ones again in
  every worker: what ``top`` shows, an upper bound.
"""

from __future__ import annotations

from typing import Mapping

from suite.figures import HOST_RAM_PEAK_PSS_ANON_BYTES, HOST_RAM_PEAK_PSS_BYTES, HOST_RAM_PEAK_RSS_BYTES

#: (metric, label) in the order every table, chart and plot shows them; the first is the one configurations are
#: compared by
HOST_RAM_FIGURES: tuple[tuple[str, str], ...] = (
    (HOST_RAM_PEAK_PSS_ANON_BYTES, "host anon"),
    (HOST_RAM_PEAK_PSS_BYTES, "host PSS"),
    (HOST_RAM_PEAK_RSS_BYTES, "host RSS"),
)
COMPARED = HOST_RAM_FIGURES[0][0]

#: Printed under a table that shows them.
HOST_RAM_NOTE = ("host RAM, peaks of the training process + its loader workers: anon = what they allocated (the "
                 "anonymous part of PSS; compare configurations by it), PSS = that + their share of the libraries' "
                 "pages (moves with other processes mapping them and with the page cache), RSS = every page counted "
                 "per process")


def compared_bytes(metrics: Mapping[str, float]) -> float | None:
    """The host RAM figure configurations are compared by (``None`` where the run did not record it: a run of a
    suite older than the figure, or a machine without ``/proc/PID/smaps_rollup``). Never PSS in its place: the two
    differ by the libraries' pages, so a comparison mixing them would not be one."""
    value = metrics.get(COMPARED)
    return None if value is None else float(value)

"""A reproducible, MLPerf-style accelerator benchmark suite.

The core (this package) is generic: workloads and device adapters are plugins found through the
entry-point groups ``suite.workloads`` and ``suite.devices``.
"""

__version__ = "0.1.0"

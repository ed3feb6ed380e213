"""Workload plugins for the suite, registered in the ``suite.workloads`` entry-point group."""

"""The suite's MLPerf-format compliance rulesets (YAML for MLCommons' checker; see :mod:`suite.results.mlperf_rules`).

A package so that a ruleset's own rules can find this folder: the checker joins a chained file's path to its own
package folder, so our entry file chains the benchmark files by absolute path, found through this package.
"""

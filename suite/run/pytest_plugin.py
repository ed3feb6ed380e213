"""pytest-benchmark integration (registered as a ``pytest11`` plugin).

The ``suite_benchmark`` fixture runs one suite configuration in the test process under
``benchmark.pedantic``: each round is one training step (warm-up steps are pytest-benchmark's warm-up
rounds), timed with the suite's clock, which synchronizes the device before reading it. The step-time
statistics are pytest-benchmark's; ``benchmark.extra_info`` carries the configuration and every metric
of results.json (throughput, step-time percentiles, data-wait, device peak memory, host RAM RSS/PSS over
the test process and its loader workers, loss digest), so ``--benchmark-json`` and
``--benchmark-compare`` work as pytest-benchmark users expect. Machine info gains the suite's device
and package facts.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import pytest

from suite.config import DEFAULT_STEPS, DEFAULT_WARMUP_STEPS, RunConfig
from suite.devices.base import prepare_device
from suite.figures import HOST_RAM_PEAK_PSS_ANON_BYTES, HOST_RAM_PEAK_PSS_BYTES, HOST_RAM_PEAK_RSS_BYTES
from suite.meters.host_ram import HostRamSampler
from suite.registry import device_names, load_device, load_workload
from suite.results.environment import git_state, package_versions
from suite.results.record import FINISHED, RunResult
from suite.run.steps import TrainingSteps


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("suite", "suite benchmarks (suite_benchmark fixture)")
    group.addoption("--suite-steps", type=int, default=DEFAULT_STEPS,
                    help="measured steps (benchmark rounds) per configuration (default: %(default)s)")
    group.addoption("--suite-warmup-steps", type=int, default=DEFAULT_WARMUP_STEPS,
                    help="warm-up steps (benchmark warm-up rounds) per configuration (default: %(default)s)")


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:

    devices = {}
    for name in device_names():
        adapter_cls = load_device(name)
        availability = adapter_cls.availability()
        facts: dict[str, Any] = {"available": availability.available, "reason": availability.reason,
                                 **availability.details}
        if availability.available:  # the adapter's own facts: device name, count, driver, memory...
            adapter = adapter_cls()
            try:
                adapter.setup()
                facts.update(adapter.facts())
            finally:
                adapter.teardown()
        devices[name] = facts
    machine_info["suite"] = {"devices": devices, "packages": package_versions(), **git_state()}


def run_benchmark(benchmark: Any, config: RunConfig) -> RunResult:
    """Run ``config`` (batch size resolved) in this process under ``benchmark.pedantic``."""

    workload_cls = load_workload(config.workload)
    workload_cls.prepare(config)
    result = RunResult(config=config, status=FINISHED, started_at=time.time())
    adapter = load_device(config.device)()
    workload = None
    try:
        adapter.setup()
        prepare_device(config, adapter)
        workload = workload_cls(config, adapter)
        workload.setup()
        steps = TrainingSteps(config, adapter, workload, losses=result.losses)

        def one_step() -> None:
            steps.start_clock()
            steps.step()

        adapter.memory().reset_peak()
        with HostRamSampler(os.getpid()) as sampler:
            benchmark.pedantic(one_step, rounds=config.steps, warmup_rounds=config.warmup_steps, iterations=1)
        steps.record(result)
        result.metrics.update(workload.metrics())
        ram = sampler.peak()
        result.metrics[HOST_RAM_PEAK_RSS_BYTES] = float(ram.peak_rss_bytes)
        if ram.peak_pss_bytes is not None:
            result.metrics[HOST_RAM_PEAK_PSS_BYTES] = float(ram.peak_pss_bytes)
        if ram.peak_pss_anon_bytes is not None:
            result.metrics[HOST_RAM_PEAK_PSS_ANON_BYTES] = float(ram.peak_pss_anon_bytes)
        result.facts["device"] = adapter.facts()
        result.facts["workload"] = workload.facts()
    finally:
        if workload is not None:
            workload.teardown()
        adapter.teardown()
        result.ended_at = time.time()
    benchmark.extra_info.update({"config": config.to_dict(), **result.metrics, "loss_digest": result.loss_digest})
    return result


@pytest.fixture
def suite_benchmark(benchmark: Any, request: pytest.FixtureRequest) -> Callable[..., RunResult]:
    """``suite_benchmark(workload=..., preset=..., device=..., num_workers=..., loader=..., precision=...)``
    runs that configuration under pytest-benchmark and returns its :class:`~suite.results.record.RunResult`."""

    def run(**fields: Any) -> RunResult:

        fields.setdefault("steps", request.config.getoption("--suite-steps"))
        fields.setdefault("warmup_steps", request.config.getoption("--suite-warmup-steps"))
        config = RunConfig(**fields)
        if config.batch_size is None:
            preset = load_workload(config.workload).presets[config.preset]
            config = RunConfig(**{**config.to_dict(), "batch_size": preset.batch_size})
        benchmark.group = f"{config.workload}-{config.preset}-{config.device}"
        return run_benchmark(benchmark, config)

    return run

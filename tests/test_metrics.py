"""Metric computation: percentiles, throughput, data-wait accounting (fake clock and a slowed loader)."""

import time

import numpy as np
import pytest

from suite.config import RunConfig
from suite.devices.cpu import CPUAdapter
from suite.run.training import train as _train
from suite.results.record import RunResult, StepStats
from suite.meters.timing import StepTimer, StepTiming
from suite.workload import Workload

pytestmark = pytest.mark.mechanics  # nothing here depends on the transformers line


def test_step_stats_from_known_samples():
    times = tuple(float(t) for t in range(1, 101))  # 1..100 s
    waits = tuple(t / 4 for t in times)
    stats = StepStats(times, waits, samples_per_step=8)
    assert stats.measured_steps == 100
    assert stats.measured_wall_s == pytest.approx(5050.0)
    assert stats.throughput_samples_per_s == pytest.approx(800 / 5050.0)
    assert stats.step_time_p50_s == pytest.approx(50.5)
    assert stats.step_time_p90_s == pytest.approx(np.percentile(times, 90))
    assert stats.step_time_p99_s == pytest.approx(99.01)
    assert stats.data_wait_fraction == pytest.approx(0.25)
    assert set(stats.as_dict()) == set(StepStats.fields)


def test_step_stats_rejects_empty_and_mismatched():
    with pytest.raises(ValueError):
        StepStats((), (), 8)
    with pytest.raises(ValueError):
        StepStats((1.0,), (), 8)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_step_timer_is_back_to_back_and_synchronizes():
    clock, syncs = FakeClock(), []
    timer = StepTimer(lambda: syncs.append(clock.now), clock=clock)
    timer.start()
    timings = []
    for wait, compute in [(3.0, 1.0), (0.5, 2.0)]:
        clock.now += wait
        timer.batch_ready()
        clock.now += compute
        timings.append(timer.step_done())
    assert timings == [StepTiming(4.0, 3.0), StepTiming(2.5, 0.5)]
    assert sum(t.step_time_s for t in timings) == clock.now  # nothing escapes the accounting
    assert syncs == [0.0, 4.0, 6.5]  # before the first clock read and before each step end


def test_step_timer_misuse_is_an_error():
    timer = StepTimer(lambda: None)
    with pytest.raises(RuntimeError):
        timer.batch_ready()


class SleepyWorkload(Workload):
    """A stand-in workload whose loader and step take known (sleep) times."""

    name = "sleepy"
    presets = {}
    default_preset = "x"

    def __init__(self, config, device, load_s, compute_s, batch=4):
        super().__init__(config, device)
        self.load_s, self.compute_s, self.batch = load_s, compute_s, batch

    def setup(self):
        pass

    def batches(self):
        import torch

        while True:
            time.sleep(self.load_s)
            yield torch.zeros(self.batch)

    def train_step(self, batch):
        import torch

        time.sleep(self.compute_s)
        return torch.tensor(1.0)

    def count_samples(self, batch):
        return int(batch.shape[0])


def _run_sleepy(load_s, compute_s, batch=4):
    config = RunConfig(workload="sleepy", preset="x", device="cpu", num_workers=0, loader="cpu", precision="fp32",
                       steps=6, warmup_steps=1, batch_size=4)
    adapter = CPUAdapter()
    adapter.setup()
    result = RunResult(config=config, status="RUNNING")
    _train(config, adapter, SleepyWorkload(config, adapter, load_s, compute_s, batch), result, lambda **_: None)
    return result


def test_data_wait_fraction_with_a_slowed_loader():
    slow_loader = _run_sleepy(load_s=0.05, compute_s=0.0)
    slow_step = _run_sleepy(load_s=0.0, compute_s=0.05)
    assert slow_loader.metrics["data_wait_fraction"] > 0.9
    assert slow_step.metrics["data_wait_fraction"] < 0.1
    # throughput counts measured steps only: 6 steps x 4 samples over their wall time
    m = slow_loader.metrics
    assert m["measured_steps"] == 6
    assert m["throughput_samples_per_s"] == pytest.approx(24 / m["measured_wall_s"])
    assert len(slow_loader.losses) == 7  # warm-up losses are kept too


def test_batch_size_mismatch_is_a_failure():
    from suite.errors import SuiteError

    with pytest.raises(SuiteError, match="batch of 3 samples but the recorded batch size is 4"):
        _run_sleepy(0.0, 0.0, batch=3)


def test_loss_digest_is_exact_and_round_trips():
    from suite.results.record import loss_digest

    losses = [2.1, 2.0999999999999996, float.fromhex("0x1.0cccccp+1")]
    assert loss_digest(losses) != loss_digest([2.1, 2.1, losses[2]])  # one ulp apart is a different trajectory
    result = RunResult(config=RunConfig(workload="w", preset="p", device="cpu", num_workers=0, loader="cpu",
                                         precision="fp32"), status="FINISHED", losses=losses)
    data = result.to_dict()
    assert float.fromhex(data["losses_hex"][2]) == losses[2] and data["loss_digest"] == loss_digest(losses)
    assert RunResult.from_dict(data).losses == losses
    data["losses_hex"][0] = (2.2).hex()
    with pytest.raises(ValueError, match="loss_digest does not match"):
        RunResult.from_dict(data)

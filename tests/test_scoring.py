import pytest

from suite.config import RunConfig
from suite.results.record import RunResult
from suite.analysis.scoring import score_repeats

pytestmark = pytest.mark.mechanics

CONFIG = dict(workload="w", preset="p", device="cpu", num_workers=0, loader="cpu", precision="fp32", steps=5,
              warmup_steps=1, seed=1, batch_size=8, dataset=None, weights=None)


def _runs(values, statuses=None, losses=None):
    statuses = statuses or ["FINISHED"] * len(values)
    return [RunResult(config=RunConfig.from_dict(CONFIG), status=s, repeat=i, metrics={"throughput_samples_per_s": v},
                      losses=list(losses or [1.0, 0.5]), reason=None if s == "FINISHED" else "boom")
            for i, (v, s) in enumerate(zip(values, statuses))]


def test_mlperf_style_drops_highest_and_lowest():
    score = score_repeats(_runs([10.0, 50.0, 12.0, 11.0, 1.0]))
    assert score.throughput_score == pytest.approx((10 + 12 + 11) / 3)
    assert set(score.dropped_repeats) == {1, 4}
    assert score.throughput_cv == pytest.approx(19.0709 / 16.8, abs=1e-4)  # sample stdev / mean of all five
    assert score.status == "FINISHED" and score.loss_digests_identical


def test_fewer_than_three_repeats_average_all_and_say_so():
    score = score_repeats(_runs([10.0, 20.0]))
    assert score.throughput_score == 15.0 and score.dropped_repeats == ()
    assert "nothing dropped" in score.method
    single = score_repeats(_runs([7.0]))
    assert single.throughput_score == 7.0 and single.throughput_cv is None


def test_a_failed_repeat_fails_the_score_and_is_not_dropped():
    score = score_repeats(_runs([10.0, 10.0, 10.0], statuses=["FINISHED", "FAILED", "FINISHED"]))
    assert score.status == "FAILED" and score.throughput_score is None
    assert score.reason == "repeat 1 of 3 FAILED: boom"


def test_differing_loss_trajectories_are_reported():
    runs = _runs([1.0, 1.0])
    runs[1].losses = [1.0, 0.5000001]
    assert not score_repeats(runs).loss_digests_identical


def test_mixed_configurations_are_rejected():
    runs = _runs([1.0, 1.0])
    runs[1].config = {**CONFIG, "seed": 2}
    with pytest.raises(ValueError, match="different configurations"):
        score_repeats(runs)

import pytest

from suite.config import MatrixSpec, RunConfig
from suite.errors import ConfigError

pytestmark = pytest.mark.mechanics


def _config(**overrides):
    base = dict(workload="bridgetower", preset="tiny", device="cpu", num_workers=0, loader="cpu", precision="fp32")
    return RunConfig(**{**base, **overrides})


def test_matrix_expands_every_combination_in_stable_order():
    spec = MatrixSpec(workload="w", preset="p", devices=("cpu", "h100"), workers=(0, 2), loaders=("cpu", "device"),
                      precisions=("fp32", "bf16"))
    configs = spec.expand()
    assert len(configs) == 2 * 2 * 2 * 2
    assert len({c.config_id for c in configs}) == len(configs)
    assert [(c.device, c.num_workers) for c in configs[:2]] == [("cpu", 0), ("cpu", 2)]
    assert {c.device for c in configs[8:]} == {"h100"}


def test_default_matrix_is_cpu_workers_0_1_2():
    configs = MatrixSpec(workload="bridgetower", preset="tiny").expand()
    assert [(c.device, c.num_workers, c.loader, c.precision) for c in configs] == [
        ("cpu", 0, "cpu", "fp32"), ("cpu", 1, "cpu", "fp32"), ("cpu", 2, "cpu", "fp32")]


@pytest.mark.parametrize("field,value,message", [
    ("num_workers", -1, "num_workers must be >= 0"),
    ("steps", 0, "steps must be >= 1"),
    ("warmup_steps", -2, "warmup_steps must be >= 0"),
    ("batch_size", 0, "batch_size must be >= 1"),
    ("precision", "fp8", "precision must be one of fp32, bf16"),
    ("loader", "gpu", "loader must be one of cpu, cpu-fast, device, dali"),
    ("num_workers", 1.5, "num_workers must be an integer"),
    ("device", "", "device must be a non-empty string"),
])
def test_invalid_values_name_the_field_and_valid_range(field, value, message):
    with pytest.raises(ConfigError, match=message):
        _config(**{field: value})


def test_unknown_keys_are_rejected_by_name():
    data = _config().to_dict() | {"num_wrokers": 2}
    with pytest.raises(ConfigError, match="unknown config field.*num_wrokers"):
        RunConfig.from_dict(data)


def test_round_trip_and_params():
    config = _config(batch_size=8)
    assert RunConfig.from_dict(config.to_dict()) == config
    params = config.as_params()
    assert params["batch_size"] == "8" and params["dataset"] == "default"


def test_matrix_rejects_empty_and_duplicate_axes():
    with pytest.raises(ConfigError, match="workers must list at least one value"):
        MatrixSpec(workload="w", preset="p", workers=())
    with pytest.raises(ConfigError, match="lists a value twice"):
        MatrixSpec(workload="w", preset="p", workers=(1, 1))

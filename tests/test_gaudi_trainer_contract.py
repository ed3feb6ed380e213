"""Engine hf-trainer on Gaudi2 against the REAL optimum-habana 1.21.2 (issue 25, defect 1).

optimum-habana pins transformers 4.55, so these tests run in tox env ``test-transformers455`` (which installs it) and
are skipped in env ``test`` (transformers 5); in CI's 4.55 env they must run. What is replaced, and why:

* Habana's PyTorch bridge, ``habana_frameworks.torch`` (not on PyPI): the stand-in of ``tests/standins/habana_bridge.py``,
  whose ``utils.internal.is_lazy()`` says which mode the bridge runs.
* The ``habana-torch-plugin`` distribution's metadata, which ``import optimum.habana`` looks for with ``pip list``
  (``optimum/habana/utils/misc.py``): a dist-info folder on ``PYTHONPATH``.
* ``optimum.habana.transformers.modeling_utils`` (it imports the bridge's fused kernels at import time): a module whose
  ``adapt_transformers_to_gaudi`` records that the arguments' device set-up called it.

Everything else is the installed optimum-habana and accelerate: ``GaudiConfig``, ``GaudiTrainer``,
``GaudiTrainingArguments`` and its ``_setup_devices`` (reached by reading ``n_gpu``), whose eager-mode check is the
defect. accelerate finds no ``torch.hpu`` in this CPU build of torch and sets up the CPU, as on a host without a card.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import types

import pytest

from suite.devices.base import run_params

from suite.config import RunConfig
from suite.devices.gaudi2 import Gaudi2Adapter

pytestmark = pytest.mark.hardware_contract


@pytest.fixture
def real_optimum_habana(monkeypatch, tmp_path):
    import transformers

    from standins import habana_bridge

    try:
        importlib.metadata.version("optimum-habana")  # installed? (importing it needs the set-up below)
    except importlib.metadata.PackageNotFoundError as exc:
        if os.environ.get("CI") and transformers.__version__.startswith("4.55."):
            raise  # tox env test-transformers455 installs it: missing there is a failure
        pytest.skip(f"optimum-habana is not installed here ({exc}); it pins transformers 4.55: tox env "
                    "test-transformers455 runs this")
    dist = habana_bridge.plugin_distribution(tmp_path / "dist")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(dist), os.environ.get("PYTHONPATH")])))
    # the `pip` it runs is this environment's (as in an activated environment; tox puts it first on PATH too)
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    optimum_habana = importlib.import_module("optimum.habana")  # runs its check_synapse_version (pip list)
    calls, state = habana_bridge.Calls(), habana_bridge.default_state()
    habana_bridge.install(monkeypatch, calls, state)
    monkeypatch.setitem(sys.modules, "optimum.habana.transformers.modeling_utils", types.SimpleNamespace(
        adapt_transformers_to_gaudi=lambda: calls.record("adapt_transformers_to_gaudi")))
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "restored-below")
    monkeypatch.delenv("PT_HPU_LAZY_MODE")  # unset, as on a current Habana stack; unset again after the test
    return optimum_habana, calls, state


def _config(precision: str) -> RunConfig:
    return RunConfig(workload="bridgetower", preset="tiny", device="gaudi2", num_workers=2, loader="cpu",
                     precision=precision, engine="hf-trainer", steps=3, warmup_steps=1, batch_size=8)


def test_the_library_refuses_eager_mode_when_the_variable_is_unset(real_optimum_habana, tmp_path):
    """What the defect was, shown on the installed library: use_lazy_mode=False with PT_HPU_LAZY_MODE unset raises
    once the device set-up runs, because an unset variable reads as lazy there."""
    optimum_habana, _, _ = real_optimum_habana
    with pytest.raises(ValueError, match="eager mode should be enabled using PT_HPU_LAZY_MODE=0"):
        optimum_habana.GaudiTrainingArguments(output_dir=str(tmp_path), use_habana=True, use_lazy_mode=False,
                                              report_to=[]).n_gpu  # (1.21.2's __post_init__ already reads it)


@pytest.mark.parametrize("lazy, variable", [(False, "0"), (True, "1")])
def test_hf_trainer_arguments_on_gaudi2_set_up_in_the_bridges_mode(real_optimum_habana, lazy, variable):
    from workloads.bridgetower.presets import PRESETS
    from workloads.bridgetower.trainer_engine import trainer_arguments

    optimum_habana, calls, state = real_optimum_habana
    state["lazy"] = lazy
    adapter = Gaudi2Adapter()
    adapter.setup()
    assert os.environ["PT_HPU_LAZY_MODE"] == variable  # set from the bridge's answer
    recorded = run_params(adapter)
    assert recorded["hpu.mode"] == ("lazy" if lazy else "eager") and recorded["hpu.PT_HPU_LAZY_MODE"] == variable
    assert recorded["hpu.PT_HPU_LAZY_MODE_found"] == "unset"
    trainer_cls, args, extra = trainer_arguments(_config("fp32"), PRESETS["tiny"], adapter)
    assert trainer_cls is optimum_habana.GaudiTrainer
    assert isinstance(args, optimum_habana.GaudiTrainingArguments) and args.use_lazy_mode is lazy
    assert args.n_gpu == 0 and ("adapt_transformers_to_gaudi",) in calls  # the real device set-up ran through
    gaudi_config = extra["gaudi_config"]
    assert isinstance(gaudi_config, optimum_habana.GaudiConfig)
    assert (gaudi_config.use_fused_adam, gaudi_config.use_fused_clip_norm, gaudi_config.use_torch_autocast) == \
        (True, True, False)  # fp32 runs without autocast (optimum-habana turns it on whenever asked)


def test_bf16_asks_the_real_gaudi_config_for_autocast(real_optimum_habana):
    from workloads.bridgetower.presets import PRESETS
    from workloads.bridgetower.trainer_engine import trainer_arguments

    _, _, state = real_optimum_habana
    state["lazy"] = False
    adapter = Gaudi2Adapter()
    adapter.setup()
    _, args, extra = trainer_arguments(_config("bf16"), PRESETS["tiny"], adapter)
    assert args.bf16 is True and extra["gaudi_config"].use_torch_autocast is True

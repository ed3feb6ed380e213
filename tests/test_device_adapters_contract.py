"""Contract tests for the CUDA (cuda/h100/a100) and Gaudi2 adapters, with STAND-IN modules.

No GPU or Gaudi exists here. What each stand-in models:

* ``torch.cuda``'s own functions (torch 2.13's ``torch/cuda/__init__.py`` and ``memory.py``: ``get_device_name``,
  ``max_memory_allocated``...) are monkeypatched on the installed torch, so their names are checked by monkeypatch
  itself (``raising=True``); card names are the strings CUDA reports for those products.
* ``pynvml``: nvidia-ml-py 12.x (``pynvml.py``: ``nvmlDeviceGetComputeRunningProcesses`` returns objects with
  ``pid`` and ``usedGpuMemory``, ``nvmlDeviceGetMemoryInfo`` one with ``used``, bytes).
* ``torchvision.io``: torchvision 0.28 (``decode_jpeg(list[Tensor], mode=ImageReadMode.RGB, device="cuda")``), which
  does not import beside torch 2.13 here.
* ``habana_frameworks.torch``: Intel Gaudi's PyTorch bridge 1.21 (not on PyPI, so no installed copy to check):
  ``hpu.*``, ``core.mark_step``, ``hpex.optimizers.FusedAdamW``, ``hpex.normalization.FusedClipNorm`` and
  ``utils.internal.is_lazy()``, which reports the mode the bridge runs.

The tests check that each adapter calls those APIs for availability, sync, seeding, memory and decoding, and that
an unavailable device becomes a FAILED run with the reason, never another device.
"""

import sys
import types
from pathlib import Path

import pytest

from suite.devices.base import child_environment, run_params
import torch

from suite.cli import main
from suite.devices.cuda import A100Adapter, CUDAAdapter, H100Adapter, peak_flops
from suite.devices.gaudi2 import GAUDI2_PEAK_BF16_FLOPS, Gaudi2Adapter
from suite.errors import DeviceUnavailableError, SuiteError

from conftest import runs_of

pytestmark = pytest.mark.mechanics


class Calls(list):
    def record(self, name, *args):
        self.append((name, *args))


@pytest.fixture
def standin_cuda(monkeypatch):
    """torch.cuda as if one card named ``name`` were present; torchvision.io and pynvml stand-ins."""
    calls = Calls()
    state = {"name": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "get_device_name", lambda i=0: state["name"])
    monkeypatch.setattr(cuda, "set_device", lambda d: calls.record("set_device", str(d)))
    monkeypatch.setattr(cuda, "synchronize", lambda d=None: calls.record("synchronize", str(d)))
    monkeypatch.setattr(cuda, "manual_seed_all", lambda s: calls.record("manual_seed_all", s))
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda d=None: calls.record("reset_peak_memory_stats"))
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda d=None: 123 * 2**20)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda d=None: 200 * 2**20)
    monkeypatch.setattr(cuda, "memory_allocated", lambda d=None: 100 * 2**20)
    state["bf16"] = "native"  # or "emulated" (a pre-Ampere card) or "none"
    monkeypatch.setattr(cuda, "is_bf16_supported",
                        lambda including_emulation=True: state["bf16"] == "native"
                        or (including_emulation and state["bf16"] == "emulated"))
    state["uuid"] = "58d2b77a-1c3e-4f05-9ad2-4e8f0d4c3b21"  # as torch reports it: no "GPU-" prefix
    props = types.SimpleNamespace(name=state["name"], major=9, minor=0, total_memory=80 * 2**30, uuid=state["uuid"])

    class Stream:
        def synchronize(self):
            calls.record("stream.synchronize")

    monkeypatch.setattr(cuda, "current_stream", lambda d=None: Stream())
    monkeypatch.setattr(cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)

    def decode_jpeg(tensors, mode=None, device=None):
        calls.record("decode_jpeg", len(tensors), str(mode), str(device))
        return [torch.zeros(3, 4, 5, dtype=torch.uint8) for _ in tensors]

    io = types.ModuleType("torchvision.io")
    io.decode_jpeg = decode_jpeg
    io.ImageReadMode = types.SimpleNamespace(RGB="RGB")
    vision = types.ModuleType("torchvision")
    vision.io = io
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    monkeypatch.setitem(sys.modules, "torchvision.io", io)

    import os

    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: calls.record("nvmlInit")
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    nvml.nvmlDeviceGetHandleByUUID = lambda u: calls.record("nvmlDeviceGetHandleByUUID", u) or ("handle", u)
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=os.getpid(),
                                                                                 usedGpuMemory=300 * 2**20)]
    nvml.nvmlSystemGetDriverVersion = lambda: b"570.86"
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    return calls, state, props


def _set_up(adapter, monkeypatch):
    """setup() without a real CUDA device object: torch.device('cuda', 0) is fine on a CPU build."""
    adapter.setup()
    return adapter


def test_cuda_contract_sync_seed_memory_and_facts(standin_cuda, monkeypatch):
    calls, _, _ = standin_cuda
    adapter = _set_up(H100Adapter(), monkeypatch)
    assert str(adapter.torch_device) == "cuda:0" and ("set_device", "cuda:0") in calls
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    adapter.synchronize()
    assert ("synchronize", "cuda:0") in calls
    adapter.numerics().seed(7)
    assert ("manual_seed_all", 7) in calls
    adapter.memory().reset_peak()
    memory = adapter.memory().peak()
    assert memory.peak_bytes == 123 * 2**20
    assert memory.source.startswith("torch.cuda.max_memory_allocated; driver view: NVML, this process; this "
                                    "process's peak sampled every 0.2 s")
    assert memory.extra == {"reserved_peak": 200 * 2**20, "nvml_process_used_at_end": 300 * 2**20,
                            "nvml_process_used_peak": 300 * 2**20}
    assert ("nvmlDeviceGetHandleByUUID", f"GPU-{standin_cuda[1]['uuid']}") in calls  # the card torch uses
    assert adapter.memory().current_bytes() == 100 * 2**20  # torch.cuda.memory_allocated: the trend's series
    info = adapter.facts()
    assert info["device_name"] == "NVIDIA H100 80GB HBM3" and info["driver_version"] == "570.86"
    assert info["peak_flops"] == {"bf16": pytest.approx(989.4e12), "fp32": pytest.approx(66.9e12)}
    assert info["compute_capability"] == "9.0"
    assert adapter.traits.distributed_backend == "nccl" and adapter.numerics().supported() == ("fp32", "bf16")
    import torch.utils.deterministic

    try:
        torch.backends.cudnn.allow_tf32 = True  # torch's own default
        adapter.numerics().pin_numerics()  # whatever the determinism, fp32 is fp32
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert run_params(adapter)["deterministic_algorithms"] == "false"
        adapter.numerics().make_deterministic()
        assert torch.backends.cudnn.deterministic and torch.are_deterministic_algorithms_enabled()
        # issue 47 (8): determinism without torch filling every torch.empty with NaN (a cost, not a result)
        assert torch.utils.deterministic.fill_uninitialized_memory is False
        params = run_params(adapter)
        assert params["cuda.tf32"] == "false" and params["deterministic_algorithms"] == "true"
        assert params["cuda.cudnn_deterministic"] == "true" and params["fill_uninitialized_memory"] == "false"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        torch.utils.deterministic.fill_uninitialized_memory = True


def test_cuda_contract_decodes_a_batch_with_nvjpeg_and_refuses_non_jpeg(standin_cuda, monkeypatch):
    from suite.decoders.base import DecodeError

    calls, _, _ = standin_cuda
    adapter = _set_up(CUDAAdapter(), monkeypatch)
    decoder = adapter.decoders.for_loader("device")
    assert decoder.name == "nvjpeg" and adapter.decoders.for_loader("dali").name == "dali"
    calls.clear()
    images = decoder([b"\xff\xd8a", b"\xff\xd8b"], 8, (0.5,) * 3, (0.25,) * 3)
    # one call per batch, between a drain of this stream and a device-wide synchronize (pytorch/vision #9606)
    assert len(images) == 2 and calls == [("stream.synchronize",), ("decode_jpeg", 2, "RGB", "cuda:0"),
                                          ("synchronize", "cuda:0")]
    with pytest.raises(DecodeError, match="nvJPEG decodes JPEG only") as failure:
        decoder([b"\xff\xd8a", b"\x89PNG"], 8, (0.5,) * 3, (0.25,) * 3)
    assert failure.value.image_index == 1


def test_cuda_contract_model_adapters_refuse_other_cards(standin_cuda):
    _, state, _ = standin_cuda
    state["name"] = "NVIDIA H200"
    assert not H100Adapter.availability().available
    assert H100Adapter.availability().reason.startswith("device is NVIDIA H200, not a known H100 (known: ")
    assert A100Adapter.availability().reason.startswith("device is NVIDIA H200, not a known A100")
    assert CUDAAdapter.availability().available  # the generic adapter takes any card, and records it
    with pytest.raises(DeviceUnavailableError, match="not a known H100"):
        H100Adapter().setup()


@pytest.mark.parametrize("name, h100, a100", [
    ("NVIDIA H100 80GB HBM3", True, False), ("NVIDIA H100 PCIe", True, False), ("NVIDIA H100 NVL", True, False),
    ("NVIDIA A100-SXM4-80GB", False, True), ("NVIDIA A100 80GB PCIe", False, True),
    ("NVIDIA A100-SXM-80GB", False, True),  # a DGX A100's card, as its driver names it
    # substrings of product names are not products (defect 8: "A100" in "RTX A1000", "H100" in "H100X")
    ("NVIDIA RTX A1000", False, False), ("NVIDIA RTX A1000 6GB Laptop GPU", False, False),
    ("NVIDIA H200 NVL", False, False), ("NVIDIA GeForce RTX 4090", False, False)])
def test_cuda_cards_are_matched_by_exact_product_name(standin_cuda, name, h100, a100):
    _, state, _ = standin_cuda
    state["name"] = name
    assert H100Adapter.availability().available is h100
    assert A100Adapter.availability().available is a100
    if not a100:
        assert A100Adapter.availability().reason.startswith(f"device is {name}, not a known A100")


def test_cuda_peak_flops_table():
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H200 NVL", "bf16") == 835e12  # not the SXM H200's 989.4 (MFU would read 16 % low)
    assert peak_flops("NVIDIA RTX A1000", "bf16") is None  # not an A100: no 312 TFLOP/s
    assert peak_flops("NVIDIA GeForce RTX 4090", "bf16") is None  # unknown: no MFU, never a guess
    # issue 47 (10): an fp32 run's MFU is against the fp32 peak (TF32 off), not the bf16 one (15x higher on H100)
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(66.9e12)
    assert peak_flops("NVIDIA A100-SXM-80GB", "fp32") == 19.5e12


def test_bf16_is_offered_only_where_the_card_computes_it(standin_cuda, monkeypatch):
    """Issue 47 (10): torch's plain is_bf16_supported() says yes on pre-Ampere cards, through emulation."""
    _, state, _ = standin_cuda
    adapter = _set_up(CUDAAdapter(), monkeypatch)
    assert adapter.numerics().supported() == ("fp32", "bf16")
    state["bf16"] = "emulated"
    assert torch.cuda.is_bf16_supported() and adapter.numerics().supported() == ("fp32",)


def test_the_real_is_bf16_supported_takes_the_emulation_switch():
    import inspect

    assert "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters


def test_nvml_finds_the_card_by_the_uuid_torch_reports_whatever_cuda_visible_devices_holds(standin_cuda,
                                                                                          monkeypatch):
    """Issue 47 (10): with CUDA_VISIBLE_DEVICES=GPU-<uuid>, NVML's index was looked up as int("GPU-...")."""
    calls, state, _ = standin_cuda
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"GPU-{state['uuid']}")
    adapter = _set_up(CUDAAdapter(), monkeypatch)
    adapter.memory().reset_peak()
    assert adapter.memory().peak().extra["nvml_process_used_at_end"] == 300 * 2**20
    assert ("nvmlDeviceGetHandleByUUID", f"GPU-{state['uuid']}") in calls


def test_nvml_without_this_process_falls_back_to_the_device_figure_named_as_such(standin_cuda, monkeypatch):
    """In a container NVML lists host PIDs, so this process is not found (defect 10)."""
    import sys as _sys

    nvml = _sys.modules["pynvml"]
    monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: [
        types.SimpleNamespace(pid=4242424, usedGpuMemory=300 * 2**20)], raising=False)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=7 * 2**30, total=80 * 2**30)
    adapter = H100Adapter()
    adapter.setup()
    memory = adapter.memory().peak()
    assert memory.extra == {"reserved_peak": 200 * 2**20, "nvml_device_used_at_end": 7 * 2**30}
    assert "NVML lists no process with this PID" in memory.source and "whole device" in memory.source

    def broken(handle):
        raise RuntimeError("NVML_ERROR_NO_PERMISSION")
    nvml.nvmlDeviceGetComputeRunningProcesses = broken
    memory = adapter.memory().peak()
    assert "nvml" not in " ".join(memory.extra) and "not read: NVML failed (RuntimeError: NVML_ERROR" in memory.source


def test_a_single_process_cuda_configuration_sees_one_gpu(monkeypatch):
    """Defect 7: without the pin, the transformers Trainer wraps the model in nn.DataParallel over all GPUs."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert child_environment(H100Adapter, 1) == {"CUDA_VISIBLE_DEVICES": "0"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert child_environment(CUDAAdapter, 1) == {"CUDA_VISIBLE_DEVICES": "3"}  # the first of those allowed
    assert child_environment(CUDAAdapter, 8) == {}  # torchrun: one rank per GPU, LOCAL_RANK picks it
    from suite.devices.cpu import CPUAdapter

    assert child_environment(CPUAdapter, 1) == {}


def test_a_trainer_that_would_spread_over_gpus_is_refused():
    from workloads.bridgetower.trainer_engine import refuse_data_parallel

    with pytest.raises(SuiteError, match="sees 8 GPUs and would run nn.DataParallel over them"):
        refuse_data_parallel(types.SimpleNamespace(n_gpu=8))
    refuse_data_parallel(types.SimpleNamespace(n_gpu=1))  # one device: fine


def test_the_trainer_on_this_machine_sees_no_gpu_and_passes_the_check():
    """The check reads the real TrainingArguments.n_gpu attribute of the installed transformers."""
    from transformers import TrainingArguments

    from workloads.bridgetower.trainer_engine import refuse_data_parallel

    args = TrainingArguments(output_dir="/tmp/unused", use_cpu=True, report_to=[])
    assert args.n_gpu == 0
    refuse_data_parallel(args)


def test_memory_limit_is_refused_on_cuda_devices_before_anything_runs(tmp_path, capsys):
    """Defect 11: RLIMIT_AS and the CUDA driver's address-space reservation make every run fail 'out of memory'."""
    code = main(["run", "--device", "h100", "--memory-limit", "20", "--workers", "0", "--steps", "1",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--memory-limit caps the address space (RLIMIT_AS)" in err
    assert "leave --memory-limit out for device h100" in err
    assert not (tmp_path / "out").exists()


def test_cuda_reasons_on_this_machine():
    assert CUDAAdapter.availability().reason.startswith("no CUDA device")


# --- Gaudi2 --------------------------------------------------------------------------------------

@pytest.fixture
def standin_habana(monkeypatch):
    """The stand-in bridge (tests/standins/habana_bridge.py), stand-in optimum.habana modules that record calls, and
    the REAL pyhlml over a stand-in libhlml.so (tests/standins/libhlml.py) with 8 cards, module ids 0-7, card i using
    (6 + i) GiB."""
    from standins import habana_bridge
    from standins import libhlml as libhlml_standin

    calls, state = habana_bridge.Calls(), habana_bridge.default_state()
    habana_bridge.install(monkeypatch, calls, state)

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    module("optimum")
    module("optimum.habana")
    module("optimum.habana.transformers")
    module("optimum.habana.transformers.modeling_utils",
           adapt_transformers_to_gaudi=lambda: calls.record("adapt_transformers_to_gaudi"))
    state["libhlml"] = libhlml_standin.install(monkeypatch, libhlml_standin.FakeLibHLML(
        devices=8, used_bytes=[(6 + i) * 2**30 for i in range(8)]))
    for name in ("PT_HPU_LAZY_MODE", "HLS_MODULE_ID", "HABANA_VISIBLE_MODULES"):
        monkeypatch.delenv(name, raising=False)  # the mode is the bridge's answer; the card is found by module id
    monkeypatch.setattr(torch, "device", lambda *a: types.SimpleNamespace(type="hpu", index=None,
                                                                          __str__=lambda self: "hpu"))
    return calls, state


def test_gaudi2_contract_lazy_mode_sync_seed_memory_and_optimizer(standin_habana, monkeypatch):
    calls, _ = standin_habana
    adapter = Gaudi2Adapter()
    adapter.setup()
    adapter.synchronize()
    assert calls[-2:] == [("mark_step",), ("hpu.synchronize",)]  # lazy: mark_step before the device sync
    adapter.training().step_boundary()
    assert calls[-1] == ("mark_step",)
    adapter.numerics().seed(3)
    assert ("hpu_seed", 3) in calls
    adapter.training().prepare_framework()
    assert ("adapt_transformers_to_gaudi",) in calls
    params = [torch.nn.Parameter(torch.ones(2))]
    ops = adapter.training()
    optimizer, description = ops.make_optimizer(params, lr=1e-5, eps=1e-8, weight_decay=0.0)
    assert isinstance(optimizer, torch.optim.Optimizer) and description.startswith("habana_frameworks")
    ops.clip_grad_norm(params, 1.0)
    assert ("FusedClipNorm", 1.0) in calls and ("clip_norm",) in calls
    adapter.memory().reset_peak()
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "3,5")  # local rank 0 holds module 3
    memory = adapter.memory().peak()
    assert memory.peak_bytes == 5 * 2**30
    assert memory.extra == {"allocator_limit": 94 * 2**30, "hlml_device_used_at_end": 9 * 2**30}
    assert adapter.memory().current_bytes() == 3 * 2**30  # hpu.memory_allocated: the trend's series
    params_recorded = run_params(adapter)
    assert params_recorded["hpu.mode"] == "lazy" and "FusedAdamW" in params_recorded["hpu.optimizer"]
    assert params_recorded["hpu.PT_HPU_LAZY_MODE"] == "1" and params_recorded["hpu.PT_HPU_LAZY_MODE_found"] == "unset"
    info = adapter.facts()
    assert info["peak_flops"] == {"bf16": GAUDI2_PEAK_BF16_FLOPS} and info["device_count"] == 8
    assert info["hpu_mode"] == "lazy" and adapter.traits.distributed_backend == "hccl"
    assert adapter.decoders.for_loader("device").name == "habana-media-pipe" and "dali" not in adapter.traits.supported_loaders


@pytest.mark.hardware_contract
@pytest.mark.parametrize("environ, local_rank, module, used_gib", [
    ({"HABANA_VISIBLE_MODULES": "3,5"}, 1, 5, 11),
    ({"HABANA_VISIBLE_MODULES": "3,5", "HLS_MODULE_ID": "7"}, 0, 7, 13),  # the runtime's own choice wins
    ({"HABANA_VISIBLE_MODULES": "2"}, 0, 2, 8),
])
def test_gaudi2_reads_hlml_for_the_card_this_process_holds(standin_habana, monkeypatch, environ, local_rank, module,
                                                           used_gib):
    """Issue 25, defect 9: HLML's index is not the local rank; the card is found by its module id (real pyhlml, the
    libhlml stand-in's cards listed in another order than their module ids). The allocator's Limit is not the card's
    memory: the total is HLML's."""
    _, state = standin_habana
    state["libhlml"].module_ids = [6, 7, 2, 5, 4, 3, 1, 0]  # HLML index i holds module module_ids[i]
    state["libhlml"].used_bytes = [(6 + m) * 2**30 for m in state["libhlml"].module_ids]
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    adapter = Gaudi2Adapter(local_rank=local_rank)
    adapter.setup()
    assert adapter.memory().peak().extra["hlml_device_used_at_end"] == used_gib * 2**30
    info = adapter.facts()
    assert info["hlml_module_id"] == module and info["memory_total_bytes"] == 96 * 2**30
    assert info["allocator_limit_bytes"] == 94 * 2**30
    assert info["pci_bus_id"] == f"0000:{0x19 + state['libhlml'].module_ids.index(module):02x}:00.0"
    assert info["driver_version"] == "1.24.1-a4f9d3c" and info["firmware_version"].startswith("hl-gaudi2-1.24.1")


@pytest.mark.hardware_contract
def test_gaudi2_without_a_way_to_tell_its_card_reads_no_card(standin_habana):
    """Eight cards and neither HLS_MODULE_ID nor HABANA_VISIBLE_MODULES: no reading is invented, and why is said."""
    adapter = Gaudi2Adapter(local_rank=1)
    adapter.setup()
    assert "hlml_device_used_at_end" not in adapter.memory().peak().extra
    info = adapter.facts()
    assert "memory_total_bytes" not in info and "which one this process holds" in info["hlml"]


def test_gaudi2_mode_is_the_bridges_answer_not_an_unset_variable(standin_habana, monkeypatch):
    """Defect 6: current Habana stacks run eagerly when PT_HPU_LAZY_MODE is unset; the suite used to assume lazy."""
    calls, state = standin_habana
    state["lazy"] = False
    adapter = Gaudi2Adapter()
    adapter.setup()
    adapter.synchronize()
    adapter.training().step_boundary()
    assert ("mark_step",) not in calls and ("hpu.synchronize",) in calls
    assert run_params(adapter)["hpu.mode"] == "eager" and adapter.facts()["hpu_mode"] == "eager"
    assert run_params(adapter)["hpu.PT_HPU_LAZY_MODE"] == "0"  # what optimum-habana reads (issue 25, defect 1)
    monkeypatch.delitem(sys.modules, "habana_frameworks.torch.utils.internal")
    monkeypatch.setitem(sys.modules, "habana_frameworks.torch.utils.internal", None)
    from suite.devices.gaudi2 import hpu_mode

    with pytest.raises(SuiteError, match="cannot ask the Habana bridge which execution mode runs"):
        hpu_mode()


def test_gaudi2_trainer_config_runs_fp32_as_fp32_and_the_bridges_mode(standin_habana, monkeypatch):
    """Defect 5: optimum-habana's trainer enables autocast whenever the Gaudi config's use_torch_autocast is set,
    whatever bf16 says (optimum/habana/transformers/trainer.py 1.21); the config must ask for it only for bf16."""
    from workloads.bridgetower.trainer_engine import _gaudi_trainer, gaudi_config_kwargs

    _, state = standin_habana
    made = []

    class GaudiConfig:
        def __init__(self, **kwargs):
            made.append(kwargs)

    sys.modules["optimum.habana"].GaudiConfig = GaudiConfig
    sys.modules["optimum.habana"].GaudiTrainer = object
    assert gaudi_config_kwargs("fp32")["use_torch_autocast"] is False
    assert gaudi_config_kwargs("bf16")["use_torch_autocast"] is True
    state["lazy"] = False
    adapter = Gaudi2Adapter()
    adapter.setup()
    _, args = _gaudi_trainer({"per_device_train_batch_size": 8}, "fp32", adapter)
    assert made == [{"use_fused_adam": True, "use_fused_clip_norm": True, "use_torch_autocast": False}]
    assert args["use_lazy_mode"] is False and args["use_habana"] is True


def test_gaudi2_contract_refuses_another_card_and_reports_a_missing_stack(standin_habana, monkeypatch):
    _, state = standin_habana
    state["name"] = "GAUDI3"
    assert Gaudi2Adapter.availability().reason == "device is GAUDI3, not Gaudi2"
    for name in [m for m in sys.modules if m.startswith("habana_frameworks")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    reason = Gaudi2Adapter.availability().reason
    assert reason.startswith("habana_frameworks not installed") and "not from PyPI" in reason


# --- an unavailable device: refused before anything is created; one that vanishes later: FAILED --------------

@pytest.mark.hardware_contract
@pytest.mark.parametrize("devices", ["h100", "a100", "gaudi2", "cuda", "cpu,h100,gaudi2"])
def test_an_unavailable_device_is_refused_up_front_creating_nothing(devices, tmp_path, capsys, monkeypatch):
    """Issue 25, defect 10: it spent ~9 s, made a results folder and FAILED MLflow runs, and wrapped the reason."""
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--device", devices, "--workers", "0", "--steps", "2", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("suite: error: device '") and err[0].endswith("(see suite devices)")
    for name in devices.split(","):
        if name != "cpu":
            assert f"device '{name}' is not available here: " in err[0]
    assert "device 'cpu'" not in err[0]
    assert list(tmp_path.iterdir()) == []  # no results folder, no mlflow.db


@pytest.mark.hardware_contract
def test_the_refusal_gives_the_reason_suite_devices_gives(capsys):
    from suite.devices.probe import probe

    reason = probe(["h100"])["h100"].reason
    assert reason == H100Adapter.availability().reason  # the same question, asked in another process
    main(["devices"])
    assert " ".join(reason.split()[:4]) in " ".join(capsys.readouterr().out.split())


@pytest.mark.hardware_contract
def test_dry_run_marks_configurations_whose_device_is_not_here(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--device", "cpu,h100", "--workers", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    [cpu] = [line for line in out.splitlines() if "device=cpu " in line]
    [h100] = [line for line in out.splitlines() if "device=h100 " in line]
    assert "unavailable" not in cpu and "[device unavailable here: no CUDA device" in h100
    assert "suite run would refuse this matrix: device(s) h100 not available here" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.hardware_contract
def test_the_availability_question_is_asked_in_a_short_lived_process(test_plugins, tmp_path, monkeypatch, capsys):
    """Issue 25, defect 4: a parent that asked CUDA or Habana itself would hold the device its configuration processes
    need (exclusive-process GPU, one-card Gaudi host). The stand-in notes which process asked."""
    import os

    from suite.devices.probe import probe

    asked = tmp_path / "asked"
    monkeypatch.setenv("SUITE_TEST_PROBE_FILE", str(asked))
    answer = probe(["probe-standin", "cpu"])
    assert not answer["probe-standin"].available and answer["probe-standin"].reason == \
        "stand-in accelerator opened and found busy"
    assert answer["cpu"].available  # the CPU's question opens nothing: asked here
    pids = [int(line) for line in asked.read_text().split()]
    assert len(pids) == 1 and pids[0] != os.getpid()
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--device", "probe-standin", "--steps", "1", "--no-progress"]) == 2
    pids = [int(line) for line in asked.read_text().split()]
    assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.e2e
def test_a_device_that_vanishes_after_the_check_is_a_failed_run_with_its_reason(tmp_path):
    """The configuration process itself still refuses an absent device (recorded FAILED, never another device)."""
    from suite.config import RunConfig

    from conftest import run_configuration_process

    config = RunConfig(workload="bridgetower", preset="tiny", device="h100", num_workers=0, loader="cpu",
                       precision="fp32", steps=2, warmup_steps=1, batch_size=8)
    result = run_configuration_process(tmp_path, config)
    assert result["status"] == "FAILED"
    assert result["reason"].startswith("device 'h100' is not available: no CUDA device")


@pytest.mark.e2e
def test_the_cpu_matrix_counts_model_flops_without_a_peak(tmp_path):
    code = main(["run", "--device", "cpu", "--workers", "0", "--steps", "2", "--warmup-steps", "1",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"])
    assert code == 0
    [cpu] = runs_of(tmp_path / "out")
    m = cpu["metrics"]
    assert m["model_flops_per_step"] > 0 and m["model_flops_per_s"] > 0 and "mfu" not in m
    assert cpu["facts"]["mfu"] == "not computed: no fp32 peak FLOP/s is known for this device"


@pytest.mark.parametrize("precision,peak", [("bf16", 989.4e12), ("fp32", 66.9e12)])
def test_mfu_is_against_the_peak_of_the_precision_that_ran(precision, peak):
    """Issue 47 (10): an fp32 run reported its MFU against the bf16 peak."""
    from suite.config import RunConfig
    from suite.results.record import RunResult
    from suite.run.ranks import Rank
    from suite.run.training import _record_flops

    config = RunConfig(workload="bridgetower", preset="large", device="h100", num_workers=0, loader="cpu",
                       precision=precision)
    result = RunResult(config, "FINISHED", metrics={"measured_steps": 10.0, "measured_wall_s": 10.0},
                       facts={"device": {"peak_flops": {"bf16": 989.4e12, "fp32": 66.9e12}}})
    _record_flops(result, 1e13, Rank(0, 0, 1))
    assert result.metrics["mfu"] == pytest.approx(1e13 / peak)
    assert f"dense {precision} peak" in result.facts["mfu"]


# --- the accelerator environment that changes results is recorded (issue 25, defect 11) -------------------------

@pytest.mark.hardware_contract
def test_the_accelerator_environment_holds_the_variables_devices_and_versions_that_change_results():
    from suite.results.environment import accelerator_environment

    environ = {"PT_HPU_LAZY_MODE": "0", "PT_HPU_MAX_COMPOUND_OP_SIZE": "512", "HABANA_VISIBLE_MODULES": "3,5",
               "HCCL_COMM_ID": "127.0.0.1:5555", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "1",
               "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "HOME": "/root", "PT_OTHER": "x", "MY_CUDA_THING": "y"}
    info = {"device_name": "NVIDIA H200", "device_count": 1, "driver_version": "580.95.05", "cuda_runtime": "12.8",
            "cudnn": 91002, "nccl": "2.27.3", "memory_total_bytes": 1}
    env = accelerator_environment(info, environ)
    assert set(env["variables"]) == {"PT_HPU_LAZY_MODE", "PT_HPU_MAX_COMPOUND_OP_SIZE", "HABANA_VISIBLE_MODULES",
                                     "HCCL_COMM_ID", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG"}
    assert env["visible_devices"]["CUDA_VISIBLE_DEVICES"] == "1" and env["visible_devices"]["HLS_MODULE_ID"] == "unset"
    assert env["versions"] == {"driver_version": "580.95.05", "cuda_runtime": "12.8", "cudnn": 91002,
                               "nccl": "2.27.3"}


@pytest.mark.e2e
@pytest.mark.hardware_contract
def test_a_run_records_its_accelerator_environment_in_the_manifest_and_one_mlflow_artifact(tmp_path, monkeypatch):
    import json

    from mlflow.tracking import MlflowClient

    from conftest import run_file

    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("PT_HPU_MAX_COMPOUND_OP_SIZE", "512")
    uri = f"sqlite:///{tmp_path}/m.db"
    assert main(["run", "--workers", "0", "--steps", "2", "--warmup-steps", "1", "--output", str(tmp_path / "out"),
                 "--tracking-uri", uri, "--no-progress", "--system-metrics-interval", "0"]) == 0
    [run] = runs_of(tmp_path / "out")
    manifest = json.loads(run_file(tmp_path / "out", run, "manifest.json").read_text())
    variables = manifest["accelerator_environment"]["variables"]
    assert variables["NCCL_DEBUG"] == "INFO" and variables["PT_HPU_MAX_COMPOUND_OP_SIZE"] == "512"
    client = MlflowClient(uri)
    child = client.get_run(run["mlflow_run_id"])
    assert not [key for key in child.data.tags if "NCCL_DEBUG" in key or "accelerator_environment" in key]
    path = client.download_artifacts(child.info.run_id, "accelerator_environment.json", str(tmp_path / "dl"))
    assert json.loads(Path(path).read_text())["variables"]["NCCL_DEBUG"] == "INFO"


def test_gaudi2_under_torchrun_binds_each_rank_to_its_card_before_one_is_acquired(standin_habana, monkeypatch):
    """Issue 47 (6): availability() acquired a card by type before the HCCL module's import set HLS_MODULE_ID from
    the local rank (bridge 1.19): HLML could then read another card, and multi-node acquisition by module id fails."""
    calls, _ = standin_habana
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("HLS_MODULE_ID", raising=False)
    Gaudi2Adapter(local_rank=1).setup()
    order = [c for c in calls if c[0] in ("hccl imported", "acquire")]
    assert order[:2] == [("hccl imported", "1"), ("acquire", "1")]


def test_gaudi2_alone_acquires_by_type_as_the_bridge_does(standin_habana, monkeypatch):
    calls, _ = standin_habana
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("HLS_MODULE_ID", raising=False)
    Gaudi2Adapter().setup()
    assert [c for c in calls if c[0] == "acquire"] == [("acquire", None)]


def test_a_gaudi2_configuration_runs_lazy_as_published_unless_told_otherwise(monkeypatch):
    """Issue 47 (7): where the stack defaults to eager, the published method (lazy) is what a configuration runs;
    a user's PT_HPU_LAZY_MODE=0 is honoured and recorded as a deviation from the published method."""
    from workloads.bridgetower.workload import BridgeTowerWorkload

    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    assert child_environment(Gaudi2Adapter, 1) == {"PT_HPU_LAZY_MODE": "1"}
    assert child_environment(Gaudi2Adapter, 8) == {"PT_HPU_LAZY_MODE": "1"}
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    assert child_environment(Gaudi2Adapter, 1) == {}
    config = __import__("suite.config", fromlist=["RunConfig"]).RunConfig(
        workload="bridgetower", preset="large", device="gaudi2", num_workers=2, loader="cpu", precision="bf16")
    assert BridgeTowerWorkload.method_deviations(config, {"hpu.mode": "lazy", "deterministic_algorithms": "false"}) \
        == []
    assert BridgeTowerWorkload.method_deviations(config, {"hpu.mode": "eager", "deterministic_algorithms": "true"}) \
        == ["deterministic_algorithms true (the published method: false, torch's deterministic algorithms off "
            "(faster on CUDA))", "hpu.mode eager (the published method: lazy, Habana's lazy mode)"]

"""Contract tests for the CUDA (cuda/h100/a100) and Gaudi2 adapters, with STAND-IN modules.

No GPU or Gaudi exists here: ``torch.cuda``'s functions, ``pynvml``, ``torchvision.io`` and the whole
``habana_frameworks`` / ``optimum.habana`` tree are replaced by recording stand-ins. The tests check that
each adapter calls the documented APIs for availability, sync, seeding, memory and decoding, and that an
unavailable device becomes a FAILED run with the reason, never another device.
"""

import sys
import types

import pytest
import torch

from suite.cli import main
from suite.devices.cuda import A100Adapter, CUDAAdapter, H100Adapter, peak_bf16_flops
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
    monkeypatch.setattr(cuda, "is_bf16_supported", lambda: True)
    props = types.SimpleNamespace(name=state["name"], major=9, minor=0, total_memory=80 * 2**30)
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
    adapter.seed(7)
    assert ("manual_seed_all", 7) in calls
    adapter.reset_peak_memory()
    memory = adapter.peak_memory()
    assert memory.peak_bytes == 123 * 2**20 and memory.source == "torch.cuda.max_memory_allocated"
    assert memory.extra == {"reserved_peak": 200 * 2**20, "nvml_process_used_at_end": 300 * 2**20}
    info = adapter.device_info()
    assert info["device_name"] == "NVIDIA H100 80GB HBM3" and info["driver_version"] == "570.86"
    assert info["peak_bf16_flops"] == pytest.approx(989.4e12) and info["compute_capability"] == "9.0"
    assert adapter.distributed_backend == "nccl" and adapter.supported_precisions() == ("fp32", "bf16")
    try:
        adapter.configure_determinism()
        assert torch.backends.cudnn.deterministic and not torch.backends.cuda.matmul.allow_tf32
        assert adapter.run_params()["cuda.tf32"] == "false"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


def test_cuda_contract_decodes_a_batch_with_nvjpeg_and_refuses_non_jpeg(standin_cuda, monkeypatch):
    calls, _, _ = standin_cuda
    adapter = _set_up(CUDAAdapter(), monkeypatch)
    images = adapter.decode_images([b"\xff\xd8a", b"\xff\xd8b"])
    assert len(images) == 2 and ("decode_jpeg", 2, "RGB", "cuda:0") in calls  # one call per batch
    with pytest.raises(SuiteError, match="nvJPEG decodes JPEG only; image 1"):
        adapter.decode_images([b"\xff\xd8a", b"\x89PNG"])


def test_cuda_contract_model_adapters_refuse_other_cards(standin_cuda):
    _, state, _ = standin_cuda
    state["name"] = "NVIDIA H200"
    assert not H100Adapter.availability().available
    assert H100Adapter.availability().reason == "device is NVIDIA H200, not H100"
    assert A100Adapter.availability().reason == "device is NVIDIA H200, not A100"
    assert CUDAAdapter.availability().available  # the generic adapter takes any card, and records it
    with pytest.raises(DeviceUnavailableError, match="not H100"):
        H100Adapter().setup()


def test_cuda_peak_flops_table():
    assert peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_bf16_flops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4e12)
    assert peak_bf16_flops("NVIDIA GeForce RTX 4090") is None  # unknown: no MFU, never a guess


def test_cuda_reasons_on_this_machine():
    assert CUDAAdapter.availability().reason.startswith("no CUDA device")


# --- Gaudi2 --------------------------------------------------------------------------------------

@pytest.fixture
def standin_habana(monkeypatch):
    """A stand-in habana_frameworks / optimum.habana / habana-media-loader / pyhlml tree that records calls."""
    calls = Calls()
    state = {"name": "GAUDI2", "lazy": "1"}

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    random = module("habana_frameworks.torch.hpu.random", manual_seed_all=lambda s: calls.record("hpu_seed", s))
    hpu = module("habana_frameworks.torch.hpu", is_available=lambda: True, device_count=lambda: 8,
                 get_device_name=lambda: state["name"], synchronize=lambda: calls.record("hpu.synchronize"),
                 reset_peak_memory_stats=lambda: calls.record("reset_peak_memory_stats"),
                 max_memory_allocated=lambda: 5 * 2**30, memory_stats=lambda: {"Limit": 94 * 2**30}, random=random)
    core = module("habana_frameworks.torch.core", mark_step=lambda: calls.record("mark_step"))

    class FusedAdamW(torch.optim.AdamW):
        def __init__(self, params, **kwargs):
            calls.record("FusedAdamW", tuple(sorted(kwargs)))
            super().__init__(params, **kwargs)

    class FusedClipNorm:
        def __init__(self, params, max_norm):
            calls.record("FusedClipNorm", max_norm)

        def clip_norm(self, params):
            calls.record("clip_norm")

    optimizers = module("habana_frameworks.torch.hpex.optimizers", FusedAdamW=FusedAdamW)
    normalization = module("habana_frameworks.torch.hpex.normalization", FusedClipNorm=FusedClipNorm)
    hpex = module("habana_frameworks.torch.hpex", optimizers=optimizers, normalization=normalization)
    torch_pkg = module("habana_frameworks.torch", hpu=hpu, core=core, hpex=hpex, __version__="1.21.0")
    module("habana_frameworks", torch=torch_pkg)
    module("habana_frameworks.torch.distributed")
    module("habana_frameworks.torch.distributed.hccl")
    module("optimum")
    module("optimum.habana")
    module("optimum.habana.transformers")
    module("optimum.habana.transformers.modeling_utils",
           adapt_transformers_to_gaudi=lambda: calls.record("adapt_transformers_to_gaudi"))
    module("pyhlml", hlmlInit=lambda: None, hlmlDeviceGetHandleByIndex=lambda i: i,
           hlmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=6 * 2**30))
    monkeypatch.setenv("PT_HPU_LAZY_MODE", state["lazy"])
    monkeypatch.setattr(torch, "device", lambda *a: types.SimpleNamespace(type="hpu", index=None,
                                                                          __str__=lambda self: "hpu"))
    return calls, state


def test_gaudi2_contract_lazy_mode_sync_seed_memory_and_optimizer(standin_habana, monkeypatch):
    calls, _ = standin_habana
    adapter = Gaudi2Adapter()
    adapter.setup()
    adapter.synchronize()
    assert calls[-2:] == [("mark_step",), ("hpu.synchronize",)]  # lazy: mark_step before the device sync
    adapter.step_boundary()
    assert calls[-1] == ("mark_step",)
    adapter.seed(3)
    assert ("hpu_seed", 3) in calls
    adapter.prepare_framework()
    assert ("adapt_transformers_to_gaudi",) in calls
    params = [torch.nn.Parameter(torch.ones(2))]
    optimizer, description = adapter.make_optimizer(params, lr=1e-5, eps=1e-8, weight_decay=0.0)
    assert isinstance(optimizer, torch.optim.Optimizer) and description.startswith("habana_frameworks")
    adapter.clip_grad_norm(params, 1.0)
    assert ("FusedClipNorm", 1.0) in calls and ("clip_norm",) in calls
    adapter.reset_peak_memory()
    memory = adapter.peak_memory()
    assert memory.peak_bytes == 5 * 2**30
    assert memory.extra == {"allocator_limit": 94 * 2**30, "hlml_device_used_at_end": 6 * 2**30}
    params_recorded = adapter.run_params()
    assert params_recorded["hpu.mode"] == "lazy" and "FusedAdamW" in params_recorded["hpu.optimizer"]
    info = adapter.device_info()
    assert info["peak_bf16_flops"] == GAUDI2_PEAK_BF16_FLOPS and info["device_count"] == 8
    assert adapter.distributed_backend == "hccl"


def test_gaudi2_contract_eager_mode_has_no_mark_step(standin_habana, monkeypatch):
    calls, _ = standin_habana
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    adapter = Gaudi2Adapter()
    adapter.setup()
    adapter.synchronize()
    adapter.step_boundary()
    assert ("mark_step",) not in calls and ("hpu.synchronize",) in calls
    assert adapter.run_params()["hpu.mode"] == "eager"


def test_gaudi2_contract_refuses_another_card_and_reports_a_missing_stack(standin_habana, monkeypatch):
    _, state = standin_habana
    state["name"] = "GAUDI3"
    assert Gaudi2Adapter.availability().reason == "device is GAUDI3, not Gaudi2"
    for name in [m for m in sys.modules if m.startswith("habana_frameworks")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    reason = Gaudi2Adapter.availability().reason
    assert reason.startswith("habana_frameworks not installed") and "not from PyPI" in reason


def test_gaudi2_contract_device_loader_runs_the_media_pipe(standin_habana, monkeypatch):
    """The media pipe is built once per batch shape from habana-media-loader's documented pieces and fed
    the batch's bytes through its external queue."""
    calls, _ = standin_habana
    built = []

    class MediaPipe:
        def __init__(self, device, prefetch_depth, batch_size, num_threads, pipe_name):
            calls.record("MediaPipe", device, batch_size)

        def build(self):
            built.append(self.definegraph())

    class Node:
        def __init__(self, name, **kwargs):
            self.name, self.kwargs = name, kwargs

        def __call__(self, *inputs):
            return (self.name, inputs)

    fn = types.SimpleNamespace(**{n: (lambda n: lambda **kw: Node(n, **kw))(n) for n in (
        "ReadMediaDatasetFromExt", "ImageDecoder", "MediaConst", "CropMirrorNorm")})
    feeds = []

    class Iterator:
        def __init__(self, mediapipe):
            self.queue = mediapipe.read.kwargs["ext_queue"]

        def __next__(self):
            batch = self.queue.get_nowait()
            feeds.append(batch)
            return (torch.zeros(len(batch), 3, 8, 8),)

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)

    module("habana_frameworks.mediapipe", fn=fn)
    module("habana_frameworks.mediapipe.mediapipe", MediaPipe=MediaPipe)
    module("habana_frameworks.mediapipe.media_types", dtype=types.SimpleNamespace(FLOAT32="f32"),
           ftype=types.SimpleNamespace(BICUBIC="bicubic"), imgtype=types.SimpleNamespace(RGB_P="rgb_p"),
           randomCropType=types.SimpleNamespace(CENTER_CROP="center"))
    module("habana_frameworks.mediapipe.plugins")
    module("habana_frameworks.mediapipe.plugins.iterator_pytorch", HPUGenericPytorchIterator=Iterator)
    adapter = Gaudi2Adapter()
    adapter.setup()
    out = adapter.device_preprocess([b"\xff\xd8a", b"\xff\xd8b"], 8, (0.5,) * 3, (0.25,) * 3)
    assert tuple(out.shape) == (2, 3, 8, 8)
    assert [bytes(a) for a in feeds[0]] == [b"\xff\xd8a", b"\xff\xd8b"]
    adapter.device_preprocess([b"\xff\xd8c", b"\xff\xd8d"], 8, (0.5,) * 3, (0.25,) * 3)
    assert sum(1 for c in calls if c[0] == "MediaPipe") == 1  # built once, reused per batch
    (graph,) = built
    assert graph[0] == "CropMirrorNorm" and graph[1][0][0] == "ImageDecoder"


# --- the matrix: an unavailable device is a FAILED configuration with its reason -----------------

@pytest.mark.e2e
def test_unavailable_devices_fail_with_their_reason_and_the_matrix_goes_on(tmp_path):
    code = main(["run", "--device", "cpu,h100,gaudi2", "--workers", "0", "--steps", "2", "--warmup-steps", "1",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"])
    assert code == 1
    results = {r["config"]["device"]: r for r in runs_of(tmp_path / "out")}
    assert results["cpu"]["status"] == "FINISHED"
    assert results["h100"]["status"] == "FAILED"
    assert results["h100"]["reason"].startswith("device 'h100' is not available: no CUDA device")
    assert results["gaudi2"]["status"] == "FAILED"
    assert "habana_frameworks not installed" in results["gaudi2"]["reason"]
    m = results["cpu"]["metrics"]
    assert m["model_flops_per_step"] > 0 and m["model_flops_per_s"] > 0 and "mfu_bf16_peak" not in m


# --- the dali loader -----------------------------------------------------------------------------

@pytest.fixture
def standin_dali(monkeypatch):
    """A stand-in nvidia.dali: records the pipeline graph, the fed bytes and the copy into torch."""
    record = {"graph": [], "fed": [], "copied": 0, "built": 0}

    def op(name):
        def call(*inputs, **kwargs):
            record["graph"].append((name, kwargs))
            return name
        return call

    fn = types.SimpleNamespace(external_source=op("external_source"), resize=op("resize"),
                               crop_mirror_normalize=op("crop_mirror_normalize"),
                               decoders=types.SimpleNamespace(image=op("decoders.image")))
    dali_types = types.SimpleNamespace(UINT8="u8", RGB="rgb", INTERP_CUBIC="cubic", FLOAT="f32")

    class Pipe:
        def __init__(self, graph, kwargs):
            self.kwargs = kwargs
            graph()

        def build(self):
            record["built"] += 1

        def feed_input(self, name, arrays):
            record["fed"].append((name, [bytes(a) for a in arrays]))
            self.n = len(arrays)

        def run(self):
            tensor = types.SimpleNamespace(shape=lambda: (self.n, 3, 8, 8))
            return (types.SimpleNamespace(as_tensor=lambda: tensor),)

    def pipeline_def(**kwargs):
        record["pipeline_kwargs"] = kwargs
        return lambda graph: (lambda: Pipe(graph, kwargs))

    def feed_ndarray(dali_tensor, out):
        record["copied"] += 1
        out.fill_(1.0)

    for name, attrs in (("nvidia", {}), ("nvidia.dali", dict(fn=fn, pipeline_def=pipeline_def, types=dali_types)),
                        ("nvidia.dali.plugin", {}), ("nvidia.dali.plugin.pytorch", dict(feed_ndarray=feed_ndarray))):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
    return record


def test_dali_loader_contract_builds_the_pipeline_once_and_feeds_each_batch(standin_dali):
    from suite.devices.cpu import CPUAdapter

    adapter = CPUAdapter()
    adapter.setup()
    assert "dali" in adapter.supported_loaders and "dali" not in Gaudi2Adapter.supported_loaders
    assert adapter.device_preprocess([b"\xff\xd8a"], 8, (0.5,) * 3, (0.25,) * 3) is None  # loader device
    out = adapter.device_preprocess([b"\xff\xd8a", b"\xff\xd8b"], 8, (0.5,) * 3, (0.25,) * 3, loader="dali")
    adapter.device_preprocess([b"\xff\xd8c", b"\xff\xd8d"], 8, (0.5,) * 3, (0.25,) * 3, loader="dali")
    assert tuple(out.shape) == (2, 3, 8, 8) and out.dtype == torch.float32 and float(out.min()) == 1.0
    assert standin_dali["built"] == 1 and standin_dali["copied"] == 2
    assert standin_dali["fed"][0] == ("encoded", [b"\xff\xd8a", b"\xff\xd8b"])
    assert standin_dali["pipeline_kwargs"] == {"batch_size": 2, "num_threads": 2, "device_id": None}
    graph = dict(standin_dali["graph"])
    assert graph["decoders.image"]["device"] == "cpu"  # the CPU device: DALI's CPU decoder
    assert graph["resize"] == {"resize_shorter": 8, "interp_type": "cubic", "antialias": True}
    assert graph["crop_mirror_normalize"]["mean"] == [127.5] * 3 and graph["crop_mirror_normalize"]["std"] == [63.75] * 3


def test_dali_loader_contract_decodes_on_the_gpu_for_cuda_adapters(standin_dali, standin_cuda):
    adapter = CUDAAdapter()
    adapter.setup()
    from suite.devices.dali import DaliPreprocessor

    DaliPreprocessor(2, 8, (0.5,) * 3, (0.25,) * 3, adapter.dali_device_id())
    assert standin_dali["pipeline_kwargs"]["device_id"] == 0
    assert dict(standin_dali["graph"])["decoders.image"]["device"] == "mixed"  # nvJPEG through DALI


@pytest.mark.e2e
def test_dali_loader_without_dali_fails_with_the_install_hint(tmp_path):
    code = main(["run", "--loader", "dali", "--workers", "0", "--steps", "1", "--warmup-steps", "0",
                 "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"])
    assert code == 1
    (run,) = runs_of(tmp_path / "out")
    assert run["status"] == "FAILED"
    assert run["reason"].startswith("the dali loader needs NVIDIA DALI: pip install 'suite-bench[dali]'")

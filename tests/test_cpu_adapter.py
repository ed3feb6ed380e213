import io

import pytest
import torch
from PIL import Image

from suite.devices.cpu import CPUAdapter
from suite.errors import ConfigError

pytestmark = pytest.mark.mechanics  # nothing here depends on the transformers line


@pytest.fixture
def cpu():
    adapter = CPUAdapter()
    adapter.setup()
    return adapter


def test_available_with_facts(cpu):
    assert CPUAdapter.availability().available
    info = cpu.facts()
    assert info["device_count"] == 1 and info["logical_cores"] >= 1 and info["memory_total_bytes"] > 0
    assert cpu.torch_device == torch.device("cpu")
    assert CPUAdapter.traits.distributed_backend == "gloo"


def test_peak_memory_window_sees_an_allocation(cpu):
    cpu.memory().reset_peak()
    first = cpu.memory().peak()
    assert first is not None and first.peak_bytes > 0
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    block += 1
    second = cpu.memory().peak()
    assert second.peak_bytes >= first.peak_bytes + 60 * 2**20
    del block


def test_autocast_bf16_and_unsupported_precision(cpu):
    a = torch.randn(8, 8)
    with cpu.numerics().autocast("bf16"):
        assert (a @ a).dtype == torch.bfloat16
    with cpu.numerics().autocast("fp32"):
        assert (a @ a).dtype == torch.float32
    with pytest.raises(ConfigError, match="precision 'fp8' is not supported on cpu"):
        cpu.numerics().autocast("fp8")


def test_seed_makes_rngs_repeat(cpu):
    cpu.numerics().seed(7)
    first = torch.rand(3)
    cpu.numerics().seed(7)
    assert torch.equal(first, torch.rand(3))


def test_decode_images_converts_modes_to_rgb(cpu):
    encoded = []
    for mode in ("RGB", "L", "P", "RGBA", "CMYK"):
        buf = io.BytesIO()
        Image.new(mode, (20, 10)).save(buf, format="PNG" if mode in ("P", "RGBA") else "JPEG")
        encoded.append(buf.getvalue())
    images = cpu.decoders.for_loader("device")(encoded, 64, (0.5,) * 3, (0.5,) * 3)  # Pillow, in the training process
    assert [tuple(i.shape) for i in images] == [(3, 10, 20)] * 5
    assert all(i.dtype == torch.uint8 for i in images)


def test_setup_is_required_before_use():
    with pytest.raises(RuntimeError, match="setup"):
        CPUAdapter().torch_device

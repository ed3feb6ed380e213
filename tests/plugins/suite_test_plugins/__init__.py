"""Stand-in plugins for tests, registered through the dist-info folder beside this package.

Put ``tests/plugins`` on PYTHONPATH (parent and child processes) to make them discoverable.
"""

import dataclasses

from suite.devices.base import Availability
from suite.devices.cpu import CPUAdapter


class AbsentStandInAdapter(CPUAdapter):
    """A device that is never present: exercises the unavailable-device path end to end."""

    name = "absent-standin"
    traits = dataclasses.replace(CPUAdapter.traits, description="test stand-in for a device that is not installed")

    @classmethod
    def availability(cls) -> Availability:
        return Availability(False, "stand-in accelerator is not present on this machine")


class VanishingStandInAdapter(CPUAdapter):
    """A device that is there when asked but gone when a configuration sets it up (unplugged, taken by another job):
    exercises the FAILED-configuration path that the up-front refusal cannot catch."""

    name = "vanishing-standin"
    traits = dataclasses.replace(CPUAdapter.traits, description="test stand-in for a device that disappears after the availability check")

    @classmethod
    def availability(cls) -> Availability:
        return Availability(True, "", {"device_name": "stand-in"})

    def open_device(self):
        from suite.errors import DeviceUnavailableError

        raise DeviceUnavailableError("device 'vanishing-standin' is not available: stand-in accelerator vanished "
                                     "after the check")


class ProbeRecordingAdapter(CPUAdapter):
    """A device whose availability question opens it (as CUDA's and Habana's do): it notes the process that asked in
    the file named by $SUITE_TEST_PROBE_FILE, so a test can tell which process held it."""

    name = "probe-standin"
    traits = dataclasses.replace(CPUAdapter.traits, description="test stand-in for a device that availability() opens",
                                 probe_claims_device=True)

    @classmethod
    def availability(cls) -> Availability:
        import os

        with open(os.environ["SUITE_TEST_PROBE_FILE"], "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return Availability(False, "stand-in accelerator opened and found busy")


from suite.decoders.pillow import PillowDecoder  # noqa: E402


class BrokenStandInDecoder(PillowDecoder):
    """A device decoder that fails on every image, as torchvision's GPU decode_jpeg does when torchvision was built for
    another CUDA major than torch (torchvision 0.26 beside a torch of CUDA 12: the custom op does not load)."""

    name = "broken-standin"
    description = "test stand-in for a device decoder that does not work here"

    def __call__(self, encoded, image_size, mean, std):
        raise RuntimeError("Couldn't load custom C++ ops. This can happen if your PyTorch and torchvision versions "
                           "are incompatible")


class BrokenDecoderStandInAdapter(CPUAdapter):
    """The CPU, with the broken decoder serving its ``device`` loader."""

    name = "broken-decoder-standin"
    traits = dataclasses.replace(CPUAdapter.traits, description="test stand-in for a device whose decoder is broken",
                                 decoders={"device": "broken-standin"})


import torch  # noqa: E402

from suite.workload import Preset, Workload  # noqa: E402


class MemoryHogWorkload(Workload):
    """A workload that needs a known amount of memory (3 GiB) in set-up: exercises out-of-memory handling."""

    name = "memory-hog"
    presets = {"default": Preset("default", batch_size=1, description="allocates 3 GiB in setup")}
    default_preset = "default"
    need_bytes = 3 * 2**30

    def setup(self):
        self.block = torch.ones(self.need_bytes // 4)  # allocated and written

    def batches(self):
        while True:
            yield torch.zeros(1)

    def train_step(self, batch):
        return torch.tensor(0.0)

    def count_samples(self, batch):
        return 1


class _Endless(torch.utils.data.Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, index):
        return torch.zeros(1)


class HangingWorkload(Workload):
    """A workload whose training step never returns, fed by real DataLoader workers: exercises the
    per-configuration time limit (the process and its loader workers must all be killed)."""

    name = "hanging"
    presets = {"default": Preset("default", batch_size=1, description="a training step that never returns")}
    default_preset = "default"

    def setup(self):
        self.loader = torch.utils.data.DataLoader(_Endless(), batch_size=1, num_workers=self.config.num_workers,
                                                  persistent_workers=self.config.num_workers > 0)

    def batches(self):
        while True:
            yield from self.loader

    def train_step(self, batch):
        import time

        while True:
            time.sleep(1)

    def count_samples(self, batch):
        return 1


class _Payloads(torch.utils.data.Dataset):
    """Items of ``item_bytes`` bytes; with ``leak``, every item read is also kept for ever by whoever read it (a
    loader worker, or the training process at 0 workers): the shape of torchvision's nvJPEG leak (#4378), host side."""

    def __init__(self, item_bytes: int, leak: bool) -> None:
        self.item_bytes, self.leak, self.kept = item_bytes, leak, []

    def __len__(self):
        return 1_000_000

    def __getitem__(self, index):
        payload = bytes([index % 251 + 1]) * self.item_bytes  # written, so resident
        if self.leak:
            self.kept.append(payload)
        return torch.tensor(float(len(payload)))


class SteadyLoaderWorkload(Workload):
    """A loader that reads 2 MiB per sample and keeps nothing: memory plateaus over the measured window."""

    name = "steady-loader"
    presets = {"default": Preset("default", batch_size=2, description="2 MiB per sample, nothing kept")}
    default_preset = "default"
    leak = False

    def setup(self):
        self.loader = torch.utils.data.DataLoader(_Payloads(2 * 2**20, self.leak), batch_size=2,
                                                  num_workers=self.config.num_workers,
                                                  persistent_workers=self.config.num_workers > 0)

    def batches(self):
        while True:
            yield from self.loader

    def train_step(self, batch):
        import time

        time.sleep(0.06)  # a step long enough for the runner to sample memory within it
        return batch.sum() * 0.0

    def count_samples(self, batch):
        return len(batch)


class LeakyLoaderWorkload(SteadyLoaderWorkload):
    """The same loader keeping every sample it reads (4 MiB per step): memory grows over the measured window."""

    name = "leaky-loader"
    presets = {"default": Preset("default", batch_size=2, description="2 MiB per sample, every one kept")}
    leak = True


# --- a second workload, to prove the boundary (issue 48): nothing in suite/ knows it ---------------------------------
from suite.figures import Figure  # noqa: E402


class _Points(torch.utils.data.Dataset):
    """y = 3x - 1 + noise, x in [-1, 1]: deterministic by index (no global RNG), so every worker count gives the same
    batches."""

    def __init__(self, count: int, offset: int) -> None:
        self.count, self.offset = count, offset

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(self.offset + index)
        x = torch.rand(1, generator=generator) * 2 - 1
        return x, 3 * x - 1 + 0.01 * torch.randn(1, generator=generator)


class RegressionWorkload(Workload):
    """A line fitted by SGD: the smallest workload the suite can measure, with a quality (the share of held-out points
    predicted within 0.1) and no published reference. Not shipped: the tests run it through every command."""

    name = "regression"
    presets = {"tiny": Preset("tiny", batch_size=16, description="a line, 512 training points, 128 held out")}
    default_preset = "tiny"
    figures = (Figure("eval_accuracy", "1", "share of held-out points predicted within 0.1", "quality", 0.0, 1.0),)
    datasets = "none: the points are made from their index"

    def setup(self):
        self.model = torch.nn.Linear(1, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.2)
        generator = torch.Generator().manual_seed(self.config.seed)
        self.loader = torch.utils.data.DataLoader(_Points(512, 0), batch_size=self.config.batch, shuffle=True,
                                                  generator=generator, num_workers=self.config.num_workers,
                                                  persistent_workers=self.config.num_workers > 0)
        self.held_out = [_Points(128, 10_000)[i] for i in range(128)]

    def batches(self):
        while True:
            yield from self.loader

    def train_step(self, batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def count_samples(self, batch):
        return len(batch[0])

    def evaluate(self):
        with torch.no_grad():
            x = torch.stack([p[0] for p in self.held_out])
            y = torch.stack([p[1] for p in self.held_out])
            close = ((self.model(x) - y).abs() < 0.1).float().mean().item()
        return {"eval_accuracy": close, "eval_samples": float(len(self.held_out))}

    def observed_loader(self):
        return {"loader": "cpu", "num_workers": self.loader.num_workers, "prefetch_factor": self.loader.prefetch_factor}

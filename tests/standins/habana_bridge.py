"""A stand-in for Intel Gaudi's PyTorch bridge, ``habana_frameworks.torch`` 1.21-1.24 (part of Habana's software stack,
not on PyPI, so there is no installed copy to check it against), recording the calls the suite makes.

What it models, module by module: ``hpu`` (``is_available``, ``device_count``, ``get_device_name``, ``synchronize``,
``reset_peak_memory_stats``, ``max_memory_allocated``, ``memory_allocated``, ``memory_stats`` whose ``Limit`` is the allocator's limit),
``hpu.random.manual_seed_all``, ``core.mark_step``, ``hpex.optimizers.FusedAdamW``,
``hpex.normalization.FusedClipNorm``, ``utils.internal.is_lazy()`` (the mode the bridge runs), and the
``distributed.hccl`` module that registers HCCL. Modules carry a ``__spec__``, so ``importlib.util.find_spec`` (as
accelerate's ``is_hpu_available`` asks) finds them as it finds the real bridge; torch itself is the installed CPU
build, which has no ``torch.hpu``: accelerate then says no HPU is present, as it would on a host without a card.

Also: :func:`plugin_distribution` writes the metadata of the ``habana-torch-plugin`` distribution that optimum-habana's
import looks for with ``pip list`` (``optimum/habana/utils/misc.py``, ``get_habana_frameworks_version``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

#: The bridge version the stand-in answers as (optimum-habana 1.21.2 is validated for SynapseAI 1.24).
BRIDGE_VERSION = "1.24.1"


class Calls(list):
    def record(self, name: str, *args: Any) -> None:
        self.append((name, *args))


def default_state() -> dict[str, Any]:
    return {"name": "GAUDI2", "lazy": True, "count": 8}


def install(monkeypatch: Any, calls: Calls, state: dict[str, Any]) -> None:
    """Put the stand-in bridge into ``sys.modules`` (undone by ``monkeypatch``)."""

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []  # a package: its submodules (distributed.hccl) are imported through sys.meta_path
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    random = module("habana_frameworks.torch.hpu.random", manual_seed_all=lambda s: calls.record("hpu_seed", s))

    def is_available() -> bool:  # the bridge's first HPU call acquires a card: by HLS_MODULE_ID if set, else by type
        if not state.get("acquired"):
            state["acquired"] = True
            calls.record("acquire", os.environ.get("HLS_MODULE_ID"))
        return True

    hpu = module("habana_frameworks.torch.hpu", is_available=is_available, device_count=lambda: state["count"],
                 get_device_name=lambda: state["name"], synchronize=lambda: calls.record("hpu.synchronize"),
                 reset_peak_memory_stats=lambda: calls.record("reset_peak_memory_stats"),
                 max_memory_allocated=lambda: 5 * 2**30, memory_allocated=lambda: 3 * 2**30,
                 memory_stats=lambda: {"Limit": 94 * 2**30}, random=random)
    core = module("habana_frameworks.torch.core", mark_step=lambda: calls.record("mark_step"))

    class FusedAdamW(torch.optim.AdamW):
        def __init__(self, params: Any, **kwargs: Any) -> None:
            calls.record("FusedAdamW", tuple(sorted(kwargs)))
            super().__init__(params, **kwargs)

    class FusedClipNorm:
        def __init__(self, params: Any, max_norm: float) -> None:
            calls.record("FusedClipNorm", max_norm)

        def clip_norm(self, params: Any) -> None:
            calls.record("clip_norm")

    optimizers = module("habana_frameworks.torch.hpex.optimizers", FusedAdamW=FusedAdamW)
    normalization = module("habana_frameworks.torch.hpex.normalization", FusedClipNorm=FusedClipNorm)
    hpex = module("habana_frameworks.torch.hpex", optimizers=optimizers, normalization=normalization)
    internal = module("habana_frameworks.torch.utils.internal", is_lazy=lambda: state["lazy"])
    utils = module("habana_frameworks.torch.utils", internal=internal)
    torch_pkg = module("habana_frameworks.torch", hpu=hpu, core=core, hpex=hpex, utils=utils,
                       __version__=BRIDGE_VERSION)
    parent = sys.modules.get("habana_frameworks")  # the real package of habana-media-loader, where installed
    if parent is None:
        parent = module("habana_frameworks")
    monkeypatch.setattr(parent, "torch", torch_pkg, raising=False)
    module("habana_frameworks.torch.distributed")
    monkeypatch.setitem(sys.modules, _HcclFinder.NAME, None)  # recorded as absent: imported below, removed after
    del sys.modules[_HcclFinder.NAME]
    monkeypatch.setattr(sys, "meta_path", [_HcclFinder(calls), *sys.meta_path])


class _HcclFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``habana_frameworks.torch.distributed.hccl`` as the bridge 1.19 ships it, as far as the suite meets it:
    importing it runs ``initialize_distributed_hpu()``, whose ``_setup_module_id`` sets ``HLS_MODULE_ID`` to
    ``HABANA_VISIBLE_MODULES[local_rank]`` or to ``LOCAL_RANK`` when ``WORLD_SIZE`` > 1 and it is not set already
    (``habana_frameworks/torch/distributed/hccl/__init__.py``); the import is recorded."""

    NAME = "habana_frameworks.torch.distributed.hccl"

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name == self.NAME else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        world_size, local_rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", -1))
        if "HLS_MODULE_ID" not in os.environ and local_rank != -1 and world_size > 1:
            visible = os.environ.get("HABANA_VISIBLE_MODULES")
            os.environ["HLS_MODULE_ID"] = visible.split(",")[local_rank] if visible else str(local_rank)
        self.calls.record("hccl imported", os.environ.get("HLS_MODULE_ID"))



def plugin_distribution(root: Path) -> Path:
    """A folder holding the ``habana-torch-plugin`` distribution's metadata (what ``pip list`` reports of Habana's
    bridge), to put on ``PYTHONPATH``."""
    info = root / f"habana_torch_plugin-{BRIDGE_VERSION}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: habana-torch-plugin\nVersion: {BRIDGE_VERSION}\n")
    return root

"""Stand-ins for the NATIVE layer under habana-media-loader 1.24.1.482, so that the wheel's own Python code (MediaPipe,
``fn``, the operator schemas and nodes, ``backend/graph_legacy.py``, ``backend/cal.py``, ``backend/legacy.py``, the
reader nodes and ``plugins/iterator_pytorch.py``) runs here unchanged.

What is replaced, and what each stand-in models (nothing here implements behaviour from memory):

* The compiled extension modules the wheel imports but does not ship (they come with Habana's driver stack):
  ``media_pipe_types``, ``media_pipe_api``, ``media_pipe_params``, ``media_pipe_proxy``, ``media_pipe_nodes`` and
  the CPU-op helpers. The wheel uses them as enums (``mppy.fwType.PYTHON_FW``, ``mpt.dType.UINT8``, compared by
  identity and with ``isinstance``), as parameter structs (``mpp.mediaPlaceholderParams().shape.dims[i] = ...``) and
  as one object, ``media_pipe_api.pipeManager``, the C++ pipe manager that ``backend/cal.py`` drives. Enum members
  and struct fields are made on first use (:class:`NativeModule`); :class:`PipeManager` records the calls cal.py
  makes and answers them as ``cal.py`` expects (status ``mpt.status.SUCCESS``; ``getTensorInfo`` the graph's
  placeholders under the names ``backend/graph_legacy.py``'s ``process_recipe`` maps, ``<node>_<port>``).
* ``libmedia.so``, which ``backend/legacy.py`` opens with ``ctypes.CDLL`` at import: :class:`LibMedia` takes each
  call; ``run_hpu``'s input list is what legacy.py built from the reader's output (a ``BufferList`` of
  pointers and sizes for ``readerOutType.BUFFER_LIST``), read back here to check what the decoder would receive.
* Habana's PyTorch bridge (``habana_frameworks.torch``, not on PyPI): ``hpu.init``, ``media_pyt_bridge``,
  ``utils.experimental._data_ptr``; the iterator's device tensors live in host memory (``torch.device("cpu")``).

The decoder's output is a zero-filled tensor of the shape the graph declares: the pixels are the hardware's; what
these tests check is the protocol (build, ``iter()``, feed, ``run()``) and what reaches the decoder.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import types
from typing import Any

NATIVE_MODULES = ("media_pipe_types", "media_pipe_api", "media_pipe_params", "media_pipe_proxy", "media_pipe_nodes",
                  "media_pipe_randomizer", "media_random_biased_crop", "media_random_flip_cpu", "media_resize",
                  "media_numpy_reader")


class _Members(type):
    """A native enum or struct class: ``Cls.NAME`` is a member (an instance), made on first use."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        member = cls.__new__(cls)
        object.__setattr__(member, "_label", f"{cls.__name__}.{name}")
        type.__setattr__(cls, name, member)
        return member


class _Struct(metaclass=_Members):
    """A native value: enum member, parameter struct (fields made on first read, arrays indexable) or callable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_label", type(self).__name__)
        object.__setattr__(self, "_items", {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _Struct()
        object.__setattr__(self, name, child)
        return child

    def __len__(self) -> int:
        return 8  # MAX_DIMENSIONS_NUM-sized arrays

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__.setdefault("_items", {})[key] = value

    def __getitem__(self, key: Any) -> Any:
        return self.__dict__.setdefault("_items", {}).get(key, 0)

    def __repr__(self) -> str:
        return f"<native {self.__dict__.get('_label', '?')}>"


class NativeModule(types.ModuleType):
    """A compiled module of the Habana stack: each attribute is a native class (enum or struct), made on use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _Members(name, (_Struct,), {})
        setattr(self, name, cls)
        return cls


class PipeManager:
    """``media_pipe_api.pipeManager`` as ``backend/cal.py`` (1.24.1.482) drives it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.placeholders: list[tuple[str, list[int]]] = []  # (tensor name, dims) in creation order
        self.outputs: list[tuple[str, int]] = []  # (node name, port)
        self.success = sys.modules["media_pipe_types"].status.SUCCESS
        self.in_flight: list[list[int]] = []
        self.decoder_input_format: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            self.calls.append(name)
            return self.success
        return call

    def createGenericNode(self, inputs: Any, params: Any, guid: str, name: str) -> Any:  # noqa: N802
        self.calls.append("createGenericNode")
        if guid == "decoder_node":
            dims = [params.shape.dims[i] for i in range(params.shape.numDims)]
            self.placeholders.append((name, dims))
        return self.success

    def createPlaceHolder(self, inputs: Any, name: str, params: Any) -> Any:  # noqa: N802
        self.calls.append("createPlaceHolder")
        self.placeholders.append((name, [params.shape.dims[i] for i in range(params.shape.numDims)]))
        return self.success

    def createOutputPlaceHolder(self, outputs: Any) -> Any:  # noqa: N802
        self.calls.append("createOutputPlaceHolder")
        self.outputs.extend((port.nodeName, port.nodePort) for port in outputs)
        return self.success

    def decoderMemInit(self, largest_file: Any, input_format: Any, *args: Any) -> Any:  # noqa: N802
        """cal.py's decoder_init passes the native input format it mapped from the reader's output type."""
        self.calls.append("decoderMemInit")
        self.decoder_input_format = input_format
        return self.success

    def compile(self) -> Any:
        self.calls.append("compile")
        return "recipe"

    def getTensorInfo(self, num_outputs: int, num_inputs: int, num_ws: int) -> list[Any]:  # noqa: N802
        """Inputs: the placeholders; outputs: ``<node>_<port>``, as graph_legacy.py's process_recipe maps them.
        Dims are in the backend's order (reversed numpy order), as cal.py's get_hpu_tensor_info reads them."""
        self.calls.append("getTensorInfo")
        shapes = {name: dims for name, dims in self.placeholders}
        infos = [types.SimpleNamespace(name=name, dims=list(dims), numDims=len(dims))
                 for name, dims in self.placeholders[:num_inputs]]
        for node, port in self.outputs[:num_outputs]:
            dims = self.output_dims(node, shapes)
            infos.append(types.SimpleNamespace(name=f"{node}_{port}", dims=dims, numDims=len(dims)))
        return infos

    def output_dims(self, node: str, shapes: dict[str, list[int]]) -> list[int]:
        decoded = next(iter(shapes.values()))  # the decoder's output: (W, H, C, N) in the backend's order
        return list(decoded)

    def get_ptr(self) -> int:
        return 0xC0FFEE

    def getOutput(self) -> list[int]:  # noqa: N802
        """The device addresses of the graph outputs of the oldest batch in flight (cal.py's ``run_hpu`` allocated
        them through the framework proxy and legacy.py passed them to libmedia)."""
        self.calls.append("getOutput")
        return self.in_flight.pop(0)


class LibMedia:
    """``libmedia.so`` as ``backend/legacy.py`` calls it through ctypes: every call succeeds. ``mediaPipelineRunHpu``
    gets legacy.py's ``InputList`` (for ``BUFFER_LIST``: addresses and sizes of the reader's buffers), read back
    here as bytes, which is what the native decoder would receive; its output device addresses become the pipe
    manager's next ``getOutput``."""

    def __init__(self, manager: PipeManager) -> None:
        self.manager = manager
        self.batches: list[list[bytes]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        lib = self

        class Function:
            argtypes: Any = None
            restype: Any = None
            restypes: Any = None

            def __call__(self, *args: Any) -> int:
                if name == "mediaPipelineRunHpu":
                    lib.run_hpu(*args)
                return 0

        function = Function()
        setattr(self, name, function)
        return function

    def run_hpu(self, manager: Any, input_list: Any, frames: Any, resample: Any, crops: Any, host: Any,
                bypass: Any, out_addresses: Any) -> None:
        inputs = input_list._obj  # byref(InputList)
        buffers = inputs.list.bufferList
        addresses = ctypes.cast(buffers.bufferAddr, ctypes.POINTER(ctypes.c_void_p))  # raw, not NUL-terminated
        self.batches.append([ctypes.string_at(addresses[i], buffers.bufferSizes[i])
                             for i in range(inputs.listSize)])
        self.manager.in_flight.append([int(address) for address in out_addresses])


def install(monkeypatch: Any) -> dict[str, Any]:
    """Install the stand-ins (undone by ``monkeypatch``); returns the pipe manager and libmedia stand-ins."""
    import torch

    for name in NATIVE_MODULES:
        monkeypatch.setitem(sys.modules, name, NativeModule(name))
    manager = PipeManager()
    sys.modules["media_pipe_api"].pipeManager = lambda: manager
    bridge_tensors: dict[int, Any] = {}

    def module(name: str, **attrs: Any) -> None:
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so that submodules import
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)

    def data_ptr(tensor: Any) -> int:
        bridge_tensors[tensor.data_ptr()] = tensor
        return tensor.data_ptr()

    module("habana_frameworks.torch")
    module("habana_frameworks.torch.utils")
    module("habana_frameworks.torch.hpu", init=lambda: None)
    module("habana_frameworks.torch.utils.experimental", _data_ptr=data_ptr, _compute_stream=lambda: 0)
    module("habana_frameworks.torch.media_pyt_bridge", RegisterMediaDeleter=lambda close: None,
           CreatePytMediaProxy=lambda device_id: 0, GetOutputTensor=lambda address: bridge_tensors[address])
    libmedia = LibMedia(manager)
    real_cdll = ctypes.CDLL
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **k: libmedia if "libmedia" in str(name)
                        else real_cdll(name, *a, **k))
    for name in [m for m in sys.modules if m.startswith("habana_frameworks.mediapipe")]:
        monkeypatch.delitem(sys.modules, name)  # re-imported against the stand-ins
    importlib.import_module("habana_frameworks.mediapipe.backend.legacy")
    monkeypatch.setattr(ctypes, "CDLL", real_cdll)
    iterator_pytorch = importlib.import_module("habana_frameworks.mediapipe.plugins.iterator_pytorch")
    mediapipe = importlib.import_module("habana_frameworks.mediapipe.mediapipe")
    monkeypatch.setattr(mediapipe.MediaPipe, "framework_type", None, raising=False)
    # the device tensors of the framework proxy live in host memory here
    proxy = iterator_pytorch.PytorchDevice(name="hpu", device_id=0)
    proxy.torch_device = torch.device("cpu")
    monkeypatch.setattr(iterator_pytorch.MediaGenericPytorchIterator, "proxy_device", proxy)
    return {"manager": manager, "libmedia": libmedia}

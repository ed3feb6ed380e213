"""Plugin mechanics: entry-point discovery, clear errors, and a core that imports no workload."""

import ast
from pathlib import Path

import pytest

import suite
from suite.devices.base import DeviceAdapter
from suite.errors import UnknownPluginError
from suite.registry import device_names, load_device, load_workload, workload_names
from suite.workload import Workload

pytestmark = pytest.mark.mechanics  # nothing here depends on the transformers line


def test_builtins_are_found_through_entry_points():
    assert "bridgetower" in workload_names()
    assert "cpu" in device_names()
    assert issubclass(load_workload("bridgetower"), Workload)
    assert issubclass(load_device("cpu"), DeviceAdapter)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UnknownPluginError, match=r"unknown workload 'nope'; valid workloads: .*bridgetower"):
        load_workload("nope")
    with pytest.raises(UnknownPluginError, match=r"unknown device 'tpu'; valid devices: .*cpu"):
        load_device("tpu")


def test_external_plugin_is_discovered_like_builtins(test_plugins):
    assert "absent-standin" in device_names()
    adapter_cls = load_device("absent-standin")
    assert adapter_cls.availability().available is False


def test_suite_core_imports_nothing_from_workloads():
    offenders = []
    for path in Path(suite.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "workloads"]
    assert offenders == []


def test_cpu_path_needs_no_optional_package():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('torchvision', 'habana_frameworks', 'optimum', 'nvidia', 'datasets'):\n"
        "    sys.modules[name] = None  # importing any of them now raises ImportError\n"
        "from suite.registry import load_device, load_workload\n"
        "load_device('cpu'); load_workload('bridgetower')\n"
        "import workloads.bridgetower.workload, suite.run.matrix, suite.run.process, suite.run.launch, suite.cli\n"
        "import suite.tracking.upload, suite.audit.checks, suite.analysis.compare\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

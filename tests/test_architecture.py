"""The architecture as the tree shows it (issue 28), checked on the source: floors that import downward only, no import
circle, one MLflow home, one typed record. A module's size follows its one idea (issue 48 dropped the caps on lines
and members: they had started to shape the code more than the domain did).

The import graph is the runtime one: every ``import`` and ``from ... import`` in a module (inside functions too),
less those under ``if TYPE_CHECKING:`` (annotations only: nothing is imported when the code runs). ``from pkg import
name`` is an import of ``pkg.name`` where that is a module, else of ``pkg`` (import-linter's reading).
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

pytestmark = pytest.mark.mechanics

ROOT = Path(__file__).resolve().parent.parent

#: Floors, bottom first: a module imports its own floor's modules and those below, never above. The plugin
#: (workloads/) lives on the interfaces floor: it sees suite's configuration, devices, decoders, meters and the
#: workload interface, never the runner, the records or MLflow.
FLOORS = (
    ("foundation", ("suite.errors", "suite.text", "suite.redact", "suite.figures", "suite.fileio", "suite.events",
                    "suite.imaging", "suite.registry", "suite")),
    ("configuration", ("suite.config",)),
    ("interfaces", ("suite.devices", "suite.decoders", "suite.meters", "suite.workload", "workloads")),
    ("records", ("suite.results",)),
    ("analysis", ("suite.analysis",)),
    ("MLflow home", ("suite.tracking",)),
    ("runner", ("suite.run",)),
    ("audit", ("suite.audit",)),
    ("report", ("suite.report",)),
    ("command line", ("suite.cli", "suite.__main__")),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted([*ROOT.glob("suite/**/*.py"), *ROOT.glob("workloads/**/*.py")]):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
        node.test) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in wanted:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _floor(module: str) -> int:
    best, floor = -1, -1
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), index
    assert floor >= 0, f"{module} is on no floor: add it to FLOORS"
    return floor


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_every_import_goes_down_a_floor_or_stays_on_its_own():
    upward = [f"{a} ({FLOORS[_floor(a)][0]}) -> {b} ({FLOORS[_floor(b)][0]})"
              for a, targets in _graph().items() for b in targets if _floor(b) > _floor(a)]
    assert upward == []


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle():  # the check above is not vacuous
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _private_imports() -> list[str]:
    """``from <a module of ours> import _name`` anywhere in suite/ and workloads/: a private name used across a
    seam (issue 48: splits made for a line cap had left 11)."""
    modules = _modules()
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base.split(".")[0] in ("suite", "workloads"):
                found += [f"{name}: from {base} import {a.name}" for a in node.names  # a package's private
                          if a.name.startswith("_") and not a.name.startswith("__")  # module is its own
                          and f"{base}.{a.name}" not in modules]
    return found


def test_no_private_name_is_imported_across_modules():
    assert _private_imports() == []


def test_only_the_mlflow_home_imports_mlflow():
    importers = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                importers.append(name)
    assert importers and all(n.startswith("suite.tracking.") for n in importers), importers


def test_a_run_record_holds_a_typed_configuration():
    from suite.config import RunConfig
    from suite.results.record import RunResult

    assert typing.get_type_hints(RunResult)["config"] is RunConfig


def test_what_tox_leaves_in_the_tree_is_ignored():
    """tox writes a `.venv` *file* (the path of its environment) at the root; `git status` must not show it."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert subprocess.run(["git", "check-ignore", "-q", ".venv"], cwd=ROOT).returncode == 0

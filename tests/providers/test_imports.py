"""The import graph: no module of gpuprov, providers, activities or workflows imports itself
back through another (counting imports under TYPE_CHECKING, inside functions and by
`importlib.import_module("...")`), providers/ never reads the application's settings module,
and importing the registry loads no adapter."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpuprov", "providers", "activities", "workflows")


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name the module imports, wherever the import statement is."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules loading it loads: the module named (or the package
    holding the name), and each package above it that is not already above the importer."""
    modules = _modules()
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for name in _imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if not name or name == module:
                continue
            graph[module].add(name)
            parts = name.split(".")
            for depth in range(1, len(parts)):
                parent = ".".join(parts[:depth])
                if parent in modules and not f"{module}.".startswith(f"{parent}."):
                    graph[module].add(parent)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_back_through_another() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle_hidden_behind_type_checking() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_providers_never_import_the_applications_settings() -> None:
    graph = import_graph()
    readers = sorted(
        m
        for m, targets in graph.items()
        if m.startswith("providers") and ("gpuprov.config" in targets)
    )
    assert readers == []


def test_importing_the_registry_loads_no_adapter_and_nothing_of_gpuprov() -> None:
    probe = (
        "import sys, providers\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('gpuprov') or "
        "(m.startswith('providers.') and m.count('.') > 1))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == []

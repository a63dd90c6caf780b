"""The project's import graph, read from the source (no module is imported): every dotted name a
module imports, wherever the statement is (under TYPE_CHECKING, inside a function, or by
`importlib.import_module("...")`). Used by the cycle test (tests/providers/test_imports.py) and
the layer test (tests/test_layers.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpuprov", "providers", "activities", "workflows")


def modules_under(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of `packages` under `root`."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> Iterator[str]:
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


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """module -> the project modules loading it loads: the module named (or the package
    holding the name), and each package above it that is not already above the importer."""
    modules = modules_under() if modules is None else modules
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for name in imported_names(module, path):
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

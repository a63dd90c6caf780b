"""The import graph: no module of gpuprov, providers, activities or workflows imports itself
back through another (counting imports under TYPE_CHECKING, inside functions and by
`importlib.import_module("...")`), providers/ never reads the application's settings module,
and importing the registry loads no adapter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.import_graph import ROOT, cycles, import_graph

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


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


def test_the_node_agent_imports_nothing_of_the_house_and_providers_only_it_of_gpuprov() -> None:
    graph = import_graph()
    node = {module for module in graph if module.startswith("gpuprov.node")}
    assert node and all(
        name in node or name == "gpuprov" for module in node for name in graph[module]
    )
    reached = {
        (module, name)
        for module, names in graph.items()
        if module.split(".")[0] == "providers"
        for name in names
        if name.split(".")[0] == "gpuprov" and name not in node and name != "gpuprov"
    }
    assert reached == set()

"""The house's layers, enforced: a module's path says its layer, and a module imports only from
its own layer and the layers its layer stands on (docs/architecture.md, "Layout").

    gpuprov.node                          the node agent: imports nothing of the house
    providers                             cloud adapters (the fake cloud may run gpuprov.node)
    core: gpuprov.models, .contract,      public payloads, Temporal's names, settings, the
          .config, .metrics, .policy      metric catalogue, the ErrorKind policy table
    gpuprov.store                         the database and everything kept in it
    gpuprov.sdk                           talking to Temporal: client, connection, codec
    activities                            the cloud and node steps
    workflows                             deterministic workflow code
    gpuprov.api                           the HTTP API: never workflow code
    gpuprov.engine                        the worker process's wiring
    gpuprov.cli                           the command line, dev and demo stacks: on top

Imports are read from the source wherever they are (inside functions, under TYPE_CHECKING, by
importlib), so a late import does not slip past."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.import_graph import ROOT, import_graph, modules_under

# Longest prefix wins.
LAYER_OF_PREFIX = {
    "gpuprov.node": "node",
    "providers": "providers",
    "gpuprov": "core",  # the package itself and its core modules
    "gpuprov.store": "store",
    "gpuprov.sdk": "sdk",
    "activities": "activities",
    "workflows": "workflows",
    "gpuprov.api": "api",
    "gpuprov.engine": "engine",
    "gpuprov.cli": "cli",
}
CORE = {"gpuprov", "gpuprov.models", "gpuprov.contract", "gpuprov.config", "gpuprov.metrics",
        "gpuprov.policy"}  # fmt: skip
BELOW = {
    "node": set(),
    "providers": {"node"},
    "core": {"providers"},
    "store": {"core", "providers"},
    "sdk": {"store", "core", "providers"},
    "activities": {"sdk", "store", "core", "providers"},
    "workflows": {"activities", "store", "core", "providers"},
    "api": {"sdk", "store", "core", "providers", "node"},
    "engine": {"api", "workflows", "activities", "sdk", "store", "core", "providers", "node"},
    "cli": {
        "engine",
        "api",
        "workflows",
        "activities",
        "sdk",
        "store",
        "core",
        "providers",
        "node",
    },
}


def layer_of(module: str) -> str:
    prefixes = [p for p in LAYER_OF_PREFIX if module == p or module.startswith(f"{p}.")]
    layer = LAYER_OF_PREFIX[max(prefixes, key=len)]
    if layer == "core" and module not in CORE:
        raise AssertionError(
            f"{module}: a module of gpuprov/ itself that is not core; give it a room"
        )
    return layer


def violations(graph: dict[str, set[str]]) -> list[str]:
    """'importer (layer) -> imported (layer)' for every import that goes sideways or up."""
    found = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        bad: list[tuple[str, str]] = []
        for target in sorted(targets):
            theirs = layer_of(target)
            if target == "gpuprov" and mine != "node":
                continue  # the package's own __init__: a docstring, loaded by any gpuprov.*
            if theirs != mine and theirs not in BELOW[mine]:
                bad.append((target, theirs))
        for target, theirs in bad:  # a package above a module already named says nothing new
            if not any(other.startswith(f"{target}.") for other, _ in bad):
                found.append(f"{module} ({mine}) -> {target} ({theirs})")
    return found


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    assert violations(import_graph()) == []


def test_every_module_of_gpuprov_is_in_a_room() -> None:
    for module in modules_under():
        layer_of(module)  # raises for a flat module that is not core


def _tree(root: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return import_graph(modules_under(root))


@pytest.mark.parametrize(
    ("importer", "statement", "expected"),
    [
        ("providers/aws/cloud.py", "from gpuprov.store.records import Records",
         "providers.aws.cloud (providers) -> gpuprov.store.records (store)"),
        ("gpuprov/store/records.py", "def late():\n    import activities.cloud",
         "gpuprov.store.records (store) -> activities.cloud (activities)"),
        ("activities/cloud.py", "from workflows.job import ProvisionJob",
         "activities.cloud (activities) -> workflows.job (workflows)"),
        ("gpuprov/api/app.py", "from workflows import job",
         "gpuprov.api.app (api) -> workflows.job (workflows)"),
        ("gpuprov/sdk/client.py", "import importlib\nimportlib.import_module('workflows.job')",
         "gpuprov.sdk.client (sdk) -> workflows.job (workflows)"),
        ("gpuprov/node/agent.py", "from gpuprov.models import JobSpec",
         "gpuprov.node.agent (node) -> gpuprov.models (core)"),
        ("gpuprov/models.py", "from gpuprov.cli.main import main",
         "gpuprov.models (core) -> gpuprov.cli.main (cli)"),
    ],
)  # fmt: skip
def test_a_planted_violation_is_found(tmp_path, importer, statement, expected) -> None:
    files = {
        f"{package}/__init__.py": ""
        for package in ("gpuprov", "gpuprov/store", "gpuprov/sdk", "gpuprov/api", "gpuprov/cli",
                        "gpuprov/node", "providers", "providers/aws", "activities", "workflows")
    }  # fmt: skip
    files |= {
        "gpuprov/models.py": "",
        "gpuprov/store/records.py": "from gpuprov.models import *\n",
        "gpuprov/sdk/client.py": "from gpuprov.store import records\n",
        "gpuprov/api/app.py": "from gpuprov.sdk import client\n",
        "gpuprov/cli/main.py": "from gpuprov.api import app\nfrom workflows import job\n",
        "gpuprov/node/agent.py": "import json\n",
        "providers/aws/cloud.py": "",
        "activities/cloud.py": "from gpuprov.store import records\n",
        "workflows/job.py": "from activities import cloud\n",
    }
    assert violations(_tree(tmp_path / "clean", files)) == []
    files[importer] += statement + "\n"
    assert violations(_tree(tmp_path / "planted", files)) == [expected]


def test_the_api_process_loads_no_workflow_or_activity_code() -> None:
    probe = (
        "import sys\n"
        "from gpuprov.api.app import create_app\n"
        "print('\\n'.join(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('workflows', 'activities'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == []

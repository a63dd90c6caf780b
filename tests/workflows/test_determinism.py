"""Workflow code stays deterministic: a static check of every module under workflows/.

Production workers run workflow code outside temporalio's sandbox by default (docs/operations.md,
`[temporal] workflow_sandbox`), and most of the workflow logic is passed through the sandbox
anyway (workflows/attempt.py, teardown.py, steps.py ...). So this check reads the source of every
workflow module and rejects what makes a replay diverge: wall clocks, randomness, threads,
environment and file or network I/O. Time comes from `workflow.now()`, waiting from
`workflow.sleep()` / `workflow.wait_condition()`, ids from `workflow.uuid4()`, and all I/O from
activities.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"

FORBIDDEN_MODULES = {
    "time": "wall clock: use workflow.now() / workflow.sleep()",
    "random": "randomness: use workflow.random()",
    "secrets": "randomness: use workflow.random()",
    "uuid": "random ids: use workflow.uuid4()",
    "os": "environment and files: read them in an activity",
    "socket": "network I/O: use an activity",
    "subprocess": "processes: use an activity",
    "threading": "threads: the workflow runs on the SDK's event loop",
    "concurrent": "threads: the workflow runs on the SDK's event loop",
    "httpx": "network I/O: use an activity",
    "asyncssh": "network I/O: use an activity",
    "sqlalchemy": "database I/O: use a (local) activity",
    "sqlmodel": "database I/O: use a (local) activity",
    "pathlib": "files: use an activity",
    "gpuprov.store.records": "database I/O: use a (local) activity",
    "gpuprov.store.db": "database I/O: use a (local) activity",
}
# Attribute calls that read the wall clock or the environment, whatever they were imported as.
FORBIDDEN_CALLS = {
    "now": "wall clock: use workflow.now()",
    "utcnow": "wall clock: use workflow.now()",
    "today": "wall clock: use workflow.now()",
    "getenv": "environment: read it in an activity",
}
FORBIDDEN_BUILTINS = {"open": "files: use an activity", "input": "I/O: use an activity"}


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Every non-deterministic construct in `source`, as "file:line: what (why)"."""
    found = []

    def report(node: ast.AST, what: str, why: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what} ({why})")

    def check_module(node: ast.AST, name: str) -> None:
        for forbidden, why in FORBIDDEN_MODULES.items():
            if name == forbidden or name.startswith(forbidden + "."):
                report(node, f"import {name}", why)

    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_module(node, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            check_module(node, node.module)
        elif isinstance(node, ast.Call):
            func = node.func
            on_workflow = isinstance(func, ast.Attribute) and (
                isinstance(func.value, ast.Name) and func.value.id == "workflow"
            )
            if isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_CALLS and not on_workflow:
                report(node, f".{func.attr}()", FORBIDDEN_CALLS[func.attr])
            elif isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS:
                report(node, f"{func.id}()", FORBIDDEN_BUILTINS[func.id])
    return found


def workflow_modules() -> list[Path]:
    return sorted(WORKFLOWS.glob("*.py"))


def test_every_workflow_module_is_checked() -> None:
    names = {path.stem for path in workflow_modules()}
    assert {"job", "attempt", "teardown", "steps", "reconcile", "offers", "health"} <= names


@pytest.mark.parametrize("path", workflow_modules(), ids=lambda path: path.name)
def test_workflow_module_is_free_of_clocks_randomness_and_io(path: Path) -> None:
    assert violations(path.read_text(), path.name) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time\n", "import time"),
        ("import random as r\n", "import random"),
        ("from uuid import uuid4\n", "import uuid"),
        ("import os.path\n", "import os.path"),
        ("from gpuprov.store.records import Records\n", "import gpuprov.store.records"),
        ("from datetime import datetime\nx = datetime.now()\n", ".now()"),
        ("from datetime import date\nx = date.today()\n", ".today()"),
        ("import datetime\nx = datetime.datetime.now()\n", ".now()"),
        ("def f(clock):\n    return clock.utcnow()\n", ".utcnow()"),
        ("data = open('spec.json').read()\n", "open()"),
        ("import httpx\n", "import httpx"),
    ],
)
def test_the_check_catches(source: str, expected: str) -> None:
    found = violations(source)
    assert any(expected in line for line in found), found


def test_the_check_allows_what_workflows_use() -> None:
    source = (
        "import asyncio\nimport math\nfrom datetime import timedelta\n"
        "from temporalio import workflow\n"
        "async def f():\n    now = workflow.now()\n    await workflow.sleep(1)\n"
        "    await asyncio.gather()\n    return timedelta(seconds=math.ceil(1.5)), now\n"
    )
    assert violations(source) == []

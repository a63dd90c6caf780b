"""Temporal's names are spelled once, in gpuprov/contract.py: no workflow type, signal, query,
update or search-attribute name appears anywhere else in the product (gpuprov, activities,
workflows, providers, worker.py, bench, chaos). Read from the source:
- a workflow, signal, query or update is declared with `name=contract.<NAME>` (a bare
  `@workflow.defn` or `@workflow.signal` would take its name from the Python identifier);
- starting, signalling, querying or updating a workflow never names it with a string literal;
- no search attribute key is made outside the contract;
- no string (docstrings aside) equals a workflow type or search-attribute name."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

from gpuprov import contract
from tests.import_graph import ROOT

PRODUCT = ("gpuprov", "activities", "workflows", "providers", "bench", "chaos", "worker.py")
CONTRACT = ROOT / "gpuprov" / "contract.py"
DECLARATIONS = {"defn", "signal", "query", "update"}
# Client calls whose first argument is a workflow type, signal, query or update name.
NAMED_CALLS = {
    "start_workflow", "execute_workflow", "signal_with_start_workflow", "signal", "query",
    "execute_update", "start_update", "ScheduleActionStartWorkflow",
}  # fmt: skip
KEY_MAKERS = {"for_keyword", "for_text", "for_int", "for_float", "for_bool", "for_datetime",
              "for_keyword_list", "for_name_and_type"}  # fmt: skip


def _distinct_names() -> set[str]:
    """Names distinctive enough to find as bare strings (signal and query names are words)."""
    types = {contract.PROVISION_JOB, contract.PLAN_OFFERS, contract.CHECK_HEALTH}
    types |= {contract.RECONCILE, contract.WATCH_WORKERS}
    return types | {key.name for key in contract.SEARCH_ATTRIBUTES}


def _is_contract_name(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "contract"
    )


def _callee(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled_names(source: str, where: str) -> Iterator[str]:
    """Every place in `source` that spells a Temporal name itself."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    names = _distinct_names()
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                target = call.func if call else decorator
                if not (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "workflow"
                    and target.attr in DECLARATIONS
                ):
                    continue
                named = [k.value for k in call.keywords if k.arg == "name"] if call else []
                if not named or not _is_contract_name(named[0]):
                    yield f"{line}: @workflow.{target.attr} on {node.name} without name=contract.*"
        elif isinstance(node, ast.Call):
            callee = _callee(node.func)
            first = node.args[0] if node.args else None
            if (
                callee in NAMED_CALLS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                yield f"{line}: {callee}({first.value!r}, ...)"
            if callee in KEY_MAKERS:
                yield f"{line}: a search attribute key made outside the contract"
        elif isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings:
            yield f"{line}: the string {node.value!r}"


def _product_files() -> Iterator[Path]:
    for entry in PRODUCT:
        path = ROOT / entry
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def test_no_temporal_name_is_spelled_outside_the_contract() -> None:
    found = [
        place
        for path in _product_files()
        if path != CONTRACT
        for place in spelled_names(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_every_kind_of_spelling_is_found() -> None:
    planted = textwrap.dedent(
        '''
        """Mentions ProvisionJob in prose, which is fine."""
        from temporalio import workflow
        from temporalio.common import SearchAttributeKey

        @workflow.defn
        class Bare:
            @workflow.signal
            def release(self) -> None: ...

            @workflow.query(name="status")
            def status(self) -> str: ...

        async def caller(client, handle):
            await client.start_workflow("ProvisionJob", None, id="x", task_queue="q")
            await handle.signal("workers_changed")
            await handle.query(contract.JOB_STATUS)
            key = SearchAttributeKey.for_keyword("GpuprovState")
            return f"{key} GpuprovRegion" + "CheckHealth"
        '''
    )
    found = [place.split(": ", 1)[1] for place in spelled_names(planted, "planted.py")]
    assert sorted(found) == sorted(
        [
            "@workflow.defn on Bare without name=contract.*",
            "@workflow.signal on release without name=contract.*",
            "@workflow.query on status without name=contract.*",
            "start_workflow('ProvisionJob', ...)",
            "the string 'ProvisionJob'",
            "signal('workers_changed', ...)",
            "a search attribute key made outside the contract",
            "the string 'GpuprovState'",
            "the string 'CheckHealth'",
        ]
    )

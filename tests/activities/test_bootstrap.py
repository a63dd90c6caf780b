"""SSH bootstrap against real SSH servers on loopback: OpenSSH's sshd and an asyncssh server.

The agent really runs (the system python3, as on a bare node) and registers through the real
control-plane API with the token the activity minted; nothing about SSH is mocked. A register
request arriving at the API is where a test looks at `ps` and /proc: the agent is alive,
waiting for its answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from sqlmodel import select
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities import bootstrap
from activities.bootstrap import (
    REMOTE_ROOT,
    BootstrapActivities,
    BootstrapInput,
    BootstrapResult,
    RecordsJoinTokens,
    start_command,
)
from activities.ssh_keys import KeyStore
from gpuprov.api.app import create_app, serving
from gpuprov.engine.worker import open_records
from gpuprov.store.db import JoinToken, WorkerRecord
from gpuprov.store.records import Records
from gpuprov.store.ssh_records import SshRecords
from providers import agent_artifact
from providers.base import SshEndpoint
from tests.helpers import decoded_history, eventually
from tests.sshd import (
    TestServer,
    free_port,
    running_asyncssh_server,
    running_sshd,
    start_asyncssh_server,
)
from tests.tls import Pki

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

VM = "boot-a1-n0-abc123"
JOB = "boot"


@dataclass
class ControlPlane:
    """The real API, recording each register body and a process snapshot taken meanwhile."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> list[str]:
        return [body["token"] for body in self.bodies]


async def process_snapshot() -> str:
    """`ps` output plus every process's command line and environment."""
    ps = await asyncio.create_subprocess_exec(
        "ps", "-eo", "pid,args", stdout=asyncio.subprocess.PIPE
    )
    listing, _ = await ps.communicate()
    return listing.decode(errors="replace") + await asyncio.to_thread(_proc_dump)


def _proc_dump() -> str:
    chunks = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        for name in ("cmdline", "environ"):
            try:
                chunks.append((entry / name).read_bytes().replace(b"\0", b" ").decode("latin-1"))
            except OSError:
                continue
    return "\n".join(chunks)


def sniffing(app: Any, plane: ControlPlane) -> Any:
    """ASGI wrapper keeping each register request's JSON body (the test's only token source)
    and a process snapshot taken while the agent waits for its answer."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") == "/v1/workers/register":
            plane.snapshots.append(await process_snapshot())

        async def recording() -> Any:
            message = await receive()
            if scope.get("path") == "/v1/workers/register" and message.get("body"):
                plane.bodies.append(json.loads(message["body"]))
            return message

        await app(scope, recording if scope["type"] == "http" else receive, send)

    return wrapped


@asynccontextmanager
async def control_plane(records: Records) -> AsyncIterator[ControlPlane]:
    plane = ControlPlane()
    port = free_port()
    async with serving(sniffing(create_app(records), plane), "127.0.0.1", port):
        plane.url = f"http://127.0.0.1:{port}"
        yield plane


@pytest.fixture
def records(tmp_path: Path) -> Records:
    """SQLite only: bootstrap's database use is mint_token and reads (tested on both elsewhere)."""
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    records.record_vm(
        job=JOB, node_index=0, attempt=1, vm=VM, provider="ssh", region="owned", zone=None
    )
    yield records
    records.db.dispose()


@pytest.fixture
def keys(tmp_path: Path, records: Records) -> KeyStore:
    return KeyStore(SshRecords(records.db), directory=tmp_path / "worker-keys")


@pytest.fixture
async def plane(records: Records) -> AsyncIterator[ControlPlane]:
    async with control_plane(records) as plane:
        yield plane


def bootstrapper(records: Records, keys: KeyStore, plane: ControlPlane) -> BootstrapActivities:
    return BootstrapActivities(
        {}, keys, RecordsJoinTokens(records, timedelta(minutes=5)), plane.url, agent_timeout=30
    )


def request_for(
    server_host: str, port: int, user: str = "root", **overrides: Any
) -> BootstrapInput:
    fingerprint = overrides.pop("fingerprint", None)
    data: dict[str, Any] = {
        "provider": "ssh",
        "vm": VM,
        "ssh": SshEndpoint(
            host=server_host, port=port, user=user, host_key_fingerprint=fingerprint
        ),
        "boot_timeout": 10,
        "poll_interval": 0.1,
    }
    data.update(overrides)
    return BootstrapInput(**data)


def to(server: TestServer, **overrides: Any) -> BootstrapInput:
    return request_for(server.host, server.port, server.user, **overrides)


async def run(
    activities: BootstrapActivities,
    request: BootstrapInput,
    beats: list[Any] | None = None,
    env: ActivityEnvironment | None = None,
) -> BootstrapResult:
    env = env or ActivityEnvironment()
    if beats is not None:
        env.on_heartbeat = lambda *details: beats.append(details)
    return await env.run(activities.bootstrap, request)


async def failure(activities: BootstrapActivities, request: BootstrapInput) -> ApplicationError:
    with pytest.raises(ApplicationError) as raised:
        await run(activities, request)
    return raised.value


def rows(records: Records, table: Any) -> list[Any]:
    with records.db.session() as session:
        return list(session.exec(select(table)).all())


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------- OpenSSH's sshd


async def test_agent_registers_over_openssh_with_the_token_only_on_its_stdin(
    tmp_path: Path,
    records: Records,
    keys: KeyStore,
    plane: ControlPlane,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with running_sshd(tmp_path / "sshd", authorized=[keys.client_key()]) as sshd:
        result = await run(
            bootstrapper(records, keys, plane), to(sshd, host_key=sshd.host_public_key)
        )
        sshd_log = sshd.log()

    # The API got the token the activity minted, and it was the one that counted.
    [token] = plane.tokens
    [stored] = rows(records, JoinToken)
    assert stored.token_sha256 == Records.hash_token(token) and stored.used_at is not None
    [worker] = rows(records, WorkerRecord)
    assert (worker.vm, worker.job, worker.origin) == (VM, JOB, "managed")
    assert result.worker_id == worker.id
    assert result.host_key_fingerprint == sshd.host_fingerprint
    assert result.host_key_trust == "expected"

    # While the agent waited for its answer it was running, and no process showed the token.
    [snapshot] = plane.snapshots
    assert f"{REMOTE_ROOT}/{VM}/agent.pyz register --url {plane.url}" in snapshot
    assert token not in snapshot
    # Nor any log line (ours, asyncssh's at DEBUG, sshd's), nor anything left on the node.
    assert "Opening SSH connection" in caplog.text and token not in caplog.text
    assert "Accepted publickey" in sshd_log and token not in sshd_log
    node_files = files_under(sshd.home)
    assert node_files  # the agent was put there: there is something to scan
    assert all(token.encode() not in content for content in node_files.values())
    assert not [name for name in node_files if "history" in name]
    agent = sshd.home / REMOTE_ROOT / VM / "agent.pyz"
    assert agent.read_bytes() == agent_artifact.artifact()  # the one artifact, as pinned
    assert stat.S_IMODE(agent.stat().st_mode) == 0o600
    assert stat.S_IMODE(agent.parent.stat().st_mode) == 0o700


async def test_a_wrong_host_key_is_refused_before_anything_is_sent(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    with running_sshd(tmp_path / "sshd", authorized=[keys.client_key()]) as sshd:
        started = time.monotonic()
        error = await failure(
            bootstrapper(records, keys, plane),
            to(sshd, host_key=impostor.export_public_key().decode()),
        )
        elapsed = time.monotonic() - started

    assert error.type == "Failed" and error.non_retryable
    assert sshd.host_fingerprint in error.message and "not sending it anything" in error.message
    assert elapsed < 5, "a mismatch is final at once, not retried until the boot timeout"
    assert rows(records, JoinToken) == [] and plane.bodies == []
    assert not (sshd.home / REMOTE_ROOT).exists()


async def test_a_key_not_yet_authorized_is_retried_until_cloud_init_adds_it(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    with running_sshd(tmp_path / "sshd", rsa_too=True) as sshd:
        beats: list[Any] = []
        attempt = asyncio.create_task(run(bootstrapper(records, keys, plane), to(sshd), beats))

        def refused() -> bool:
            problems = [details[0].get("last_problem") for details in beats if details]
            return any(problem and "permission denied" in problem for problem in problems)

        # the key was refused at least once (and is being retried) before cloud-init adds it
        await eventually(refused, "a try refused with permission denied")
        assert not attempt.done()
        sshd.authorize(keys.client_key())
        result = await attempt

    assert result.worker_id is not None and result.host_key_trust == "first-use"
    assert result.host_key_fingerprint == sshd.host_fingerprint  # ed25519, as OpenSSH prefers
    problems = [details[0].get("last_problem") for details in beats if details]
    assert any(problem and "permission denied" in problem for problem in problems)


async def test_a_retry_after_the_agent_registered_does_nothing(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    activities = bootstrapper(records, keys, plane)
    with running_sshd(tmp_path / "sshd", authorized=[keys.client_key()]) as sshd:
        await run(activities, to(sshd))
        again = await run(activities, to(sshd))
    assert again.already_registered and again.worker_id is None
    assert len(plane.bodies) == 1 and len(rows(records, JoinToken)) == 1


# ---------------------------------------------------------------------- an asyncssh server


async def test_host_key_generated_for_the_vm_is_expected_before_first_contact(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    injected = keys.host_key_for(VM)  # what create would put in the node's user data
    async with running_asyncssh_server(
        tmp_path / "node", host_key=injected, authorized=[keys.client_key()]
    ) as node:
        result = await run(bootstrapper(records, keys, plane), to(node))
    assert result.host_key_trust == "expected"
    assert result.host_key_fingerprint == injected.get_fingerprint("sha256")
    assert len(plane.bodies) == 1


async def test_a_node_one_worker_created_is_bootstrapped_by_another_against_the_pin(
    tmp_path: Path, records: Records, plane: ControlPlane
) -> None:
    """Worker A creates the node (injecting and pinning its host key); worker B, on another
    host (its own database connection, no shared directory), logs in with the deployment's key
    and verifies the node against A's pin before sending anything."""
    deployment_key = asyncssh.generate_private_key("ssh-ed25519")
    worker_a = KeyStore(SshRecords(records.db), client_key=deployment_key)
    injected = worker_a.host_key_for(VM)
    other_host = open_records(records.db.url.render_as_string(hide_password=False))
    worker_b = KeyStore(SshRecords(other_host.db), client_key=deployment_key)
    try:
        async with running_asyncssh_server(
            tmp_path / "node", host_key=injected, authorized=[worker_a.client_key()]
        ) as node:
            result = await run(bootstrapper(other_host, worker_b, plane), to(node))
        [worker] = rows(records, WorkerRecord)
        records.set_worker_state(worker.id, "revoked", JOB)  # so a new agent run is needed
        impostor = asyncssh.generate_private_key("ssh-ed25519")
        async with running_asyncssh_server(
            tmp_path / "impostor", host_key=impostor, authorized=[deployment_key]
        ) as fake:
            refused = await failure(bootstrapper(other_host, worker_b, plane), to(fake))
    finally:
        other_host.db.dispose()
    assert result.host_key_trust == "expected"
    assert result.host_key_fingerprint == injected.get_fingerprint("sha256")
    assert refused.type == "Failed" and impostor.get_fingerprint("sha256") in refused.message
    assert len(plane.bodies) == 1, "nothing was sent to the impostor"


async def test_fingerprint_reported_by_the_cloud_is_checked(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    async with running_asyncssh_server(tmp_path / "node", authorized=[keys.client_key()]) as node:
        activities = bootstrapper(records, keys, plane)
        wrong = asyncssh.generate_private_key("ssh-ed25519").get_fingerprint("sha256")
        error = await failure(activities, to(node, fingerprint=wrong))
        assert error.type == "Failed" and wrong in error.message
        result = await run(activities, to(node, fingerprint=node.host_fingerprint))
    assert result.host_key_trust == "fingerprint"
    assert keys.known_host_key(VM) is not None, "the verified key is recorded for next time"


async def test_first_use_pins_the_key_and_a_different_key_later_is_refused(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    activities = bootstrapper(records, keys, plane)
    port = free_port()
    async with running_asyncssh_server(
        tmp_path / "first", port=port, authorized=[keys.client_key()]
    ) as first:
        result = await run(activities, to(first))
    assert result.host_key_trust == "first-use"
    pinned = keys.known_host_key(VM)
    assert pinned is not None and pinned.public_data == first.host_key.public_data
    # Let a new agent run be needed, then put another machine behind the same address.
    [worker] = rows(records, WorkerRecord)
    records.set_worker_state(worker.id, "revoked", JOB)
    async with running_asyncssh_server(
        tmp_path / "second", port=port, authorized=[keys.client_key()]
    ) as second:
        error = await failure(activities, to(second))
    assert error.type == "Failed" and second.host_fingerprint in error.message
    assert len(plane.bodies) == 1, "nothing was sent to the second machine"


async def test_an_unreachable_host_runs_into_its_boot_timeout_and_is_failed(
    records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    beats: list[Any] = []
    request = request_for("127.0.0.1", free_port(), boot_timeout=1.0, poll_interval=0.2)
    started = time.monotonic()
    with pytest.raises(ApplicationError) as raised:
        await run(bootstrapper(records, keys, plane), request, beats)
    elapsed = time.monotonic() - started

    assert raised.value.type == "Failed" and raised.value.non_retryable
    assert "boot timeout" in raised.value.message and "refused" in raised.value.message.lower()
    assert 1.0 <= elapsed < 4
    assert max(details[0]["attempts"] for details in beats if details) >= 3
    assert rows(records, JoinToken) == []


async def test_a_retried_attempt_keeps_its_original_deadline(
    records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, heartbeat_details=[{"started_at": time.time() - 60, "attempts": 40}]
    )
    request = request_for("127.0.0.1", free_port(), boot_timeout=30)
    started = time.monotonic()
    with pytest.raises(ApplicationError) as raised:
        await run(bootstrapper(records, keys, plane), request, env=env)
    assert raised.value.type == "Failed" and time.monotonic() - started < 1


async def test_a_late_sshd_is_waited_for(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    port = free_port()
    beats: list[Any] = []
    attempt = asyncio.create_task(
        run(
            bootstrapper(records, keys, plane),
            request_for("127.0.0.1", port, boot_timeout=10),
            beats,
        )
    )
    # a try found nothing listening (and is being retried) before the sshd comes up
    await eventually(
        lambda: any(details and details[0].get("attempts") for details in beats),
        "a failed connection try",
    )
    assert not attempt.done()
    node = await start_asyncssh_server(tmp_path / "node", port=port, authorized=[keys.client_key()])
    try:
        result = await attempt
    finally:
        node.stop()
    assert result.worker_id is not None


async def test_an_agent_the_api_refuses_is_failed_with_its_words(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    records.set_vm_status(VM, "terminated")  # its teardown began: the API refuses the node
    async with running_asyncssh_server(tmp_path / "node", authorized=[keys.client_key()]) as node:
        error = await failure(bootstrapper(records, keys, plane), to(node))
    assert error.type == "Failed" and "exited 2" in error.message and "409" in error.message
    assert plane.tokens and plane.tokens[0] not in error.message


@pytest.mark.parametrize("uploaded", ["tampered", "truncated"])
async def test_an_agent_that_does_not_match_its_pin_is_refused_before_the_token_is_sent(
    tmp_path: Path,
    records: Records,
    keys: KeyStore,
    plane: ControlPlane,
    monkeypatch: pytest.MonkeyPatch,
    uploaded: str,
) -> None:
    good = agent_artifact.artifact()
    bad = good.replace(b"AGENT_VERSION = ", b"AGENT_VERSION = 'x' or ")
    monkeypatch.setattr(
        bootstrap, "agent_source", lambda: bad if uploaded == "tampered" else good[:-99]
    )
    async with running_asyncssh_server(tmp_path / "node", authorized=[keys.client_key()]) as node:
        error = await failure(bootstrapper(records, keys, plane), to(node))
        installed = node.home / REMOTE_ROOT / VM / "agent.pyz"
        assert installed.exists() and installed.read_bytes() != good  # it arrived, changed
    assert error.type == "Failed" and "does not match its pinned SHA-256" in error.message
    assert f"pinned {agent_artifact.sha256()}" in error.message
    assert plane.bodies == []  # the agent never ran: nothing reached the API
    [stored] = rows(records, JoinToken)
    assert stored.used_at is None  # the token, minted, was never spent


async def test_a_node_without_python3_is_failed_saying_so(
    tmp_path: Path, records: Records, keys: KeyStore, plane: ControlPlane
) -> None:
    tools = tmp_path / "tools"  # the upload needs mkdir, cat and mv; nothing else is there
    tools.mkdir()
    for tool in ("mkdir", "cat", "mv"):
        (tools / tool).symlink_to(f"/bin/{tool}")
    async with running_asyncssh_server(
        tmp_path / "node", authorized=[keys.client_key()], path=str(tools)
    ) as node:
        error = await failure(bootstrapper(records, keys, plane), to(node))
    assert error.type == "Failed" and "python3 not found" in error.message
    assert plane.bodies == []


def test_the_start_command_carries_no_secret_and_quotes_the_url() -> None:
    directory = f'"$HOME"/{REMOTE_ROOT}/{VM}'
    agent = f"python3 -I -S {directory}/agent.pyz"
    options = "--url 'http://10.0.0.1:8080/a b'"
    check, register, daemon = start_command(VM, "http://10.0.0.1:8080/a b").split(" && ")
    assert check.startswith("python3 -I -S -c ")  # the pin first: nothing runs unless it holds
    assert check.endswith(f" {directory}/agent.pyz {agent_artifact.sha256()}")
    assert register == f"{agent} register {options}"
    # Registered: the heartbeat daemon, detached, with the credential register stored.
    assert daemon == (
        f"{{ $(command -v setsid) nohup {agent} run {options} --state-dir {directory}"
        f" < /dev/null >> {directory}/agent.log 2>&1 & }}"
    )
    with_ca = start_command(VM, "https://api:8443", ca=True)
    assert with_ca.count(f"--ca-file {directory}/api-ca.pem") == 2  # register and run


async def test_over_https_the_api_ca_goes_to_the_node_and_the_agent_pins_it(
    tmp_path: Path, records: Records, keys: KeyStore
) -> None:
    pki = Pki(tmp_path / "pki")
    port = free_port()
    tls = {
        "tls_cert_file": str(pki.path("server.pem")),
        "tls_key_file": str(pki.path("server.key")),
    }
    api_url = f"https://127.0.0.1:{port}"
    activities = BootstrapActivities(
        {},
        keys,
        RecordsJoinTokens(records, timedelta(minutes=5)),
        api_url,
        api_ca_pem=pki.ca.read_text(),
        agent_timeout=30,
    )
    async with (
        serving(create_app(records), "127.0.0.1", port, **tls),
        running_asyncssh_server(tmp_path / "node", authorized=[keys.client_key()]) as node,
    ):
        result = await run(activities, to(node))
    assert result.worker_id is not None
    assert [worker.vm for worker in rows(records, WorkerRecord)] == [VM]
    installed = node.home / REMOTE_ROOT / VM / "api-ca.pem"
    assert installed.read_text() == pki.ca.read_text()
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600


# ---------------------------------------------------------------------- through Temporal


@workflow.defn(name="BootstrapOnly", sandboxed=False)
class BootstrapOnly:
    """Test-only: the one step the job workflow will run after wait_running."""

    @workflow.run
    async def run(self, request: BootstrapInput) -> BootstrapResult:
        return await workflow.execute_activity_method(
            BootstrapActivities.bootstrap,
            request,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


async def test_the_token_never_enters_temporal_history(
    tmp_path: Path,
    client: Any,
    task_queue: str,
    records: Records,
    keys: KeyStore,
    plane: ControlPlane,
) -> None:
    activities = bootstrapper(records, keys, plane)
    with running_sshd(tmp_path / "sshd", authorized=[keys.client_key()]) as sshd:
        async with Worker(
            client,
            task_queue=task_queue,
            workflows=[BootstrapOnly],
            activities=activities.all(),
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await client.start_workflow(
                BootstrapOnly.run, to(sshd), id=f"bootstrap-{task_queue}", task_queue=task_queue
            )
            result = await handle.result()
            history = decoded_history(await handle.fetch_history())

    [token] = plane.tokens
    assert result.worker_id is not None
    assert VM in history and result.worker_id in history  # the decoding works
    assert token not in history

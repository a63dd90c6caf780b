"""Joining a box you own, end to end: `gpuprov token create` and `gpuprov join` as subprocesses
against the real API on a real SQLite database, with a fake nvidia-smi showing 8 H100s.

The API is served in this test's event loop, so the CLI runs through asyncio subprocesses
(a blocking subprocess.run would stop the API from answering)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment

from gpuprov.api import node as api_node
from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.engine.worker import open_records
from gpuprov.models import WorkerCapabilities
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import JoinToken, WorkerRecord
from gpuprov.store.records import Records
from providers import agent_artifact
from tests.gpuprov.test_agent import H100X8, TOKEN, install_nvidia_smi
from tests.gpuprov.test_records import snapshot

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

GPUPROV = str(Path(sys.executable).parent / "gpuprov")


@dataclass
class ControlPlane:
    records: Records
    port: int
    env: dict[str, str]  # for CLI subprocesses: this database, this API, the fake nvidia-smi

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROV_")}
    return env | extra


@pytest.fixture
async def control_plane(tmp_path) -> AsyncIterator[ControlPlane]:
    database_url = f"sqlite:///{tmp_path}/db"
    records = open_records(database_url)
    bin_dir = install_nvidia_smi(tmp_path / "bin", H100X8)
    port = free_port()
    env = clean_env(
        GPUPROV_DATABASE__URL=database_url,
        GPUPROV_API__PORT=str(port),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        HOME=str(tmp_path / "home"),  # `join` keeps the worker credential under ~/.gpuprov
    )
    try:
        async with serving(create_app(records), "127.0.0.1", port):
            yield ControlPlane(records=records, port=port, env=env)
    finally:
        records.db.dispose()


async def gpuprov(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    if args[0] == "join" and "--service" not in args:  # never a service of this machine
        args = (*args, "--service", "none")
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def create_token(plane: ControlPlane, label: str) -> str:
    code, out, err = await gpuprov("token", "create", "--label", label, env=plane.env)
    assert code == 0, err
    [token] = out.split()  # stdout is the token alone
    assert f"gpuprov join --url {plane.url}" in err  # the hint names this API
    assert token not in err  # printed once
    return token


async def join_with_new_token(
    plane: ControlPlane, label: str, tmp_path: Path
) -> tuple[str, int, str, str]:
    """`gpuprov join` as a user runs it with a fresh token for `label` in a 0600 file: the token,
    and the command's exit status, stdout and stderr."""
    token = await create_token(plane, label)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    code, out, err = await gpuprov(
        "join", "--url", plane.url, "--token-file", str(token_file), env=plane.env
    )
    return token, code, out, err


def workers(records: Records) -> list[WorkerRecord]:
    with records.db.session() as session:
        return list(session.exec(select(WorkerRecord)).all())


def rows_containing(records: Records, text: str) -> list[str]:
    """Every (table, column) of every row whose value contains `text`."""
    found = []
    for table, rows in snapshot(records.db).items():
        for row in rows:
            found += [f"{table}: {value!r}" for value in row if text in str(value)]
    return found


async def test_token_create_then_join_registers_an_idle_existing_worker(control_plane, tmp_path):
    plane = control_plane
    token, code, out, err = await join_with_new_token(plane, "gpu-box-1", tmp_path)

    assert code == 0, err
    [worker] = workers(plane.records)
    assert (worker.origin, worker.state, worker.label) == ("existing", "idle", "gpu-box-1")
    assert (worker.job, worker.vm, worker.provider) == (None, None, None)
    capabilities = WorkerCapabilities.model_validate(worker.capabilities)
    assert [gpu.name for gpu in capabilities.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert capabilities.gpu_runtime_ok and capabilities.cuda_version == "12.4"
    assert f"worker {worker.id}" in out
    assert "8 x NVIDIA H100 80GB HBM3" in out and "GPU runtime OK" in out
    assert token not in out + err

    # Only the SHA-256 is stored, and the token is spent.
    with plane.records.db.session() as session:
        [stored] = session.exec(select(JoinToken)).all()
    assert stored.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert (stored.label, stored.vm) == ("gpu-box-1", None) and stored.used_at is not None
    assert rows_containing(plane.records, token) == []

    # The worker's credential: kept in a file only its user reads, never printed.
    kept = Path(plane.env["HOME"]) / ".gpuprov" / "worker" / "worker-credential"
    assert f"worker credential kept in {kept} (mode 0600)" in out
    assert kept.stat().st_mode & 0o777 == 0o600
    assert kept.parent.stat().st_mode & 0o777 == 0o700
    credential = kept.read_text().strip()
    assert credential not in out + err and rows_containing(plane.records, credential) == []
    authenticated = Credentials(plane.records.db).worker(credential)
    assert authenticated is not None and authenticated.id == worker.id


async def test_joining_again_with_the_same_token_is_refused_and_changes_nothing(
    control_plane, tmp_path
):
    plane = control_plane
    token = await create_token(plane, "gpu-box-1")
    env = plane.env | {"GPUPROV_JOIN_TOKEN": token}
    code, _, err = await gpuprov("join", "--url", plane.url, env=env)
    assert code == 0, err
    before = snapshot(plane.records.db)

    code, out, err = await gpuprov("join", "--url", plane.url, env=env)

    assert code == 2
    assert "already used" in err and "Traceback" not in err
    assert token not in out + err
    assert snapshot(plane.records.db) == before
    assert len(workers(plane.records)) == 1


async def test_join_with_an_unknown_token_is_refused_and_changes_nothing(control_plane):
    plane = control_plane
    await create_token(plane, "gpu-box-1")
    before = snapshot(plane.records.db)
    code, _, err = await gpuprov("join", "--url", plane.url, "--token", TOKEN, env=plane.env)
    assert code == 2
    assert "unknown join token" in err
    assert snapshot(plane.records.db) == before


async def test_join_claiming_another_label_keeps_the_tokens_label(control_plane):
    plane = control_plane
    token = await create_token(plane, "gpu-box-1")
    env = plane.env | {"GPUPROV_JOIN_TOKEN": token}
    code, out, err = await gpuprov(
        "join", "--url", plane.url, "--label-claim", "someone-elses-box", env=env
    )
    assert code == 0, err
    [worker] = workers(plane.records)
    assert worker.label == "gpu-box-1"
    assert "label gpu-box-1" in out


async def test_join_reports_a_broken_gpu_runtime(control_plane, tmp_path):
    plane = control_plane
    token = await create_token(plane, "gpu-box-2")
    broken = install_nvidia_smi(
        tmp_path / "broken",
        "echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n",
    )
    env = plane.env | {"GPUPROV_JOIN_TOKEN": token, "PATH": f"{broken}{os.pathsep}/usr/bin:/bin"}
    code, out, err = await gpuprov("join", "--url", plane.url, env=env)
    assert code == 0, err  # registered; placement decides what it is good for
    assert "GPU runtime NOT OK: nvidia-smi exited 18: Failed to initialize NVML" in out
    [worker] = workers(plane.records)
    assert worker.capabilities["gpu_runtime_ok"] is False


async def test_token_create_refuses_a_bad_ttl(control_plane):
    code, out, err = await gpuprov(
        "token", "create", "--label", "x", "--ttl", "0", env=control_plane.env
    )
    assert code == 2 and "argument --ttl: must be 1-604800 seconds, got 0" in err and out == ""


async def test_api_command_serves_registrations_until_sigterm(
    temporal_env: WorkflowEnvironment, tmp_path
):
    database_url = f"sqlite:///{tmp_path}/api.db"
    records = open_records(database_url)
    token = records.mint_token(label="gpu-box-3", ttl=timedelta(hours=1))
    port = free_port()
    env = clean_env(
        GPUPROV_DATABASE__URL=database_url,
        GPUPROV_API__PORT=str(port),
        GPUPROV_TEMPORAL__ADDRESS=temporal_env.client.service_client.config.target_host,
    )
    process = await asyncio.create_subprocess_exec(
        GPUPROV, "api", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert f"control-plane API at http://127.0.0.1:{port}" in line.decode()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/v1/health")).json() == {"status": "ok"}
            body = {"token": token, "capabilities": {"gpus": [], "gpu_runtime_ok": False}}
            response = await http.post("/v1/workers/register", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["label"] == "gpu-box-3"
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    assert "stopped" in out.decode()
    assert [worker.label for worker in workers(records)] == ["gpu-box-3"]
    records.db.dispose()


async def test_a_password_in_the_url_is_never_echoed_and_the_token_is_not_spent(
    control_plane, tmp_path
):
    plane = control_plane
    token = await create_token(plane, "gpu-box-1")
    token_file = tmp_path / "join-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    before = snapshot(plane.records.db)
    url = f"http://ops:hunter2-pass@127.0.0.1:{plane.port}"
    code, out, err = await gpuprov("join", "--url", url, "--token-file", str(token_file),
                                   env=plane.env)  # fmt: skip
    assert code == 2, (out, err)
    assert "hunter2" not in out + err and "ops:" not in out + err
    assert f"bad API URL 'http://***@127.0.0.1:{plane.port}'" in err
    assert snapshot(plane.records.db) == before  # refused before anything was sent


@pytest.mark.parametrize("served", ["tampered", "truncated"])
async def test_join_refuses_an_agent_that_does_not_match_its_pin_and_spends_nothing(
    control_plane, tmp_path, monkeypatch, served
):
    plane = control_plane
    good = agent_artifact.artifact()
    bad = good.replace(b"AGENT_VERSION = ", b"AGENT_VERSION = 'x' or ")
    monkeypatch.setattr(api_node, "agent_pyz", lambda: bad if served == "tampered" else good[:-99])
    token = await create_token(plane, "gpu-box-7")
    before = snapshot(plane.records.db)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    code, out, err = await gpuprov(
        "join", "--url", plane.url, "--token-file", str(token_file), env=plane.env
    )
    assert code == 2, (out, err)
    assert "not joined: refused" in err and f"pinned {agent_artifact.sha256()}" in err
    assert snapshot(plane.records.db) == before  # the token unspent, no worker
    assert not list((tmp_path / "home").rglob("agent.pyz"))  # nothing left to run

    monkeypatch.setattr(api_node, "agent_pyz", lambda: good)  # as pinned: the same token works
    code, out, err = await gpuprov(
        "join", "--url", plane.url, "--token-file", str(token_file), env=plane.env
    )
    assert code == 0, err
    [worker] = workers(plane.records)
    assert worker.label == "gpu-box-7"
    [installed] = (tmp_path / "home").rglob("agent.pyz")
    assert installed.read_bytes() == good

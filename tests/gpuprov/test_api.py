"""The control-plane API over HTTP (httpx's ASGI transport, no sockets), on SQLite and on
PostgreSQL 15 (the `records` fixture). Every rejected request must leave the database exactly as
it was: `snapshot` reads every row of every table before and after."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

import tests.rows
from gpuprov.api.app import MAX_BODY_BYTES, create_app
from gpuprov.models import WorkerCapabilities
from gpuprov.store.credentials import sha256
from gpuprov.store.db import JoinToken, WorkerCredential, utcnow
from gpuprov.store.records import Records

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REGISTER = "/v1/workers/register"
TABLES = {"vms", "join_tokens", "cost_records", "blocks", "workers", "orphans"}
JOB = "job1"
VM = "job1-a1-n0"
LABEL = "box-1"
TTL = timedelta(minutes=5)

CAPABILITIES: dict[str, Any] = {
    "gpus": [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mb": 81559,
            "driver_version": "550.54.15",
            "uuid": f"GPU-5c1b7e3a-9f0d-4c1e-8a7b-2d3e4f5a6b{index:02d}",
        }
        for index in range(8)
    ],
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "cpu_count": 208,
    "memory_gb": 1843.2,
    "disk_gb": 26000.0,
    "gpu_runtime_ok": True,
    "gpu_runtime_error": None,
    "agent_version": "gpuprov-agent/0.1.0",
}


# ---------------------------------------------------------------------------- helpers


def snapshot(records: Records) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (reflected, so nothing is missed), in a stable order."""
    rows = tests.rows.snapshot(records)
    assert set(rows) >= TABLES, sorted(rows)
    return rows


def record_vm(records: Records, vm: str = VM, job: str = JOB) -> None:
    records.record_vm(
        job=job, node_index=0, attempt=1, vm=vm, provider="fake", region="r1", zone=None
    )


def vm_token(records: Records, vm: str = VM, job: str = JOB, ttl: timedelta = TTL) -> str:
    record_vm(records, vm=vm, job=job)
    return records.mint_token(vm=vm, ttl=ttl)


def body(token: str, **extra: Any) -> dict[str, Any]:
    return {"token": token, "capabilities": CAPABILITIES, **extra}


def assert_credential_of(records: Records, worker_id: str, credential: str) -> None:
    """The registration's credential: bound to the worker, stored only as its SHA-256."""
    assert credential.startswith("gpw_") and len(credential) >= 4 + 32 + 1 + 43
    with records.db.session() as session:
        [row] = session.execute(sa.select(WorkerCredential)).scalars().all()
    assert (row.worker_id, row.secret_sha256) == (worker_id, sha256(credential))
    assert row.revoked_at is None
    assert credential not in repr(snapshot(records))


def worker_rows(records: Records) -> list[dict[str, Any]]:
    with records.db.session() as session:
        return [dict(row._mapping) for row in session.execute(sa.text("SELECT * FROM workers"))]


@pytest.fixture
def app(records: Records) -> FastAPI:
    return create_app(records)


async def rejected(
    api: httpx.AsyncClient, records: Records, status: int, **request: Any
) -> httpx.Response:
    """POST to the register endpoint; assert `status` and that the database did not change."""
    before = snapshot(records)
    response = await api.post(REGISTER, **request)
    assert response.status_code == status, response.text
    assert snapshot(records) == before, "a rejected request must change nothing in the database"
    return response


# ---------------------------------------------------------------------------- happy paths


async def test_managed_node_registers_with_its_vm_token(api: httpx.AsyncClient, records: Records):
    token = vm_token(records)

    response = await api.post(REGISTER, json=body(token))

    assert response.status_code == 200, response.text
    answer = response.json()
    worker_id = answer.pop("worker_id")
    assert_credential_of(records, worker_id, answer.pop("credential"))
    assert answer == {
        "origin": "managed",
        "job": JOB,
        "vm": VM,
        "label": None,
        "provider": "fake",
        "region": "r1",
    }
    [worker] = worker_rows(records)
    assert worker["id"] == worker_id
    assert (worker["origin"], worker["state"], worker["job"], worker["vm"]) == (
        "managed",
        "reserved",
        JOB,
        VM,
    )
    assert (worker["provider"], worker["region"], worker["label"]) == ("fake", "r1", None)
    stored = worker["capabilities"]
    stored = json.loads(stored) if isinstance(stored, str) else stored
    assert stored == WorkerCapabilities.model_validate(CAPABILITIES).model_dump(mode="json")

    with records.db.session() as session:
        [used] = session.execute(sa.select(JoinToken)).scalars().all()
    assert used.used_at is not None

    # What the job reads (activities/registrations.py): the VM, the worker id and the
    # capabilities, nothing that could carry the token.
    [registration] = records.workers_of_vms([VM]).values()
    assert (registration.id, registration.vm) == (worker_id, VM)
    stored_row = json.dumps(worker, default=str)
    assert token not in stored_row
    assert Records.hash_token(token) not in stored_row
    assert token not in response.text


async def test_existing_worker_registers_with_a_label_token(
    api: httpx.AsyncClient, records: Records
):
    token = records.mint_token(label=LABEL, ttl=TTL)

    response = await api.post(REGISTER, json=body(token))

    assert response.status_code == 200, response.text
    answer = response.json()
    worker_id = answer.pop("worker_id")
    assert_credential_of(records, worker_id, answer.pop("credential"))
    assert answer == {
        "origin": "existing",
        "job": None,
        "vm": None,
        "label": LABEL,
        "provider": None,
        "region": None,
    }
    [worker] = worker_rows(records)
    assert worker["id"] == worker_id
    assert (worker["origin"], worker["state"], worker["label"]) == ("existing", "idle", LABEL)
    assert (worker["job"], worker["vm"]) == (None, None)


async def test_health_and_openapi(app: FastAPI, api: httpx.AsyncClient):
    health = await api.get("/v1/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}

    # Built on demand, not served: nothing but health answers an unauthenticated caller.
    assert (await api.get("/openapi.json")).status_code == 404
    assert "post" in app.openapi()["paths"][REGISTER]


# ---------------------------------------------------------------------------- tokens


async def test_a_token_is_used_once(api: httpx.AsyncClient, records: Records):
    token = vm_token(records)
    first = await api.post(REGISTER, json=body(token))
    assert first.status_code == 200, first.text

    again = await rejected(api, records, 401, json=body(token))

    assert again.json()["detail"] == "join token already used"
    assert len(worker_rows(records)) == 1


async def test_an_unknown_token_is_rejected(api: httpx.AsyncClient, records: Records):
    vm_token(records)  # a real token exists, just not this one
    stranger = secrets.token_urlsafe(32)

    response = await rejected(api, records, 401, json=body(stranger))

    assert response.json()["detail"] == "unknown join token"
    assert stranger not in response.text


async def test_a_superseded_token_is_unknown(api: httpx.AsyncClient, records: Records):
    old = vm_token(records)
    new = records.mint_token(vm=VM, ttl=TTL)  # minting again invalidates the unused old one

    response = await rejected(api, records, 401, json=body(old))

    assert response.json()["detail"] == "unknown join token"
    assert (await api.post(REGISTER, json=body(new))).status_code == 200


@pytest.mark.parametrize("binding", ["vm", "label"])
async def test_an_expired_token_is_rejected(api: httpx.AsyncClient, records: Records, binding: str):
    token = vm_token(records) if binding == "vm" else records.mint_token(label=LABEL, ttl=TTL)
    with records.db.session() as session:
        session.execute(sa.update(JoinToken).values(expires_at=utcnow() - timedelta(seconds=1)))
        session.commit()

    response = await rejected(api, records, 401, json=body(token))

    assert response.json()["detail"] == "join token expired"


async def test_a_token_expires_by_the_clock(api: httpx.AsyncClient, records: Records):
    token = vm_token(records, ttl=timedelta(seconds=1))
    await asyncio.sleep(1.1)

    response = await rejected(api, records, 401, json=body(token))

    assert response.json()["detail"] == "join token expired"


# ---------------------------------------------------------------------------- identity


async def test_forged_identity_claims_are_ignored_and_logged(
    api: httpx.AsyncClient,
    records: Records,
    caplog: pytest.LogCaptureFixture,
):
    token = vm_token(records)
    record_vm(records, vm="other-a1-n0", job="other")  # a real VM of another job
    claims = {
        "provider": "aws",
        "region": "us-west-2",
        "job": "other",
        "vm": "other-a1-n0",
        "label": "x",
    }

    with caplog.at_level(logging.WARNING, logger="gpuprov.api.app"):
        response = await api.post(REGISTER, json=body(token, identity=claims))

    assert response.status_code == 200, response.text
    answer = response.json()
    assert {key: answer[key] for key in ("provider", "region", "job", "vm", "label")} == {
        "provider": "fake",
        "region": "r1",
        "job": JOB,
        "vm": VM,
        "label": None,
    }
    [worker] = worker_rows(records)
    assert (worker["provider"], worker["region"], worker["job"], worker["vm"]) == (
        "fake",
        "r1",
        JOB,
        VM,
    )
    assert worker["label"] is None
    assert set(records.workers_of_vms([VM])) == {VM}

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for field, claimed in claims.items():
        assert any(f"{field}={claimed!r}" in message for message in warnings), (field, warnings)
    assert len(warnings) == len(claims)
    assert token not in caplog.text


async def test_matching_identity_claims_are_not_logged(
    api: httpx.AsyncClient, records: Records, caplog: pytest.LogCaptureFixture
):
    token = vm_token(records)
    claims = {"provider": "fake", "region": "r1", "job": JOB, "vm": VM}

    with caplog.at_level(logging.WARNING, logger="gpuprov.api.app"):
        response = await api.post(REGISTER, json=body(token, identity=claims))

    assert response.status_code == 200, response.text
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_label_token_claiming_a_job_stays_an_idle_existing_worker(
    api: httpx.AsyncClient,
    records: Records,
    caplog: pytest.LogCaptureFixture,
):
    record_vm(records)
    token = records.mint_token(label=LABEL, ttl=TTL)
    claims = {"job": JOB, "vm": VM, "provider": "fake", "region": "r1", "label": "other"}

    with caplog.at_level(logging.WARNING, logger="gpuprov.api.app"):
        response = await api.post(REGISTER, json=body(token, identity=claims))

    assert response.status_code == 200, response.text
    assert response.json()["origin"] == "existing"
    [worker] = worker_rows(records)
    assert (worker["state"], worker["job"], worker["vm"], worker["label"]) == (
        "idle",
        None,
        None,
        LABEL,
    )
    assert records.workers_of_vms([VM]) == {}  # no job sees a node that is not its own
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(claims), warnings


# ---------------------------------------------------------------------------- bad bodies


def _invalid_bodies(token: str) -> dict[str, tuple[dict[str, Any], tuple[Any, ...], str]]:
    """name -> (request kwargs, expected error loc, expected error type)."""
    gpus_not_a_list = {**CAPABILITIES, "gpus": "x"}
    nested_unknown = {**CAPABILITIES, "gpu_count": 8}
    return {
        "malformed-json": (
            {
                "content": b'{"token": "' + token.encode() + b'", "capabilities": {',
                "headers": {"content-type": "application/json"},
            },
            ("body",),
            "json_invalid",
        ),
        "gpus-wrong-type": (
            {"json": {"token": token, "capabilities": gpus_not_a_list}},
            ("body", "capabilities", "gpus"),
            "list_type",
        ),
        "cpu-count-wrong-type": (
            {"json": {"token": token, "capabilities": {**CAPABILITIES, "cpu_count": "many"}}},
            ("body", "capabilities", "cpu_count"),
            "int_parsing",
        ),
        "missing-token": (
            {"json": {"capabilities": CAPABILITIES}},
            ("body", "token"),
            "missing",
        ),
        "missing-capabilities": (
            {"json": {"token": token}},
            ("body", "capabilities"),
            "missing",
        ),
        "token-too-short": (
            {"json": body("short")},
            ("body", "token"),
            "string_too_short",
        ),
        "unknown-top-level-field": (
            {"json": body(token, worker_id="mine")},
            ("body", "worker_id"),
            "extra_forbidden",
        ),
        "unknown-nested-field": (
            {"json": {"token": token, "capabilities": nested_unknown}},
            ("body", "capabilities", "gpu_count"),
            "extra_forbidden",
        ),
        "unknown-identity-field": (
            {"json": body(token, identity={"state": "idle"})},
            ("body", "identity", "state"),
            "extra_forbidden",
        ),
        "not-an-object": (
            {"json": [token, CAPABILITIES]},
            ("body",),
            "model_attributes_type",
        ),
    }


INVALID = list(_invalid_bodies("t" * 43))


@pytest.mark.parametrize("case", INVALID)
async def test_an_invalid_body_is_422_naming_the_field(
    api: httpx.AsyncClient, records: Records, case: str
):
    token = vm_token(records)  # a valid token in the body: it must not be spent
    request, loc, kind = _invalid_bodies(token)[case]

    response = await rejected(api, records, 422, **request)

    errors = response.json()["detail"]
    assert any(
        tuple(error["loc"][: len(loc)]) == loc and error["type"] == kind for error in errors
    ), errors
    if len(loc) > 1:
        assert any(tuple(error["loc"]) == loc for error in errors), errors
    # The token is still good.
    assert (await api.post(REGISTER, json=body(token))).status_code == 200


def _padded(token: str, size: int) -> bytes:
    """A valid registration padded with JSON whitespace to exactly `size` bytes."""
    payload = json.dumps(body(token)).encode()
    assert len(payload) < size
    return payload + b" " * (size - len(payload))


async def _chunks(payload: bytes, chunk: int = 8192) -> AsyncIterator[bytes]:
    for start in range(0, len(payload), chunk):
        yield payload[start : start + chunk]


async def test_an_oversized_body_is_413(api: httpx.AsyncClient, records: Records):
    token = vm_token(records)
    padding = {**CAPABILITIES, "agent_version": "x" * (MAX_BODY_BYTES + 1)}
    huge = {"token": token, "capabilities": padding}

    await rejected(api, records, 413, json=huge)
    await rejected(
        api,
        records,
        413,
        content=_padded(token, MAX_BODY_BYTES + 1),
        headers={"content-type": "application/json"},
    )
    many_gpus = {**CAPABILITIES, "gpus": CAPABILITIES["gpus"] * 1000}
    await rejected(api, records, 413, json={"token": token, "capabilities": many_gpus})

    # A body right at the limit is fine: the limit is the only thing that rejected the others.
    at_limit = await api.post(
        REGISTER,
        content=_padded(token, MAX_BODY_BYTES),
        headers={"content-type": "application/json"},
    )
    assert at_limit.status_code == 200, at_limit.text


async def test_an_oversized_streamed_body_without_length_is_413(
    api: httpx.AsyncClient, records: Records
):
    token = vm_token(records)

    response = await rejected(
        api,
        records,
        413,
        content=_chunks(_padded(token, MAX_BODY_BYTES + 8192)),
        headers={"content-type": "application/json"},
    )

    assert "content-length" not in response.request.headers


async def test_a_streamed_body_under_the_limit_is_accepted(
    api: httpx.AsyncClient, records: Records
):
    token = vm_token(records)

    response = await api.post(
        REGISTER,
        content=_chunks(_padded(token, MAX_BODY_BYTES - 1024)),
        headers={"content-type": "application/json"},
    )

    assert "content-length" not in response.request.headers
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------------------- teardown begun


@pytest.mark.parametrize("status", ["terminating", "terminated", "orphaned"])
async def test_a_node_whose_machine_is_torn_down_is_refused_with_nothing_changed(
    api: httpx.AsyncClient, records: Records, status: str
):
    token = vm_token(records)
    records.set_vm_status(VM, status)

    response = await rejected(api, records, 409, json=body(token))

    assert VM in response.json()["detail"]
    assert token not in response.text
    assert records.workers_of_vms([VM]) == {}


# ---------------------------------------------------------------------------- races


@pytest.mark.parametrize("binding", ["vm", "label"])
async def test_concurrent_registrations_with_one_token_admit_exactly_one(
    api: httpx.AsyncClient, records: Records, binding: str
):
    token = vm_token(records) if binding == "vm" else records.mint_token(label=LABEL, ttl=TTL)

    responses = await asyncio.gather(*(api.post(REGISTER, json=body(token)) for _ in range(8)))

    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200] + [401] * 7, [response.text for response in responses]
    losers = [response for response in responses if response.status_code == 401]
    assert {response.json()["detail"] for response in losers} == {"join token already used"}
    [worker] = worker_rows(records)
    [winner] = [response for response in responses if response.status_code == 200]
    assert worker["id"] == winner.json()["worker_id"]
    assert len(records.workers_of_vms([VM])) == (1 if binding == "vm" else 0)

"""Schemathesis against the control-plane API's own OpenAPI document, in-process (ASGI).

For every operation the app publishes, schema-valid (positive) and schema-violating (negative)
requests are generated; each must get no 5xx, a response that matches the documented schema, and,
when it is not a 2xx, must leave the database exactly as it was (`snapshot` from test_api.py reads
every row of every table). A generated token is almost never a real one, so each example may
swap in a fresh managed-node token, a fresh existing-worker token or an already used one: the
valid-token-but-bad-body paths are where a rejected request could burn a token or leave a worker
row behind. The database is SQLite (a file).

Gaps it once found are pinned by the tests at the end, named after the behaviour.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlmodel import select

from gpuprov.api.app import RegisterRequest, create_app
from gpuprov.api.auth import AuthFailures
from gpuprov.store.db import Database, JoinToken, utcnow
from gpuprov.store.records import Records
from tests.gpuprov.test_api import CAPABILITIES, REGISTER, snapshot

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

MAX_EXAMPLES = 60
TTL = timedelta(minutes=5)
# What the token field of a generated register request is replaced with, if anything.
TOKEN_SOURCES = ["generated", "managed", "existing", "used"]


def _status_code_documented(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """status_code_conformance, except FastAPI's undocumented 400 for a body json.loads cannot
    decode (pinned by test_every_status_the_api_answers_is_documented)."""
    if response.status_code == 400:
        return None
    return status_code_conformance(ctx, response, case)


CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    content_type_conformance,
    _status_code_documented,
]


def _operations() -> list[Any]:
    """(label, mode) for every operation the app publishes; negative only where there is an
    input to violate. The app is built just for its OpenAPI document: no route runs."""
    document = create_app(records=None).openapi()
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            label = f"{method.upper()} {path}"
            modes = [GenerationMode.POSITIVE]
            if operation.get("parameters") or operation.get("requestBody"):
                modes.append(GenerationMode.NEGATIVE)
            found.extend(pytest.param(label, mode, id=f"{label}-{mode.value}") for mode in modes)
    return found


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Records]:
    """A migrated SQLite file (shadows conftest's SQLite + PostgreSQL `records`)."""
    database = Database(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    database.upgrade()
    yield Records(database)
    database.dispose()


class Tokens:
    """Join tokens to swap into generated requests: each one minted fresh, before the snapshot."""

    def __init__(self, records: Records) -> None:
        self.records = records
        self.serial = itertools.count()

    def make(self, source: str) -> str | None:
        if source == "generated":
            return None
        number = next(self.serial)
        if source == "existing":
            return self.records.mint_token(label=f"box-{number}", ttl=TTL)
        vm = f"job{number}-a1-n0"
        self.records.record_vm(
            job=f"job{number}",
            node_index=0,
            attempt=1,
            vm=vm,
            provider="fake",
            region="r1",
            zone=None,
        )
        token = self.records.mint_token(vm=vm, ttl=TTL)
        if source == "used":
            with self.records.db.session() as session:
                self.records.redeem_token(session, token, utcnow())
                session.commit()
        return token


def _token_used(records: Records, token: str) -> bool:
    digest = Records.hash_token(token)
    with records.db.session() as session:
        row = session.exec(select(JoinToken).where(JoinToken.token_sha256 == digest)).one()
        return row.used_at is not None


@pytest.mark.parametrize(("label", "mode"), _operations())
def test_operation(records: Records, label: str, mode: GenerationMode) -> None:
    # Every example comes from one address: no throttling, or bad tokens would turn the
    # valid registrations that follow into 429s (tests/gpuprov/test_auth.py covers it).
    app = create_app(records, auth_failures=AuthFailures(limit=10**9))
    schema = schemathesis.openapi.from_dict(app.openapi())  # the app serves no document
    schema.app = app
    operation = schema.find_operation_by_label(label)
    assert operation is not None, label
    tokens = Tokens(records)
    seen: dict[int, int] = {}

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=operation.as_strategy(generation_mode=mode), source=st.sampled_from(TOKEN_SOURCES))
    def example(case: Case, source: str) -> None:
        token = None
        if isinstance(case.body, dict) and "token" in case.body:
            token = tokens.make(source)
            if token is not None:
                case.body["token"] = token
        before = snapshot(records)
        response = case.call()
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        case.validate_response(response, checks=CHECKS)
        after = snapshot(records)
        if mode is GenerationMode.POSITIVE and source in ("managed", "existing") and token:
            # A schema-valid registration with a fresh token is accepted.
            assert response.status_code == 200, response.text
        if not 200 <= response.status_code < 300:
            assert after == before, f"{response.status_code} changed the database"
            if token is not None and source != "used":
                assert not _token_used(records, token), "a rejected request used the token"
            return
        if case.method != "POST":
            assert after == before, "a read changed the database"
            return
        # An accepted registration: the body was valid, its token is now used, and exactly
        # one worker row was added.
        RegisterRequest.model_validate(case.body)
        assert token is not None and source in ("managed", "existing"), response.text
        assert _token_used(records, token)
        assert len(after["workers"]) == len(before["workers"]) + 1

    example()
    assert sum(seen.values()) > 0


# ---------------------------------------------------------------------------- known gaps


async def _post(records: Records, content: bytes) -> httpx.Response:
    app = create_app(records)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        return await client.post(
            REGISTER, content=content, headers={"content-type": "application/json"}
        )


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b'{"token": "\xff\xfe"}', id="not-utf8"),
        pytest.param(b"[" * 30_000 + b"]" * 30_000, id="nested-too-deep"),
        pytest.param(b'{"token": ' + b"1" * 5_000 + b"}", id="int-over-digit-limit"),
    ],
)
async def test_a_body_json_cannot_read_is_a_clean_4xx(records: Records, content: bytes) -> None:
    """Malformed JSON is a 422; a body json.loads fails on otherwise (bytes that are not UTF-8,
    nesting past the recursion limit, an integer past the 4300-digit limit) is FastAPI's 400."""
    before = snapshot(records)
    response = await _post(records, content)
    assert response.status_code in (400, 422), response.text
    assert snapshot(records) == before


def test_every_status_the_api_answers_is_documented(records: Records) -> None:
    document = create_app(records).openapi()
    assert "400" in document["paths"][REGISTER]["post"]["responses"]


@pytest.fixture
def any_records(database: Database) -> Records:
    """conftest's database, on SQLite and on PostgreSQL (this module's `records` is SQLite)."""
    return Records(database)


async def test_a_non_finite_capability_is_not_a_server_error(
    request: pytest.FixtureRequest, any_records: Records
) -> None:
    """Python's json (FastAPI's body parser) reads the non-standard literal `Infinity`, and
    WorkerCapabilities' float fields accept it."""
    vm = "job1-a1-n0"
    any_records.record_vm(
        job="job1", node_index=0, attempt=1, vm=vm, provider="fake", region="r1", zone=None
    )
    token = any_records.mint_token(vm=vm, ttl=TTL)
    body = {"token": token, "capabilities": dict(CAPABILITIES, memory_gb="@inf@")}
    content = json.dumps(body).replace('"@inf@"', "Infinity").encode()
    before = snapshot(any_records)
    response = await _post(any_records, content)
    assert response.status_code < 500, response.text
    if response.status_code >= 300:
        assert snapshot(any_records) == before

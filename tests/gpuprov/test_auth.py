"""Who may call the control-plane API (gpuprov/api/auth.py), over HTTP in-process (httpx's ASGI
transport) on SQLite and PostgreSQL: every endpoint declares its caller; operator endpoints want
a live operator API key, worker endpoints a live worker credential; a refused call is 401 and
changes nothing in the database; an address (or a secret) that keeps getting refused is
throttled, and a valid secret never is."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from gpuprov.api import auth
from gpuprov.api.app import create_app
from gpuprov.api.auth import AuthFailures
from gpuprov.api.dashboard.session import signed_in
from gpuprov.store.credentials import Credentials
from gpuprov.store.records import Records
from providers.node_agent import AGENT_ROUTE
from tests.gpuprov.in_process import OTHER_CALLER, client_for
from tests.gpuprov.test_api import (
    LABEL,
    REGISTER,
    TTL,
    VM,
    body,
    snapshot,
    vm_token,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def failures(clock: Clock) -> AuthFailures:
    return AuthFailures(limit=5, window=60.0, clock=clock)


@pytest.fixture
def app(records: Records, failures: AuthFailures) -> FastAPI:
    return create_app(records, auth_failures=failures)


@pytest.fixture
def credentials(records: Records) -> Credentials:
    return Credentials(records.db)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _calls(route: APIRoute, dependency: Any) -> bool:
    """Whether `dependency` is among the route's dependencies, however deep."""
    pending = list(route.dependant.dependencies)
    while pending:
        current = pending.pop()
        if current.call is dependency:
            return True
        pending.extend(current.dependencies)
    return False


def routes(app: FastAPI, dependency: Any) -> list[tuple[str, str]]:
    return sorted(
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute) and _calls(route, dependency)
        for method in route.methods
    )


async def register_worker(api: httpx.AsyncClient, records: Records, *, managed: bool) -> dict:
    """Register through the API (a managed node's VM token, or a label's); its answer."""
    token = vm_token(records) if managed else records.mint_token(label=LABEL, ttl=TTL)
    response = await api.post(REGISTER, json=body(token))
    assert response.status_code == 200, response.text
    return response.json()


# ---------------------------------------------------------------- every endpoint says who


async def test_every_endpoint_declares_who_may_call_it(app: FastAPI, api: httpx.AsyncClient):
    operator = routes(app, auth.require_operator)
    worker = routes(app, auth.worker_credential)
    dashboard = routes(app, signed_in)
    # The heartbeat checks its credential in its batch's write and is throttled by the same
    # Guard when refused (test_an_address_that_keeps_getting_keys_wrong_gets_429_...).
    throttled = routes(app, auth.guard) + [("POST", "/v1/workers/heartbeat")]
    every = sorted(
        (method, route.path)
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    )
    assert operator == [
        ("DELETE", "/v1/secrets/{name}"),
        ("DELETE", "/v1/workers/{worker_id}"),
        ("GET", "/v1/cost"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/{job}/logs"),
        ("GET", "/v1/jobs/{name}"),
        ("GET", "/v1/offers/stats"),
        ("GET", "/v1/orphans"),
        ("GET", "/v1/secrets"),
        ("GET", "/v1/teams"),
        ("GET", "/v1/teams/{team}"),
        ("GET", "/v1/workers"),
        ("POST", "/v1/jobs"),
        ("POST", "/v1/jobs/{name}/cancel"),
        ("POST", "/v1/jobs/{name}/release"),
        ("POST", "/v1/workers/{worker_id}/drain"),
        ("POST", "/v1/workers/{worker_id}/undrain"),
        ("PUT", "/v1/secrets/{name}"),
    ]  # and each declares its role: tests/gpuprov/test_roles.py
    assert worker == [
        ("GET", "/v1/work"),
        ("GET", "/v1/workers/me"),
        ("POST", "/v1/work/{work_id}/exit"),
        ("POST", "/v1/work/{work_id}/logs"),
        ("POST", "/v1/work/{work_id}/started"),
        ("POST", "/v1/workers/heartbeat"),
    ]
    assert dashboard == [
        ("GET", "/ui/"),
        ("GET", "/ui/jobs/{name}"),
        ("GET", "/ui/jobs/{name}/logs"),
        ("GET", "/ui/spend"),
        ("GET", "/ui/workers"),
        ("POST", "/ui/jobs/{name}/cancel"),
        ("POST", "/ui/jobs/{name}/release"),
        ("POST", "/ui/logout"),
        ("POST", "/ui/workers/{worker_id}/drain"),
        ("POST", "/ui/workers/{worker_id}/undrain"),
    ]  # the key in the dashboard's cookie, checked as a bearer key is
    # Everything but health, the node agent's artifact and the dashboard's sign-in form (no
    # secret in any) checks a secret (the join token and a sign-in check their own, throttled).
    assert sorted(set(every) - set(throttled)) == [
        ("GET", "/ui"),
        ("GET", "/ui/login"),
        ("GET", "/v1/health"),
        ("GET", AGENT_ROUTE),
    ]
    assert set(throttled) == set(operator) | set(worker) | set(dashboard) | {
        ("POST", REGISTER),
        ("POST", "/ui/login"),
    }
    for path in ("/openapi.json", "/docs", "/redoc"):  # no unauthenticated document either
        assert (await api.get(path)).status_code == 404


# ---------------------------------------------------------------- operators


def _bad_operator_headers(
    credentials: Credentials, worker_credential: str
) -> dict[str, dict[str, str]]:
    revoked_row, revoked = credentials.create_operator_key("retired")
    credentials.revoke_operator_keys(revoked_row.id)
    live_row, live = credentials.create_operator_key("live")
    other_row, _ = credentials.create_operator_key("other")
    return {
        "none": {},
        "not-bearer": {"Authorization": f"Basic {live}"},
        "empty-bearer": {"Authorization": "Bearer "},
        "malformed": bearer("letmein"),
        "wrong-secret": bearer(live[:-1] + ("A" if live[-1] != "A" else "B")),
        "another-keys-id": bearer(live.replace(live_row.id, other_row.id)),
        "revoked": bearer(revoked),
        "worker-credential": bearer(worker_credential),
    }


async def test_operator_endpoints_refuse_every_call_without_a_live_key_and_change_nothing(
    app: FastAPI, api: httpx.AsyncClient, records: Records, credentials: Credentials, clock: Clock
):
    registered = await register_worker(api, records, managed=False)
    cases = _bad_operator_headers(credentials, registered["credential"])
    before = snapshot(records)
    for method, path in routes(app, auth.require_operator):
        for case, headers in cases.items():
            clock.now += 60  # each call a window apart: this test is about refusals
            response = await api.request(method, path, headers=headers)
            assert response.status_code == 401, (path, case, response.text)
            assert response.headers["www-authenticate"] == "Bearer", case
            assert "detail" in response.json()
            assert registered["credential"] not in response.text
    assert snapshot(records) == before


async def test_an_operator_lists_workers_with_their_capabilities(
    api: httpx.AsyncClient, records: Records, credentials: Credentials
):
    managed = await register_worker(api, records, managed=True)
    existing = await register_worker(api, records, managed=False)
    _, key = credentials.create_operator_key("ops")

    response = await api.get("/v1/workers", headers=bearer(key))

    assert response.status_code == 200, response.text
    rows = {row["id"]: row for row in response.json()["workers"]}
    assert set(rows) == {managed["worker_id"], existing["worker_id"]}
    node = rows[managed["worker_id"]]
    assert (node["origin"], node["state"], node["job"], node["vm"]) == (
        "managed",
        "reserved",
        "job1",
        VM,
    )
    assert (node["provider"], node["region"], node["gpu_count"]) == ("fake", "r1", 8)
    assert node["gpu"] == "NVIDIA H100 80GB HBM3" and node["gpu_runtime_ok"] is True
    assert node["capabilities"].startswith("8 x NVIDIA H100 80GB HBM3; driver 550.54.15")
    assert node["registered_at"] and node["updated_at"]
    assert rows[existing["worker_id"]]["label"] == LABEL
    assert "credential" not in response.text and managed["credential"] not in response.text

    idle = await api.get("/v1/workers", params={"state": "idle"}, headers=bearer(key))
    assert [row["id"] for row in idle.json()["workers"]] == [existing["worker_id"]]
    of_job = await api.get("/v1/workers", params={"job": "job1"}, headers=bearer(key))
    assert [row["id"] for row in of_job.json()["workers"]] == [managed["worker_id"]]
    bad = await api.get("/v1/workers", params={"state": "asleep"}, headers=bearer(key))
    assert bad.status_code == 422


# ---------------------------------------------------------------- workers


async def test_a_worker_is_known_by_its_credential_until_its_machine_is_released(
    api: httpx.AsyncClient, records: Records, credentials: Credentials
):
    registered = await register_worker(api, records, managed=True)
    credential = registered["credential"]

    me = await api.get("/v1/workers/me", headers=bearer(credential))
    assert me.status_code == 200, me.text
    assert (me.json()["id"], me.json()["vm"]) == (registered["worker_id"], VM)

    _, key = credentials.create_operator_key("ops")
    for wrong in ({}, bearer(key), bearer(credential[:-3] + "zzz")):
        before = snapshot(records)
        refused = await api.get("/v1/workers/me", headers=wrong)
        assert refused.status_code == 401 and snapshot(records) == before

    records.vm_terminated(VM)  # the machine is gone: its worker and credential are revoked
    before = snapshot(records)
    gone = await api.get("/v1/workers/me", headers=bearer(credential))
    assert gone.status_code == 401, gone.text
    assert gone.json()["detail"] == "unknown or revoked worker credential"
    assert snapshot(records) == before


# ---------------------------------------------------------------- throttling


async def test_an_address_that_keeps_getting_keys_wrong_gets_429_and_a_good_key_still_passes(
    app: FastAPI, api: httpx.AsyncClient, records: Records, credentials: Credentials, clock: Clock
):
    _, key = credentials.create_operator_key("ops")
    worker = await register_worker(api, records, managed=False)
    for attempt in range(5):
        wrong = bearer(f"nope-{attempt}")
        assert (await api.get("/v1/workers", headers=wrong)).status_code == 401
    clock.now += 10

    before = snapshot(records)
    throttled = await api.get("/v1/workers", headers=bearer("nope-again"))
    assert throttled.status_code == 429
    assert throttled.headers["retry-after"] == "50"
    assert (await api.get("/v1/workers/me", headers=bearer("nope"))).status_code == 429
    assert (await api.get("/v1/workers/me")).status_code == 429  # no credential at all
    for refused in ({}, bearer("nope"), bearer("gpw_" + "0" * 32 + "_" + "x" * 43)):
        beat = await api.post("/v1/workers/heartbeat", json={"healthy": True}, headers=refused)
        assert beat.status_code == 429, beat.text
    assert snapshot(records) == before

    # The address is throttled; the right key and a live worker credential are not.
    assert (await api.get("/v1/workers", headers=bearer(key))).status_code == 200
    me = await api.get("/v1/workers/me", headers=bearer(worker["credential"]))
    assert me.status_code == 200, me.text
    beat = await api.post(
        "/v1/workers/heartbeat", json={"healthy": True}, headers=bearer(worker["credential"])
    )
    assert beat.status_code == 200, beat.text

    async with client_for(app, OTHER_CALLER) as other:  # another address is not held up
        assert (await other.get("/v1/workers", headers=bearer("nope-0"))).status_code == 401

    clock.now += 50  # the window has passed
    assert (await api.get("/v1/workers", headers=bearer("nope"))).status_code == 401


async def test_one_bad_secret_from_many_addresses_is_throttled_by_itself(
    app: FastAPI, credentials: Credentials
):
    _, key = credentials.create_operator_key("ops")
    stale = bearer(key[:-1] + ("A" if key[-1] != "A" else "B"))
    for number in range(5):
        async with client_for(app, (f"192.0.2.{number}", 40000)) as caller:
            assert (await caller.get("/v1/workers", headers=stale)).status_code == 401
    async with client_for(app, ("192.0.2.99", 40000)) as fresh:
        assert (await fresh.get("/v1/workers", headers=stale)).status_code == 429
        assert (await fresh.get("/v1/workers", headers=bearer("other"))).status_code == 401
        assert (await fresh.get("/v1/workers", headers=bearer(key))).status_code == 200


async def test_bad_join_tokens_throttle_only_bad_tokens_and_a_good_one_registers(
    api: httpx.AsyncClient, records: Records
):
    for attempt in range(5):
        refused = await api.post(REGISTER, json=body(f"not-a-real-token-{attempt:04d}"))
        assert refused.status_code == 401
    used = records.mint_token(label=LABEL, ttl=TTL)
    assert (await api.post(REGISTER, json=body(used))).status_code == 200
    before = snapshot(records)

    throttled = await api.post(REGISTER, json=body("not-a-real-token-again"))
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) > 0
    assert (await api.post(REGISTER, json=body(used))).status_code == 429  # used: bad too
    assert snapshot(records) == before  # a throttled refusal writes nothing

    token = records.mint_token(label=LABEL, ttl=TTL)
    registered = await api.post(REGISTER, json=body(token))
    assert registered.status_code == 200, registered.text


async def test_good_calls_do_not_count_against_an_address(
    api: httpx.AsyncClient, credentials: Credentials
):
    _, key = credentials.create_operator_key("ops")
    for _ in range(20):
        assert (await api.get("/v1/workers", headers=bearer(key))).status_code == 200


def test_the_failure_table_stays_bounded_and_forgets_the_stalest(clock: Clock):
    failures = AuthFailures(limit=3, window=60.0, max_clients=100, clock=clock)
    for number in range(10_000):
        failures.failed(f"10.{number // 65536}.{number // 256 % 256}.{number % 256}")
    assert len(failures) == 100
    assert failures.retry_after("10.0.0.0") is None  # forgotten
    for _ in range(3):
        failures.failed("10.0.39.15")  # the newest address, now at its limit
    assert failures.retry_after("10.0.39.15") == 60
    assert len(failures) == 100
    clock.now += 60
    assert failures.retry_after("10.0.39.15") is None

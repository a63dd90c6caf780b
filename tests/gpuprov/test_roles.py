"""Roles and teams on operator API keys (gpuprov/api/auth.py, gpuprov/api/scope.py), over HTTP
in-process on SQLite and PostgreSQL: every operator route declares one role, and a route x role
walk calls each route with a key of each role (below its role: 403 and nothing changed; at or
above: served); a member of team A gets 403 on every route about team B's jobs, workers, logs,
secrets and cost, with nothing changed; what a member or viewer lists is its own team's only."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpuprov.api import auth
from gpuprov.api.app import create_app
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import ROLES, WorkRecord
from gpuprov.store.logs import LogRecords
from gpuprov.store.records import Records
from gpuprov.store.secrets import Vault
from gpuprov.store.teams import Teams
from tests.gpuprov.test_api import REGISTER, body, snapshot
from tests.gpuprov.test_auth import routes

JOB_A, JOB_B = "train-a", "train-b"
RUN_A, RUN_B = "aaa111", "bbb222"
VM_A, VM_B = f"{JOB_A}-a1-n0-{RUN_A}", f"{JOB_B}-a1-n0-{RUN_B}"
KEY = base64.b64encode(bytes(range(32))).decode()

# Who may call each operator route: its least role.
ROUTE_ROLES = {
    ("GET", "/v1/cost"): "viewer",
    ("GET", "/v1/jobs/{job}/logs"): "viewer",
    ("GET", "/v1/offers/stats"): "viewer",
    ("GET", "/v1/workers"): "viewer",
    ("GET", "/v1/teams"): "viewer",
    ("GET", "/v1/teams/{team}"): "viewer",
    ("GET", "/v1/secrets"): "viewer",
    ("PUT", "/v1/secrets/{name}"): "member",
    ("DELETE", "/v1/secrets/{name}"): "member",
    ("GET", "/v1/jobs"): "viewer",
    ("GET", "/v1/jobs/{name}"): "viewer",
    ("POST", "/v1/jobs"): "member",
    ("POST", "/v1/jobs/{name}/release"): "member",
    ("POST", "/v1/jobs/{name}/cancel"): "member",
    ("GET", "/v1/orphans"): "admin",
    ("POST", "/v1/workers/{worker_id}/drain"): "admin",
    ("POST", "/v1/workers/{worker_id}/undrain"): "admin",
    ("DELETE", "/v1/workers/{worker_id}"): "admin",
}


@dataclass
class Fleet:
    """Two teams, a job of each with a registered worker and some output, and keys."""

    keys: dict[str, str]  # "admin", "member-a", "viewer-a", "member-b"
    workers: dict[str, str]  # job -> its worker's id


@pytest.fixture
def vault(records: Records) -> Vault:
    return Vault(records.db, {"k1": base64.b64decode(KEY)}, "k1")


@pytest.fixture
def app(records: Records, vault: Vault) -> FastAPI:
    return create_app(records, vault=vault)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _worker_of(api: httpx.AsyncClient, records: Records, job: str, vm: str) -> str:
    records.record_vm(
        job=job, node_index=0, attempt=1, vm=vm, provider="fake", region="r1", zone=None
    )
    token = records.mint_token(vm=vm, ttl=timedelta(minutes=5))
    answer = await api.post(REGISTER, json=body(token))
    assert answer.status_code == 200, answer.text
    return answer.json()["worker_id"]


@pytest.fixture
async def fleet(api: httpx.AsyncClient, records: Records, vault: Vault) -> Fleet:
    teams = Teams(records.db)
    teams.create("a", monthly_budget_usd=100.0)
    teams.create("b", max_gpus=8)
    teams.admit_run(JOB_A, RUN_A, "a", 1)
    teams.admit_run(JOB_B, RUN_B, "b", 1)
    workers = {
        JOB_A: await _worker_of(api, records, JOB_A, VM_A),
        JOB_B: await _worker_of(api, records, JOB_B, VM_B),
    }
    logs = LogRecords(records.db)
    for job, run in ((JOB_A, RUN_A), (JOB_B, RUN_B)):
        work = WorkRecord(
            job=job, run=run, epoch=0, node_rank=0, worker_id=workers[job], state="started"
        )
        logs.append(work, 1, "stdout", f"hello from {job}\n", 1 << 20)
    vault.set("a", "TOKEN_A", "value-of-a")
    vault.set("b", "TOKEN_B", "value-of-b")
    credentials = Credentials(records.db)
    keys = {
        "admin": credentials.create_operator_key("root")[1],
        "member-a": credentials.create_operator_key("ma", role="member", team="a")[1],
        "viewer-a": credentials.create_operator_key("va", role="viewer", team="a")[1],
        "member-b": credentials.create_operator_key("mb", role="member", team="b")[1],
    }
    return Fleet(keys=keys, workers=workers)


def _call(fleet: Fleet, method: str, path: str, team: str = "a") -> tuple[str, dict[str, Any]]:
    """A well-formed call of the route about `team`'s things."""
    job = JOB_A if team == "a" else JOB_B
    url = (
        path.replace("{job}", job)
        .replace("{team}", team)
        .replace("{name}", f"TOKEN_{team.upper()}" if "secrets" in path else job)
        .replace("{worker_id}", fleet.workers[job])
    )
    params: dict[str, Any] = {}
    if path in ("/v1/cost", "/v1/secrets", "/v1/secrets/{name}", "/v1/jobs"):
        params["team"] = team
    if path == "/v1/workers":
        params["job"] = job
    extra: dict[str, Any] = {"params": params}
    if method == "PUT":
        extra["json"] = {"value": f"new-value-of-{team}"}
    if (method, path) == ("POST", "/v1/jobs"):
        extra = {"json": {"name": f"new-{job}", "team": team}}
    return url, extra


# ---------------------------------------------------------------- the route x role table


def test_every_operator_route_declares_exactly_one_role(app: FastAPI) -> None:
    declared: dict[tuple[str, str], list[str]] = {}
    for role, dependency in auth.ROLE_DEPENDENCIES.items():
        for route in routes(app, dependency):
            declared.setdefault(route, []).append(role)
    assert {route: roles for route, roles in declared.items()} == {
        route: [role] for route, role in ROUTE_ROLES.items()
    }
    # Every route that takes an operator key is in the table: none is left to "any key".
    assert set(routes(app, auth.require_operator)) == set(ROUTE_ROLES)


async def test_each_role_is_served_at_or_above_its_route_and_refused_below_with_nothing_changed(
    api: httpx.AsyncClient, records: Records, fleet: Fleet
) -> None:
    holders = {"admin": "admin", "member": "member-a", "viewer": "viewer-a"}
    # Changing calls last, admins' last of all: what they change is not what the others read.
    order = sorted(ROUTE_ROLES.items(), key=lambda item: (item[0][0] != "GET", item[0]))
    for (method, path), least in order:
        for role in reversed(ROLES):  # viewer, member, admin
            url, extra = _call(fleet, method, path)
            before = snapshot(records)
            answer = await api.request(
                method, url, headers=bearer(fleet.keys[holders[role]]), **extra
            )
            if ROLES.index(role) > ROLES.index(least):
                assert answer.status_code == 403, (method, path, role, answer.text)
                assert snapshot(records) == before, (method, path, role)
                assert role in answer.json()["detail"]
            elif path.startswith("/v1/jobs") and not path.endswith("/logs"):
                # Served, as far as this app goes: it has no Temporal to reach (the job routes
                # over a real one: tests/gpuprov/test_jobs_api.py).
                assert answer.status_code in (422, 503), (method, path, role, answer.text)
            else:  # served: a repeat may find it gone (a delete after the member's)
                assert answer.status_code in (200, 404), (method, path, role, answer.text)


async def test_a_member_of_team_a_gets_403_on_every_route_about_team_b_and_nothing_changes(
    api: httpx.AsyncClient, records: Records, fleet: Fleet
) -> None:
    before = snapshot(records)
    about_b = [route for route, least in ROUTE_ROLES.items() if least != "admin"]
    about_b.remove(("GET", "/v1/offers/stats"))  # offerings belong to no team
    about_b.remove(("GET", "/v1/teams"))  # lists the caller's own team only: below
    # A job's team is Temporal's to say (its GpuprovTeam): tests/gpuprov/test_jobs_api.py.
    about_b = [(m, p) for m, p in about_b if not p.startswith("/v1/jobs/{name}")]
    about_b.remove(("GET", "/v1/jobs"))
    for method, path in about_b:
        url, extra = _call(fleet, method, path, team="b")
        answer = await api.request(method, url, headers=bearer(fleet.keys["member-a"]), **extra)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "'b'" in answer.json()["detail"], answer.text
        assert "value-of-b" not in answer.text
    # Team B's worker, by its id, under the routes that act on one worker: admins' only.
    for method, path in [route for route, least in ROUTE_ROLES.items() if least == "admin"]:
        url, extra = _call(fleet, method, path, team="b")
        answer = await api.request(method, url, headers=bearer(fleet.keys["member-a"]), **extra)
        assert answer.status_code == 403, (method, path, answer.text)
    assert snapshot(records) == before


async def test_what_a_member_lists_is_its_own_teams_only(
    api: httpx.AsyncClient, fleet: Fleet
) -> None:
    headers = bearer(fleet.keys["member-a"])
    workers = (await api.get("/v1/workers", headers=headers)).json()["workers"]
    assert [worker["job"] for worker in workers] == [JOB_A]
    every = (await api.get("/v1/workers", headers=bearer(fleet.keys["admin"]))).json()["workers"]
    assert sorted(worker["job"] for worker in every) == [JOB_A, JOB_B]

    cost = (await api.get("/v1/cost", headers=headers)).json()
    assert cost["team"] == "a" and cost["budget"]["monthly_budget_usd"] == 100.0
    teams = (await api.get("/v1/teams", headers=headers)).json()
    assert [team["team"] for team in teams] == ["a"]
    every_team = (await api.get("/v1/teams", headers=bearer(fleet.keys["admin"]))).json()
    assert [team["team"] for team in every_team] == ["a", "b", "default"]

    names = (await api.get("/v1/secrets", headers=headers)).json()
    assert [(secret["team"], secret["name"]) for secret in names] == [("a", "TOKEN_A")]
    assert "value-of-a" not in str(names)

    logs = (await api.get(f"/v1/jobs/{JOB_A}/logs", headers=headers)).json()
    assert [chunk["data"] for chunk in logs["chunks"]] == [f"hello from {JOB_A}\n"]
    unknown = await api.get("/v1/jobs/never-ran/logs", headers=headers)
    assert unknown.status_code == 404


async def test_a_viewer_reads_its_team_but_changes_nothing(
    api: httpx.AsyncClient, records: Records, fleet: Fleet
) -> None:
    headers = bearer(fleet.keys["viewer-a"])
    assert (await api.get(f"/v1/jobs/{JOB_A}/logs", headers=headers)).status_code == 200
    before = snapshot(records)
    refused = await api.put("/v1/secrets/TOKEN_A", headers=headers, json={"value": "from-a-viewer"})
    assert refused.status_code == 403
    assert snapshot(records) == before


async def test_only_an_admin_changes_the_global_secrets(
    api: httpx.AsyncClient, vault: Vault, fleet: Fleet
) -> None:
    member = await api.put(
        "/v1/secrets/SHARED", headers=bearer(fleet.keys["member-a"]), json={"value": "abcd1234"}
    )
    assert member.status_code == 200 and member.json()["team"] == "a"  # its own team's
    admin = await api.put(
        "/v1/secrets/SHARED", headers=bearer(fleet.keys["admin"]), json={"value": "global-1"}
    )
    assert admin.status_code == 200 and admin.json()["team"] is None  # global
    assert vault.values("a", ["SHARED"]) == {"SHARED": "abcd1234"}  # its own shadows global
    assert vault.values("b", ["SHARED"]) == {"SHARED": "global-1"}

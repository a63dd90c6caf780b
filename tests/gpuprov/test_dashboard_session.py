"""The dashboard's sign-in and form checks (gpuprov/api/dashboard/session.py), and what its
spend figures add up (gpuprov/store/spend.py), over the real app and a real database.

The key is kept in an HttpOnly, SameSite=Strict cookie scoped to /ui and never appears in a
URL or a page; a wrong or revoked key gets the sign-in page; a form without this session's
CSRF token, or sent from another site, is refused and changes nothing; a bad filter is named.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from gpuprov.api.app import create_app
from gpuprov.api.auth import AuthFailures
from gpuprov.api.dashboard.session import COOKIE, csrf_token
from gpuprov.engine.worker import open_records
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import CostRecord, VmRecord, utcnow
from gpuprov.store.records import Records
from gpuprov.store.spend import jobs_spend, providers_spend
from gpuprov.store.teams import Teams, month_start
from tests.gpuprov.in_process import client_for

PAGES = ("/ui/", "/ui/workers", "/ui/spend", "/ui/jobs/some-job")


@pytest.fixture
def records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


@pytest.fixture
def keys(records: Records) -> dict[str, str]:
    Teams(records.db).create("ml", monthly_budget_usd=100.0)
    credentials = Credentials(records.db)
    return {
        "admin": credentials.create_operator_key("ops")[1],
        "member": credentials.create_operator_key("alice", role="member", team="ml")[1],
        "viewer": credentials.create_operator_key("bob", role="viewer", team="ml")[1],
    }


def signed_in(api: httpx.AsyncClient, key: str) -> httpx.AsyncClient:
    api.cookies.set(COOKIE, key, path="/ui")
    return api


async def test_every_page_asks_an_unsigned_visitor_to_sign_in(records: Records) -> None:
    async with client_for(create_app(records)) as api:
        for path in PAGES:
            answer = await api.get(path)
            assert (answer.status_code, answer.headers["location"]) == (303, "/ui/login"), path
        page = await api.get("/ui/login")
    assert page.status_code == 200 and 'type="password"' in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"


async def test_a_good_key_is_kept_in_an_httponly_samesite_cookie_and_never_shown(
    records: Records, keys: dict[str, str]
) -> None:
    async with client_for(create_app(records)) as api:
        answer = await api.post("/ui/login", data={"key": keys["member"]})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/"
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}={keys['member']};")
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "path=/ui", "samesite=strict"} <= attributes
        assert "secure" not in attributes  # plain HTTP here; Secure over HTTPS
        for path in ("/ui/workers", "/ui/spend"):
            page = await api.get(path)
            assert page.status_code == 200, path
            assert keys["member"] not in page.text and "alice · member of ml" in page.text
            assert keys["member"] not in str(page.url)


async def test_a_wrong_or_revoked_key_gets_the_sign_in_page(
    records: Records, keys: dict[str, str]
) -> None:
    async with client_for(create_app(records)) as api:
        wrong = await api.post("/ui/login", data={"key": "gpo_" + "x" * 40})
        assert wrong.status_code == 401 and "unknown or revoked" in wrong.text
        assert "set-cookie" not in wrong.headers
        empty = await api.post("/ui/login", data={"key": ""})
        assert empty.status_code == 401 and "Enter an API key" in empty.text
        Credentials(records.db).revoke_operator_keys("bob")
        revoked = await signed_in(api, keys["viewer"]).get("/ui/workers")
    assert revoked.status_code == 401 and "sign in again" in revoked.text
    assert f'{COOKIE}=""' in revoked.headers["set-cookie"]  # the dead key's cookie is cleared


async def test_bad_keys_are_throttled_like_bearer_keys(records: Records) -> None:
    app = create_app(records, auth_failures=AuthFailures(limit=3))
    async with client_for(app) as api:
        answers = [await api.post("/ui/login", data={"key": f"gpo_{n:040d}"}) for n in range(5)]
        unsigned_form = await api.post("/ui/jobs/some-job/cancel", data={})
    assert [answer.status_code for answer in answers] == [401, 401, 401, 429, 429]
    assert int(answers[-1].headers["retry-after"]) > 0 and "too many" in answers[-1].text
    assert (unsigned_form.status_code, unsigned_form.headers["location"]) == (303, "/ui/login")


async def test_a_form_without_the_sessions_token_or_from_another_site_is_refused(
    records: Records, keys: dict[str, str]
) -> None:
    token = csrf_token(keys["admin"])
    async with client_for(create_app(records)) as api:
        signed_in(api, keys["admin"])
        missing = await api.post("/ui/logout", data={})
        wrong = await api.post("/ui/logout", data={"csrf": csrf_token(keys["member"])})
        other_site = await api.post(
            "/ui/logout", data={"csrf": token}, headers={"Origin": "https://evil.example"}
        )
        fetched = await api.post(
            "/ui/logout", data={"csrf": token}, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert [missing.status_code, wrong.status_code] == [403, 403]
        assert [other_site.status_code, fetched.status_code] == [403, 403]
        assert "another site" in other_site.text
        still = await api.get("/ui/workers")
        assert still.status_code == 200  # nothing changed: still signed in
        out = await api.post("/ui/logout", data={"csrf": token}, headers={"Origin": "http://api"})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert f'{COOKIE}=""' in out.headers["set-cookie"]


async def test_only_an_admin_drains_and_a_bad_filter_is_named(
    records: Records, keys: dict[str, str]
) -> None:
    async with client_for(create_app(records)) as api:
        for role in ("viewer", "member"):
            signed_in(api, keys[role])
            refused = await api.post("/ui/workers/w1/drain", data={"csrf": csrf_token(keys[role])})
            assert refused.status_code == 403 and "admin role" in refused.text, role
        signed_in(api, keys["admin"])
        unknown = await api.post("/ui/workers/w1/drain", data={"csrf": csrf_token(keys["admin"])})
        assert unknown.status_code == 404
        for query, field in (("state=sleeping", "state"), ("provider=acme", "provider")):
            page = await api.get(f"/ui/?{query}")
            assert page.status_code == 200 and f"{field}: " in page.text, query
        signed_in(api, keys["viewer"])
        other_team = await api.get("/ui/?team=cv")
    assert other_team.status_code == 403 and "team &#39;cv&#39;" in other_team.text


def _machine(records: Records, job: str, run: str, provider: str, **fields: object) -> None:
    with records.db.session() as session:
        session.add(
            VmRecord(
                job=job,
                run=run,
                node_index=0,
                attempt=1,
                vm=f"{job}-{run}-{provider}",
                provider=provider,
                region="r1",
                instance_ids=["i-1"],
                created_at=utcnow() - timedelta(hours=2),
                **fields,
            )  # fmt: skip
        )
        session.commit()


def test_spend_so_far_is_the_actuals_plus_what_held_machines_accrued(records: Records) -> None:
    now = utcnow()
    teams = Teams(records.db)
    teams.create("ml")
    teams.admit_run("train", "old", "ml", 8)
    teams.admit_run("train", "new", "ml", 8)
    hour_ago = now - timedelta(hours=1)
    _machine(records, "train", "old", "lambda", status="terminated", terminated_at=hour_ago)
    _machine(records, "train", "new", "fake", status="running", launched_at=hour_ago,
             price_amount=10.0, price_currency="USD", price_unit="hour")  # fmt: skip
    _machine(records, "train", "new", "runpod", status="running", launched_at=hour_ago)  # no quote
    with records.db.session() as session:
        for run, amount in (("old", 50.0), ("new", 2.5)):
            session.add(CostRecord(job="train", run=run, kind="actual", amount=amount,
                                   currency="USD", unit="total", source="test", provider="lambda",
                                   recorded_at=now, vm=f"train-{run}"))  # fmt: skip
        session.commit()
    spend = jobs_spend(records.db, ["train", "never-ran"], now)
    assert set(spend) == {"train"}  # the name's latest run only
    latest = spend["train"]
    assert latest.run == "new" and latest.machines_held == 2 and latest.gpus_held == 16
    assert latest.spent == {"USD": pytest.approx(12.5)} and latest.per_hour == {"USD": 10.0}
    providers = providers_spend(records.db, "ml", month_start(now), now)
    by_provider = {line.provider: line for line in providers}
    assert by_provider["lambda"].spent == {"USD": 52.5}
    assert by_provider["fake"].spent["USD"] == pytest.approx(10.0, rel=1e-3)
    assert by_provider["runpod"].spent == {} and by_provider["runpod"].machines_held == 1
    assert [line.provider for line in providers][0] == "lambda"  # the dearest first
    assert providers_spend(records.db, "cv", month_start(now), now) == []

"""The job API (gpuprov/api/jobs.py) against a real dev server, a real worker on the fake cloud
and a real database: `curl` alone submits a job, follows it to ready, reads its logs and
releases it; a spec is checked as the CLI checks it; the same spec twice is one job; a member
acts on its own team's jobs only, a viewer on none; a list is its team's, a page at a time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import JobsSettings, WorkersSettings
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState
from gpuprov.store.credentials import Credentials
from gpuprov.store.records import Records
from gpuprov.store.teams import Teams
from tests.gpuprov.in_process import client_for
from tests.helpers import assert_nothing_left, eventually, fake_worker, fast_cloud

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

FAST = WorkersSettings(heartbeat_interval_seconds=0.3, lost_after_seconds=5)
JOBS = JobsSettings(stop_grace_seconds=3)


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


def spec(name: str, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "resources": {"gpu": "H100", "gpus_per_node": 8},
        "provisioning_timeout_seconds": 120,
        **extra,
    }


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys(sqlite_records: Records) -> dict[str, str]:
    Teams(sqlite_records.db).create("ml")
    Teams(sqlite_records.db).create("cv")
    credentials = Credentials(sqlite_records.db)
    return {
        "admin": credentials.create_operator_key("ops")[1],
        "ml": credentials.create_operator_key("ml", role="member", team="ml")[1],
        "ml-viewer": credentials.create_operator_key("mlv", role="viewer", team="ml")[1],
        "cv": credentials.create_operator_key("cv", role="member", team="cv")[1],
    }


@pytest.fixture
async def stack(
    client: Client, task_queue: str, sqlite_records: Records
) -> AsyncIterator[tuple[httpx.AsyncClient, object]]:
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (_, cloud):
        app = create_app(sqlite_records, temporal=client, task_queue=task_queue)
        async with client_for(app) as api:
            yield api, cloud


async def _state(api: httpx.AsyncClient, name: str, key: str, wanted: str) -> dict:
    async def check() -> dict | None:
        answer = await api.get(f"/v1/jobs/{name}", headers=bearer(key))
        body = answer.json() if answer.status_code == 200 else {}
        return body if body.get("state") == wanted else None

    return await eventually(check, f"job {name} {wanted}")


async def test_curl_alone_submits_follows_reads_the_logs_and_releases(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records, keys: dict[str, str]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run = spec(job_name, team="ml", run="echo hello from curl; sleep 600")

    async def curl(*args: str) -> tuple[int, dict]:
        process = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {keys['ml']}",
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, err.decode()
        body, _, code = out.decode().rpartition("\n")
        return int(code), json.loads(body)

    config = fast_cloud(agent="simulated", boot_timeout=60)
    app = create_app(
        sqlite_records, workers=FAST, jobs=JOBS, temporal=client, task_queue=task_queue
    )
    worker = fake_worker(client, task_queue, config, sqlite_records, api_url=url)
    async with serving(app, "127.0.0.1", port), worker as (_, cloud):
        code, submitted = await curl(
            "-X", "POST", "-H", "Content-Type: application/json",
            "--data", json.dumps(run), f"{url}/v1/jobs",
        )  # fmt: skip
        assert (code, submitted["created"], submitted["team"]) == (201, True, "ml")

        async def running() -> dict | None:
            _, status = await curl(f"{url}/v1/jobs/{job_name}")
            return status if status.get("state") == "running" else None

        status = await eventually(running, "the job running, seen with curl")
        assert status["team"] == "ml" and status["attempts"][0]["outcome"] == "succeeded"

        async def logged() -> dict | None:
            _, page = await curl(f"{url}/v1/jobs/{job_name}/logs")
            return page if "hello from curl" in json.dumps(page) else None

        await eventually(logged, "the work's output, read with curl")
        code, ended = await curl("-X", "POST", f"{url}/v1/jobs/{job_name}/release")
        assert (code, ended) == (200, {"name": job_name, "requested": "release"})

        async def done() -> dict | None:
            _, status = await curl(f"{url}/v1/jobs/{job_name}")
            return status if status.get("state") in ("completed", "failed") else None

        final = await eventually(done, "the job ended, seen with curl")
        assert_nothing_left(cloud)
    assert final["state"] == "completed", final


async def test_a_spec_is_checked_like_the_clis_and_the_same_spec_twice_is_one_job(
    stack: tuple[httpx.AsyncClient, object], job_name: str, keys: dict[str, str]
) -> None:
    api, cloud = stack
    ml = bearer(keys["ml"])
    bad = await api.post("/v1/jobs", headers=ml, json=spec(job_name, nodes=0))
    assert bad.status_code == 422
    assert bad.json()["detail"].startswith("invalid job spec: nodes: Input should be greater")
    broken = await api.post(
        "/v1/jobs", headers={**ml, "Content-Type": "application/yaml"}, content=b"name: [a"
    )
    assert broken.status_code == 422 and broken.json()["detail"].startswith("malformed job spec")
    secret = spec(job_name, run="true", env={"KEY": "${{ secrets.NOPE }}"})
    unknown = await api.post("/v1/jobs", headers=ml, json=secret)
    assert unknown.status_code == 422
    assert unknown.json()["detail"].startswith("env.KEY: no secret named 'NOPE' that team 'ml'")

    yaml_body = f"name: {job_name}\nresources: {{gpu: H100, gpus_per_node: 8}}\n"
    yaml_body += "provisioning_timeout_seconds: 120\n"
    first = await api.post(
        "/v1/jobs", headers={**ml, "Content-Type": "application/yaml"}, content=yaml_body
    )
    assert first.status_code == 201, first.text
    assert first.json()["team"] == "ml"  # a member's spec that names no team is its team's
    await _state(api, job_name, keys["ml"], "ready")
    again = await api.post("/v1/jobs", headers=ml, json=spec(job_name))
    assert again.status_code == 200, again.text
    assert again.json()["created"] is False and again.json()["status"]["state"] == "ready"
    other = await api.post("/v1/jobs", headers=ml, json=spec(job_name, nodes=2))
    assert other.status_code == 409
    assert len(cloud.state.instances()) == 1  # one job, one machine

    cancelled = await api.post(f"/v1/jobs/{job_name}/cancel", headers=ml)
    assert cancelled.status_code == 200, cancelled.text
    await _state(api, job_name, keys["ml"], JobState.CANCELLED.value)
    late = await api.post(f"/v1/jobs/{job_name}/release", headers=ml)
    assert late.status_code == 409 and "ended already" in late.json()["detail"]
    assert_nothing_left(cloud)


async def test_members_act_on_their_own_teams_jobs_only_and_viewers_on_none(
    stack: tuple[httpx.AsyncClient, object], job_name: str, keys: dict[str, str]
) -> None:
    api, cloud = stack
    ml, cv = bearer(keys["ml"]), bearer(keys["cv"])
    refused = await api.post("/v1/jobs", headers=cv, json=spec(job_name, team="ml"))
    assert refused.status_code == 403 and "'ml'" in refused.json()["detail"]
    viewer = await api.post("/v1/jobs", headers=bearer(keys["ml-viewer"]), json=spec(job_name))
    assert viewer.status_code == 403
    started = await api.post("/v1/jobs", headers=ml, json=spec(job_name))
    assert started.status_code == 201, started.text
    await _state(api, job_name, keys["ml"], "ready")

    for method, path in (
        ("GET", f"/v1/jobs/{job_name}"),
        ("POST", f"/v1/jobs/{job_name}/release"),
        ("POST", f"/v1/jobs/{job_name}/cancel"),
    ):
        answer = await api.request(method, path, headers=cv)
        assert answer.status_code == 403, (path, answer.text)
    for path in (f"/v1/jobs/{job_name}/release", f"/v1/jobs/{job_name}/cancel"):
        answer = await api.post(path, headers=bearer(keys["ml-viewer"]))
        assert answer.status_code == 403, (path, answer.text)
    assert (await _state(api, job_name, keys["ml-viewer"], "ready"))["team"] == "ml"

    async def listed(key: str, **params: str) -> list[str]:
        answer = await api.get("/v1/jobs", headers=bearer(key), params=params)
        assert answer.status_code == 200, answer.text
        return [job["name"] for job in answer.json()["jobs"]]

    await eventually(lambda: _has(listed(keys["ml"]), job_name), "the job listed for ml")
    assert job_name not in await listed(keys["cv"])  # cv's list is cv's jobs
    assert (await api.get("/v1/jobs", headers=cv, params={"team": "ml"})).status_code == 403
    assert job_name in await listed(keys["admin"], team="ml", state="ready")
    page = await api.get("/v1/jobs", headers=bearer(keys["admin"]), params={"page_size": 1})
    assert len(page.json()["jobs"]) == 1
    released = await api.post(f"/v1/jobs/{job_name}/release", headers=ml)
    assert released.status_code == 200
    await _state(api, job_name, keys["ml"], "completed")
    assert_nothing_left(cloud)


async def _has(names: object, name: str) -> bool:
    return name in await names  # type: ignore[operator]


async def test_without_temporal_the_job_routes_answer_503(
    sqlite_records: Records, keys: dict[str, str]
) -> None:
    async with client_for(create_app(sqlite_records)) as api:
        answer = await api.get("/v1/jobs", headers=bearer(keys["admin"]))
    assert answer.status_code == 503 and answer.headers["retry-after"] == "5"

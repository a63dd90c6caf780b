"""The secrets vault (gpuprov/store/secrets.py) and how the API hands secrets to the work and
hides them in what the work reports (gpuprov/api/work_secrets.py), over the real API app on
SQLite and PostgreSQL: values are encrypted at rest and bound to their team and name; the work's
row keeps only the reference and `GET /v1/work` answers the value; every stored output chunk and
exit tail shows *** instead; without a key nothing is stored."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from gpuprov.api.app import create_app
from gpuprov.models import JobSpec, JobSpecError, parse_job_spec
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import SecretRecord
from gpuprov.store.logs import LogRecords
from gpuprov.store.records import Records
from gpuprov.store.secrets import SecretRefused, Vault, VaultLocked, redact, resolve
from gpuprov.store.teams import Teams
from gpuprov.store.work import Assignment, RunCommand, WorkRecords
from tests.gpuprov.in_process import client_for
from tests.gpuprov.test_api import snapshot
from tests.gpuprov.test_auth import bearer
from tests.gpuprov.test_work_api import register

KEY_1 = bytes(range(32))
KEY_2 = bytes(range(32, 64))
VALUE = "wandb-5f2b8c1d9e"
RUN = "abc123"
JOB = "train-secret"


@pytest.fixture
def vault(records: Records) -> Vault:
    return Vault(records.db, {"k1": KEY_1}, "k1")


@pytest.fixture
def app(records: Records, vault: Vault) -> FastAPI:
    return create_app(records, vault=vault)


def stored(records: Records) -> list[SecretRecord]:
    with records.db.session() as session:
        return list(session.execute(sa.select(SecretRecord)).scalars().all())


# ---------------------------------------------------------------- the vault itself


def test_a_value_is_encrypted_at_rest_and_bound_to_its_team_and_name(
    records: Records, vault: Vault
) -> None:
    vault.set("default", "WANDB", VALUE)
    [row] = stored(records)
    assert VALUE.encode() not in row.ciphertext and VALUE not in repr(snapshot(records))
    assert row.key_id == "k1" and len(row.nonce) == 12
    assert vault.values("default", ["WANDB", "UNKNOWN"]) == {"WANDB": VALUE}
    # Moved to another team, the row does not decrypt.
    with records.db.session() as session:
        session.execute(sa.update(SecretRecord).values(team="other"))
        session.commit()
    with pytest.raises(VaultLocked, match="does not decrypt"):
        vault.values("other", ["WANDB"])


def test_old_keys_still_decrypt_after_a_rotation_and_a_missing_key_says_so(
    records: Records, vault: Vault
) -> None:
    vault.set("default", "OLD", VALUE)
    rotated = Vault(records.db, {"k1": KEY_1, "k2": KEY_2}, "k2")
    rotated.set("default", "NEW", "second-value")
    assert rotated.values("default", ["OLD", "NEW"]) == {"OLD": VALUE, "NEW": "second-value"}
    with pytest.raises(VaultLocked, match="key 'k2', which is not configured"):
        vault.values("default", ["NEW"])


def test_without_a_key_nothing_is_stored_and_bad_names_or_values_are_refused(
    records: Records,
) -> None:
    with pytest.raises(VaultLocked, match=r"set \[secrets\] keys and active_key"):
        Vault(records.db, {}, None).set("default", "WANDB", VALUE)
    vault = Vault(records.db, {"k1": KEY_1}, "k1")
    for name, value, field in (("1BAD", VALUE, "name"), ("OK", "abc", "value")):
        with pytest.raises(SecretRefused, match=f"^{field}:"):
            vault.set("default", name, value)
    assert stored(records) == []


def test_references_resolve_and_values_redact() -> None:
    env = {"A": "${{ secrets.WANDB }}", "B": "Bearer ${{secrets.TOKEN}}!", "C": "plain"}
    assert resolve(env, {"WANDB": VALUE, "TOKEN": "tok-1234"}) == {
        "A": VALUE,
        "B": "Bearer tok-1234!",
        "C": "plain",
    }
    assert redact(f"key={VALUE} and {VALUE[:6]}", [VALUE, VALUE[:6]]) == "key=*** and ***"
    spec = JobSpec(name="x", run="true", env=env)
    assert spec.secret_references() == {"A": ["WANDB"], "B": ["TOKEN"]}
    with pytest.raises(JobSpecError, match="env: .*A: a malformed secret reference"):
        parse_job_spec({"name": "x", "run": "true", "env": {"A": "${{ secret.WANDB }}"}})


# ---------------------------------------------------------------- over the API


async def test_the_work_gets_the_value_and_its_output_and_tail_hide_it(
    api: httpx.AsyncClient, records: Records, vault: Vault
) -> None:
    vault.set("default", "WANDB", VALUE)
    Teams(records.db).admit_run(JOB, RUN, "default", 8)
    worker = await register(api, records, 0, job=JOB)
    command = RunCommand(run="train", env={"WANDB_API_KEY": "${{ secrets.WANDB }}", "X": "1"})
    WorkRecords(records.db).assign(
        JOB, 0, [Assignment(rank=0, worker_id=worker["worker_id"], command=command)], run=RUN
    )
    answer = await api.get("/v1/work", headers=worker["headers"])
    assert answer.status_code == 200, answer.text
    work = answer.json()
    assert work["command"]["env"] == {"WANDB_API_KEY": VALUE, "X": "1"}
    assert VALUE not in repr(snapshot(records))  # the row keeps the reference

    chunk = {"seq": 1, "stream": "stdout", "data": f"logging in with {VALUE}\nstep 1\n"}
    logged = await api.post(f"/v1/work/{work['id']}/logs", headers=worker["headers"], json=chunk)
    assert logged.status_code == 200, logged.text
    tail = {"code": 1, "tail": f"Traceback: bad key {VALUE}"}
    ended = await api.post(f"/v1/work/{work['id']}/exit", headers=worker["headers"], json=tail)
    assert ended.status_code == 200, ended.text

    page = LogRecords(records.db).chunks(JOB, 0, None, 100, RUN)
    assert [c.data for c in page.chunks] == ["logging in with ***\nstep 1\n"]
    [node] = WorkRecords(records.db).of_job(JOB, 0, RUN)
    assert node.tail == "Traceback: bad key ***"
    assert VALUE not in repr(snapshot(records))
    _, key = Credentials(records.db).create_operator_key("reader")
    shown = await api.get(f"/v1/jobs/{JOB}/logs", headers=bearer(key))
    assert "logging in with ***" in shown.text and VALUE not in shown.text


async def test_without_a_key_the_api_refuses_a_set_and_stores_nothing(
    records: Records,
) -> None:
    locked = create_app(records)  # no vault: no key
    _, key = Credentials(records.db).create_operator_key("admin")
    async with client_for(locked) as api:
        answer = await api.put("/v1/secrets/WANDB", headers=bearer(key), json={"value": VALUE})
    assert answer.status_code == 503
    assert "no secrets key is configured" in answer.json()["detail"]
    assert VALUE not in answer.text
    assert stored(records) == []


async def test_names_are_listed_and_values_never_answered(
    api: httpx.AsyncClient, records: Records
) -> None:
    _, key = Credentials(records.db).create_operator_key("admin")
    put = await api.put(
        "/v1/secrets/WANDB", headers=bearer(key), params={"team": "default"}, json={"value": VALUE}
    )
    assert put.status_code == 200 and VALUE not in put.text
    names = await api.get("/v1/secrets", headers=bearer(key))
    assert [item["name"] for item in names.json()] == ["WANDB"] and VALUE not in names.text
    gone = await api.delete("/v1/secrets/WANDB", headers=bearer(key), params={"team": "default"})
    assert gone.status_code == 200
    again = await api.delete("/v1/secrets/WANDB", headers=bearer(key), params={"team": "default"})
    assert again.status_code == 404
    assert stored(records) == []

"""`gpuprov cost`, `GpuprovClient.cost` and `GET /v1/cost`: one report, read from the database,
on SQLite and on PostgreSQL 15 (conftest)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
import sqlalchemy as sa
from temporalio.client import Client

from gpuprov.api.app import create_app
from gpuprov.cli import main as cli
from gpuprov.cli.render import COST_FORMULA
from gpuprov.sdk.client import GpuprovClient, GpuprovError
from gpuprov.store.costs import CostReport, cost_report
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import Database, VmRecord
from gpuprov.store.records import Records
from providers.base import Billing, PriceQuote

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

T0 = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
PER_MINUTE = Billing(granularity_seconds=60, minimum_seconds=60)


def machine(
    records: Records,
    vm: str,
    price: PriceQuote | None,
    *,
    attempt: int = 1,
    status: str | None = None,
    ran: timedelta | None = None,
    job: str = "train",
) -> None:
    """A machine of `job`: launched at T0; gone `ran` later, or left in `status`."""
    records.record_vm(
        job=job, node_index=0, attempt=attempt, vm=vm, provider="fake", region="r1",
        zone="r1-a", instance_type="gpu8", price=price, billing=PER_MINUTE,
    )  # fmt: skip
    records.set_vm_instances(vm, [f"i-{vm}"], "created")
    moments = {"launched_at": T0}
    if ran is not None:
        moments["terminated_at"] = T0 + ran
    with records.db.engine.begin() as connection:
        connection.execute(sa.update(VmRecord).where(VmRecord.vm == vm).values(**moments))
    if ran is not None:
        records.vm_terminated(vm)
    elif status is not None:
        records.set_vm_status(vm, status)


def usd(amount: float, currency: str = "USD") -> PriceQuote:
    return PriceQuote(amount=amount, currency=currency, source="catalogue", observed_at=T0)


@pytest.fixture
def books(records: Records) -> Records:
    """Job `train`: an estimate per attempt; attempt 1's machine failed over after 90 s, attempt
    2's ran an hour; an unpriced machine; job `eu` in euros, one machine kept."""
    for amount in (10.0, 12.0):
        records.record_cost(
            job="train", kind="estimate", amount=amount, currency="USD", unit="hour",
            source="catalogue", provider="fake",
        )  # fmt: skip
    machine(records, "train-a1-n0", usd(10.0), ran=timedelta(seconds=90))
    machine(records, "train-a2-n0", usd(12.0), attempt=2, ran=timedelta(hours=1))
    machine(records, "train-a2-n1", None, attempt=2, ran=timedelta(hours=1))
    machine(records, "eu-a1-n0", usd(3.0, "EUR"), job="eu", ran=timedelta(minutes=10))
    machine(records, "eu-a1-n1", usd(3.0, "EUR"), job="eu", status="kept")
    return records


def test_the_cli_shows_each_job_per_provider_then_each_machine_of_one_job(
    books: Records, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys
):
    monkeypatch.delenv("GPUPROV_CONFIG", raising=False)
    monkeypatch.setenv("GPUPROV_DATABASE__URL", database_url)

    assert cli.main(["--address", "127.0.0.1:1", "cost"]) == 0  # Temporal is not needed
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "eu on fake: estimate none recorded; actual 0.50 EUR (1 of 2 machine(s) with an actual)",
        "    kept (release: keep), still running: no actual: eu-a1-n1",
        "train on fake: estimate 10.00 USD/hour, 12.00 USD/hour; actual 12.33 USD "
        "(2 of 3 machine(s) with an actual)",
        "    no quote, so no actual cost can be computed: train-a2-n1",
        COST_FORMULA,
    ]

    assert cli.main(["cost", "train"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[:4] == [
        "job train:",
        "  attempt 1 node 0 train-a1-n0 [fake/r1-a gpu8] terminated",
        "      quote 10 USD/hour; launched 2026-03-04 05:06:07 UTC; gone 2026-03-04 05:07:37 UTC",
        "      billed 120 s: 0.33 USD",
    ]
    assert "      no quote: no actual cost can be computed" in listed
    assert "      billed 3600 s: 12.00 USD" in listed

    assert cli.main(["cost", "train", "--json"]) == 0
    parsed = CostReport.model_validate_json(capsys.readouterr().out)
    assert parsed == cost_report(books.db, "train")

    assert cli.main(["cost", "nobody"]) == 0
    assert capsys.readouterr().out == "no cost records or machines for job nobody\n"


async def test_the_sdk_reads_the_same_report(books: Records, client: Client, database_url: str):
    sdk = GpuprovClient(client, "unused", database_url=database_url)

    everything = await sdk.cost()
    train = await sdk.cost("train")

    assert everything == cost_report(books.db)
    assert train == cost_report(books.db, "train")
    [eu] = [line for line in everything.providers if line.job == "eu"]
    assert [(m.amount, m.currency) for m in eu.actual] == [(pytest.approx(0.5), "EUR")]
    assert [m.billed_seconds for m in train.machines] == [120, 3600, None]
    with pytest.raises(GpuprovError, match="database_url"):
        await GpuprovClient(client, "unused").cost()


async def test_the_sdk_says_when_the_database_cannot_be_read(client: Client, tmp_path):
    sdk = GpuprovClient(client, "unused", database_url=f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(GpuprovError, match="cannot read costs from gpuprov's database"):
        await sdk.cost()


async def test_an_operator_gets_the_report_over_the_api(books: Records, database: Database):
    _, key = Credentials(database).create_operator_key("ops")
    transport = httpx.ASGITransport(app=create_app(books))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
        headers = {"Authorization": f"Bearer {key}"}
        everything = await api.get("/v1/cost", headers=headers)
        one = await api.get("/v1/cost", params={"job": "eu"}, headers=headers)
        refused = await api.get("/v1/cost")
        empty_job = await api.get("/v1/cost", params={"job": ""}, headers=headers)

    assert everything.status_code == 200, everything.text
    assert CostReport.model_validate(everything.json()) == cost_report(books.db)
    report = CostReport.model_validate(one.json())
    assert report.job == "eu" and [m.vm for m in report.machines] == ["eu-a1-n0", "eu-a1-n1"]
    assert report.machines[1].note.startswith("kept (release: keep): still running")
    assert refused.status_code == 401
    assert empty_job.status_code == 422

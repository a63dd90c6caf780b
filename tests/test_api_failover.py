"""Two API processes on one PostgreSQL behind one nginx address share the nodes: with one
killed midway (SIGKILL), no worker is taken for lost, every heartbeat sent after the kill is
answered by the other, and no worker row is doubled (bench/api_failover.py, run small)."""

from __future__ import annotations

import pytest

from bench.api_failover import failover_on
from bench.api_failover_report import section
from tests.postgres import ScratchDatabases

pytestmark = pytest.mark.slow  # two API processes and nginx for about fifteen seconds

AGENTS, INTERVAL, SECONDS, KILL_AT = 200, 2.0, 10.0, 4.0


async def test_one_of_two_api_processes_killed_loses_no_worker_and_drops_no_heartbeat(
    postgres_scratch: ScratchDatabases,
):
    database_url = postgres_scratch.create()
    try:
        run = await failover_on(database_url, AGENTS, INTERVAL, SECONDS, KILL_AT)
    finally:
        postgres_scratch.drop(database_url)
    assert run.error is None, run.error
    load = run.load
    assert load is not None
    assert load.sent == AGENTS * SECONDS / INTERVAL  # every agent, every interval
    assert load.ok == load.sent and load.errors == {}
    # both processes answered before the kill; after it, only the survivor
    assert len(run.before_kill) == 2 and all(run.before_kill.values()), run.before_kill
    assert run.after_kill.get("started after the kill", 0) >= AGENTS * 2
    assert run.after_kill.get("answered by the killed process", 0) == 0
    assert run.after_kill.get("not answered 200", 0) == 0
    assert run.lost_workers == 0 and run.unheard_since_kill == 0
    assert run.worker_rows == AGENTS
    assert run.held
    report = "\n".join(section(run))
    assert "Verdict: every promise kept." in report
    assert "| workers taken for lost | 0 |" in report

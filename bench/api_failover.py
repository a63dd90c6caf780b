"""Two API processes on one PostgreSQL behind one address, one of them killed midway.

- The API is `python -m gpuprov.cli.main api`, twice, both on the same PostgreSQL database
  (bench/postgres.py starts a throwaway server, or the caller gives one), behind nginx
  (bench/front.py): the agents know one address only.
- N workers are registered beforehand (bench/heartbeats.py's `register_workers`); the load is
  bench/heartbeat_load.py: every agent heartbeats once per interval on a connection it keeps,
  for `seconds`. At `kill_at` seconds the first API process gets SIGKILL: no shutdown, no last
  commit, its connections cut.
- After the load: the workers the liveness sweep would take for lost (must be 0), the workers
  not heard from since the kill (must be 0: each was served by the other process), the worker
  rows (must be N: nothing doubled), and from nginx's log every request that started after the
  kill and who answered it (the dead process: must be none).

Nothing here asserts; tests/test_api_failover.py runs it small and checks the promises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from sqlmodel import col

from bench.front import api_front
from bench.heartbeat_load import LoadRequest
from bench.heartbeats import Phase, api_ready, count_lost, process_cpu, register_workers, run_load
from bench.postgres import running_postgres
from gpuprov.cli.dev import free_port
from gpuprov.engine.worker import open_records
from gpuprov.store.db import WorkerRecord


@dataclass
class ApiFailoverRun:
    agents: int
    interval: float
    seconds: float
    kill_at: float
    load: Phase | None = None
    lost_workers: int | None = None  # the sweep's count after the load: must be 0
    unheard_since_kill: int | None = None  # workers with no heartbeat after the kill: 0
    worker_rows: int | None = None  # must be `agents`
    after_kill: dict[str, int] = field(default_factory=dict)  # "answered by survivor", ...
    before_kill: dict[str, int] = field(default_factory=dict)  # answered by each, before
    error: str | None = None

    @property
    def held(self) -> bool:
        """Every promise of the scenario kept."""
        return (
            self.error is None
            and self.load is not None
            and self.load.ok == self.load.sent
            and not self.load.errors
            and self.lost_workers == 0
            and self.unheard_since_kill == 0
            and self.worker_rows == self.agents
            and self.after_kill.get("answered by the killed process", 0) == 0
            and self.after_kill.get("not answered 200", 0) == 0
        )


def _api_env(database_url: str, port: int, interval: float) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPUPROV")}
    return env | {
        "GPUPROV_DATABASE__URL": database_url,
        "GPUPROV_API__HOST": "127.0.0.1",
        "GPUPROV_API__PORT": str(port),
        "GPUPROV_WORKERS__HEARTBEAT_INTERVAL_SECONDS": str(interval),
        "GPUPROV_WORKERS__LOST_AFTER_SECONDS": str(3 * interval),
    }


def _tally(access_log: Path, killed_port: int, killed_at: float) -> tuple[dict, dict]:
    """(requests started after the kill by who answered, requests before it by process)."""
    after: Counter[str] = Counter()
    before: Counter[str] = Counter()
    killed = f"127.0.0.1:{killed_port}"
    for line in access_log.read_text().splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) < 4:
            continue
        ended, took, status, upstreams = float(parts[0]), float(parts[1]), parts[2], parts[3]
        answered_by = upstreams.replace(" : ", ", ").split(", ")[-1]
        if ended - took <= killed_at:
            before[answered_by] += 1
            continue
        after["started after the kill"] += 1
        if answered_by == killed:
            after["answered by the killed process"] += 1
        if status != "200":
            after["not answered 200"] += 1
    return dict(after), dict(before)


def _rows(database_url: str, killed_at: datetime) -> tuple[int, int]:
    """(worker rows, workers not seen since `killed_at`)."""
    records = open_records(database_url)
    count = sa.select(sa.func.count()).select_from(WorkerRecord)
    try:
        with records.db.engine.connect() as connection:
            rows = connection.execute(count).scalar_one()
            unheard = connection.execute(
                count.where(sa.or_(
                    col(WorkerRecord.last_seen_at).is_(None),
                    col(WorkerRecord.last_seen_at) <= killed_at,
                ))
            ).scalar_one()  # fmt: skip
    finally:
        records.db.dispose()
    return int(rows), int(unheard)


async def _killing(process: asyncio.subprocess.Process, after: float) -> tuple[float, datetime]:
    await asyncio.sleep(after)
    process.send_signal(signal.SIGKILL)
    return time.time(), datetime.now(UTC)


async def failover_on(
    database_url: str, agents: int, interval: float, seconds: float, kill_at: float
) -> ApiFailoverRun:
    run = ApiFailoverRun(agents=agents, interval=interval, seconds=seconds, kill_at=kill_at)
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-failover-") as directory:
        credentials = Path(directory) / "credentials"
        await asyncio.to_thread(register_workers, database_url, agents, credentials)
        ports = [free_port(), free_port()]
        apis = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuprov.cli.main",
                "api",
                env=_api_env(database_url, port, interval),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            for port in ports
        ]
        try:
            for port, api in zip(ports, apis, strict=True):
                await api_ready(f"http://127.0.0.1:{port}", api)
            with api_front(Path(directory) / "nginx", ports) as front:
                request = LoadRequest(
                    port=front.port,
                    credentials_file=str(credentials),
                    agents=agents,
                    interval=interval,
                    seconds=seconds,
                )
                survivor_cpu = process_cpu(apis[1].pid)
                killing = asyncio.create_task(_killing(apis[0], kill_at))
                result = await run_load(request)
                killed_at, killed_at_utc = await killing
                # the CPU is the survivor's: all of the load after the kill, half before it
                run.load = Phase.of(request, result, process_cpu(apis[1].pid) - survivor_cpu)
                run.after_kill, run.before_kill = _tally(front.access_log, ports[0], killed_at)
            run.lost_workers = await asyncio.to_thread(count_lost, database_url, 3 * interval)
            run.worker_rows, run.unheard_since_kill = await asyncio.to_thread(
                _rows, database_url, killed_at_utc
            )
        except (RuntimeError, TimeoutError, OSError) as error:
            run.error = str(error)
        finally:
            for api in apis:
                if api.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        api.terminate()
                await asyncio.wait_for(api.communicate(), 30)
    return run


async def api_failover(
    agents: int, interval: float, seconds: float, kill_at: float
) -> ApiFailoverRun:
    """The scenario on a throwaway PostgreSQL of its own."""
    try:
        with running_postgres() as database_url:
            return await failover_on(database_url, agents, interval, seconds, kill_at)
    except RuntimeError as error:  # no PostgreSQL here, or it would not start
        run = ApiFailoverRun(agents=agents, interval=interval, seconds=seconds, kill_at=kill_at)
        run.error = str(error)
        return run

"""Heartbeats at scale: N agents heartbeating against one API process.

- The API is `python -m gpuprov.cli.main api` itself, in its own process, on a fresh SQLite database
  (the embedded default) in a temp dir, listening on loopback, `[workers]
  heartbeat_interval_seconds` set to the scenario's interval.
- N workers are registered straight into that database beforehand, each with its credential
  (written to a 0600 file the load generator reads: never a command line).
- The load is bench/heartbeat_load.py in another process, one run per phase:
  1. floor: the same paced load on GET /v1/health (no credential, no database), each request
     on a new connection: what uvicorn and FastAPI cost per request on this machine;
  2. floor, kept connections: the same on connections kept open (what the agent does now);
  3. heartbeats paced on new connections: every agent once per interval, each request on a
     new connection (the agent before it kept its connection): the baseline;
  4. heartbeats paced on kept connections: the same load as the agent makes it now; then the
     liveness sweep's own query counts the workers it would take for lost (must be none);
  5. unpaced: BURST_AGENTS agents on kept connections, each sending its next heartbeat as soon
     as the last is answered: the most heartbeats per second the one process holds.
- The API process's CPU time (utime + stime of /proc/<pid>/stat) is read before and after each
  phase; the load generator's start-up falls in the phase but costs the API nothing. Its
  peak resident memory is read after phase 4, which held every agent's connection open.

Nothing here asserts; tests/test_bench.py runs the smallest sizes.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx

from bench.heartbeat_load import LoadRequest, LoadResult
from gpuprov.cli.dev import free_port
from gpuprov.engine.worker import open_records
from gpuprov.store.credentials import issue_worker_credential
from gpuprov.store.liveness import Liveness

BURST_AGENTS = 500  # concurrent agents of the unpaced phase: enough to keep one process busy
READY_TIMEOUT = 60.0


def _percentile(values: list[float], p: float) -> float | None:
    """Nearest rank, as bench/stats.py (which imports the scenarios: not importable here)."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class Phase:
    """One load run against the API: what it sent and got, and the API's CPU meanwhile."""

    agents: int
    interval: float | None  # None: unpaced
    sent: int
    ok: int
    errors: dict[str, int]
    seconds: float
    p50: float | None  # seconds, answered requests
    p99: float | None
    api_cpu: float  # seconds of the API process

    @classmethod
    def of(cls, request: LoadRequest, result: LoadResult, api_cpu: float) -> Phase:
        return cls(
            agents=request.agents,
            interval=request.interval,
            sent=result.sent,
            ok=result.ok,
            errors=result.errors,
            seconds=result.seconds,
            p50=_percentile(result.latencies, 50),
            p99=_percentile(result.latencies, 99),
            api_cpu=api_cpu,
        )

    @property
    def offered(self) -> float | None:
        """Requests per second the paced agents send."""
        return self.agents / self.interval if self.interval else None

    @property
    def rate(self) -> float:
        """Answered requests per second."""
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_request(self) -> float | None:
        """API CPU seconds per answered request."""
        return self.api_cpu / self.ok if self.ok else None

    @property
    def core_share(self) -> float:
        """The API's CPU time over the phase's wall time: 1.0 is one core, busy."""
        return self.api_cpu / self.seconds if self.seconds else 0.0

    @property
    def held(self) -> bool:
        """Every request answered, and (paced) each within its agent's interval."""
        within = self.interval is None or (self.p99 is not None and self.p99 < self.interval)
        return self.ok == self.sent and not self.errors and within


@dataclass
class HeartbeatRun:
    agents: int
    interval: float  # seconds between one agent's heartbeats
    seconds: float  # each paced phase
    burst_seconds: float
    floor: Phase | None = None
    floor_kept: Phase | None = None
    paced_new_connections: Phase | None = None
    paced: Phase | None = None  # on kept connections, as the agent sends them
    unpaced: Phase | None = None
    lost_workers: int | None = None  # taken for lost after the paced phase: must be 0
    api_peak_rss_mib: float | None = None  # after the phases with every agent's connection open
    error: str | None = None
    phases: list[str] = field(default_factory=list)


def process_cpu(pid: int) -> float:
    """utime + stime of a process, in seconds (Linux; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_resident_mib(pid: int) -> float | None:
    """VmHWM (peak resident memory) of a process in MiB (Linux; None elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def count_lost(database_url: str, lost_after: float) -> int:
    """What the liveness sweep would do now: the workers silent for longer than `lost_after`."""
    records = open_records(database_url)
    try:
        return len(Liveness(records.db).mark_lost(timedelta(seconds=lost_after)))
    finally:
        records.db.dispose()


def register_workers(database_url: str, agents: int, credentials_file: Path) -> None:
    records = open_records(database_url)
    credentials = []
    try:
        with records.db.session() as session:
            for index in range(agents):
                worker = records.register_worker(
                    session,
                    origin="existing",
                    provider=None,
                    region=None,
                    label=f"bench-{index}",
                    vm=None,
                    job=None,
                    capabilities={"gpu_runtime_ok": True},
                    state="idle",
                )
                credentials.append(issue_worker_credential(session, worker.id))
            session.commit()
    finally:
        records.db.dispose()
    descriptor = os.open(credentials_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write("\n".join(credentials) + "\n")


async def api_ready(url: str, process: asyncio.subprocess.Process) -> None:
    deadline = asyncio.get_running_loop().time() + READY_TIMEOUT
    async with httpx.AsyncClient() as http:
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"the API exited {process.returncode} before it answered")
            try:
                if (await http.get(f"{url}/v1/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the API did not answer within {READY_TIMEOUT:g}s")
            await asyncio.sleep(0.1)


async def run_load(request: LoadRequest) -> LoadResult:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.heartbeat_load",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(
        process.communicate(request.model_dump_json().encode()), request.seconds + 120
    )
    if process.returncode != 0:
        raise RuntimeError(f"load generator exited {process.returncode}: {stderr.decode()[-500:]}")
    return LoadResult.model_validate_json(stdout)


async def _phase(api_pid: int, request: LoadRequest) -> Phase:
    before = process_cpu(api_pid)
    result = await run_load(request)
    return Phase.of(request, result, process_cpu(api_pid) - before)


async def heartbeats(agents: int, interval: float, seconds: float, burst: float) -> HeartbeatRun:
    run = HeartbeatRun(agents=agents, interval=interval, seconds=seconds, burst_seconds=burst)
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-hb-") as directory:
        database_url = f"sqlite:///{directory}/gpuprov.db"
        credentials = Path(directory) / "credentials"
        await asyncio.to_thread(register_workers, database_url, agents, credentials)
        port = free_port()
        env = {name: value for name, value in os.environ.items() if not name.startswith("GPUPROV")}
        env |= {
            "GPUPROV_DATABASE__URL": database_url,
            "GPUPROV_API__HOST": "127.0.0.1",
            "GPUPROV_API__PORT": str(port),
            "GPUPROV_WORKERS__HEARTBEAT_INTERVAL_SECONDS": str(interval),
            "GPUPROV_WORKERS__LOST_AFTER_SECONDS": str(3 * interval),
        }
        api = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuprov.cli.main", "api",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            await api_ready(f"http://127.0.0.1:{port}", api)
            paced = {"port": port, "agents": agents, "interval": interval, "seconds": seconds}
            health = {"method": "GET", "path": "/v1/health", **paced}
            beats = {"credentials_file": str(credentials), **paced}
            run.floor = await _phase(api.pid, LoadRequest(keep_alive=False, **health))
            run.floor_kept = await _phase(api.pid, LoadRequest(**health))
            run.paced_new_connections = await _phase(
                api.pid, LoadRequest(keep_alive=False, **beats)
            )
            run.paced = await _phase(api.pid, LoadRequest(**beats))
            run.api_peak_rss_mib = peak_resident_mib(api.pid)
            run.lost_workers = await asyncio.to_thread(count_lost, database_url, 3 * interval)
            run.unpaced = await _phase(
                api.pid,
                LoadRequest(
                    port=port,
                    credentials_file=str(credentials),
                    agents=min(agents, BURST_AGENTS),
                    interval=None,
                    seconds=burst,
                ),
            )
        except (RuntimeError, TimeoutError) as error:
            run.error = str(error)
        finally:
            if api.returncode is None:
                api.terminate()
            with_stderr = await asyncio.wait_for(api.communicate(), 30)
            if run.error and with_stderr[1]:
                run.error += f" (API said: {with_stderr[1].decode()[-300:]})"
    return run

"""The fake cloud's simulated node agent: what a booted machine's agent would report, sent
through the real control-plane API with the real join token from the instance's bootstrap, then
heartbeats with the worker credential it got, as gpuprov.node's `run` does: at the interval the
API answers, until the credential is refused or the instance is deleted (the task cancelled).

It runs the node's work too (`run_work`), for real, the way the agent does: the assignment read
with the credential (GET /v1/work), its start reported, `setup` then `run` each with `/bin/sh -c`
in a process group of its own on this machine, the assignment's env added to a bare one (and
the work's mark, GPUPROV_WORK_ID), the output sent in chunks, a stop honoured (SIGTERM, the
grace period, SIGKILL), the end reported with the last lines. The end is the end of the main
process (setup, then run), not of its output: what it left running, in whatever session, is
killed then, found by the mark (gpuprov.node's sweep), and output still held open by something
that escaped it is not waited for. What it leaves out is surviving its own end: it lives in the
worker's process, so a killed worker ends its nodes' work with it, and a deleted instance kills
its work.
`[providers.fake] run_work = false` leaves the work rows to a test that plays the nodes itself.

It keeps the node's lease as gpuprov.node does (`Lease`; gpuprov/node/lease.py): each answered
heartbeat renews it for the answer's `lease_seconds`, counted from when that heartbeat was sent.
A node whose link is cut (`CutOff`, the fake cloud's `partitioned` effect) reaches the API no
more; the work it runs is stopped once the lease is over (SIGTERM, the grace period, SIGKILL)
and its end reported, marked `lease_lapsed`, if the API is ever reached again. With the work
run elsewhere, such a node still reads each assignment its heartbeats name
(`read_assignments`), so the fake cloud's ledger knows the work it holds and the grace it would
give it, and so when that work has stopped (`FakeCloudState.agent_leases`).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import logging
import os
import signal
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gpuprov.node.processes import WORK_MARK, sweep
from providers.fake.config import FakeInstanceType

log = logging.getLogger(__name__)

RUNTIME_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
RETRY_PAUSE = 1.0
MAX_TRIES = 30
MAX_WAIT = 300.0  # seconds: the longest Retry-After honoured
HEARTBEAT_INTERVAL = 30.0  # until the API says otherwise
WORK_POLL = 0.5  # seconds between reads of the assignment, at first
MAX_WORK_POLL = 5.0  # ... doubling while none comes (a lease's busy node asks rarely)
LONG_POLL = 25.0  # seconds the API may hold a reserved node's read of its work (work_waits.py)
TAIL_CHARS = 4000
DRAIN_SECONDS = 0.5  # once the main process has ended: how long its output may still arrive
EXIT_POLL = 0.05  # seconds between looks at whether the main process has exited
# What the simulated agent reports once a GPU fault shows (the real agent's words for them).
GPU_FAULT_DETAILS = {
    "gpu_lost": "GPU 0000:A8:00.0 is lost (fallen off the bus, Xid 79)",
    "ecc_error": "GPU 00000000:86:00.0: 1 uncorrectable ECC error(s) since the driver loaded "
    "(Xid 48)",
    "gpu_missing": "1 registered GPU(s) missing from nvidia-smi's list (7 of 8 listed)",
}


def simulated_capabilities(instance_type: FakeInstanceType, runtime_broken: bool) -> dict[str, Any]:
    """The capabilities body a real agent on `instance_type` would send, as the JSON the API
    validates (its WorkerCapabilities), the way the real agent builds it: a plain payload."""
    memory_mb = int(instance_type.gpu_memory_gb * 1024) if instance_type.gpu_memory_gb else None
    gpu = {"name": f"NVIDIA {instance_type.gpu}", "memory_mb": memory_mb}
    gpus = [{**gpu, "driver_version": "550.54.15"}] * (
        instance_type.gpu_count if instance_type.gpu else 0
    )
    return {
        "gpus": gpus,
        "driver_version": "550.54.15" if gpus else None,
        "cuda_version": "12.4" if gpus else None,
        "cpu_count": instance_type.vcpus,
        "memory_gb": instance_type.memory_gb,
        "disk_gb": instance_type.disk_gb,
        "gpu_runtime_ok": bool(gpus) and not runtime_broken,
        "gpu_runtime_error": RUNTIME_MISMATCH if runtime_broken else None,
        "agent_version": "fake-agent",
        "address": "127.0.0.1",  # every simulated node is on this machine
    }


async def register(api_url: str, token: str, capabilities: dict[str, Any]) -> str | None:
    """POST /v1/workers/register until accepted (the worker's credential) or refused for good
    (None).

    Any 4xx but 429 is final (a bad, used or expired token, or a job that refused the node:
    409); 5xx, 429 and connection errors are retried, never sooner than the answer's
    Retry-After, as gpuprov.node does: our own API's throttling is no failure of the node.
    """
    body = {"token": token, "capabilities": capabilities}
    async with httpx.AsyncClient(base_url=api_url, timeout=30, verify=_tls()) as http:
        for _ in range(MAX_TRIES):
            try:
                response = await http.post("/v1/workers/register", json=body)
            except httpx.HTTPError as error:
                log.info("fake agent: API unreachable (%s), retrying", error)
            else:
                if response.status_code == 200:
                    return str(response.json()["credential"])
                if _final(response):
                    log.warning("fake agent: registration refused: %s", response.text)
                    return None
                await asyncio.sleep(_pause(response))
                continue
            await asyncio.sleep(RETRY_PAUSE)
    return None


def _final(response: httpx.Response) -> bool:
    """A refusal that asking again cannot change (a 4xx other than 429)."""
    return response.status_code < 500 and response.status_code != 429


def _pause(response: httpx.Response) -> float:
    """Seconds before asking again: the answer's Retry-After where it names one."""
    try:
        return max(RETRY_PAUSE, min(float(response.headers.get("Retry-After", "")), MAX_WAIT))
    except ValueError:
        return RETRY_PAUSE


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context, built once: each client or transport built without one
    loads the CA bundle anew (tens of ms of CPU), and a region's machines all start their
    agents on the worker's event loop at once."""
    return httpx.create_ssl_context()


class CutOff(httpx.AsyncBaseTransport):
    """The node's link to the API, cut for good once `cut_off()` says so (None: never): from
    then on nothing the agent sends arrives, as a cut cable looks to it (a connection error)."""

    def __init__(self, cut_off: Callable[[], bool] | None = None) -> None:
        self.cut_off = cut_off
        self._through = httpx.AsyncHTTPTransport(verify=_tls())

    def cut(self) -> bool:
        return self.cut_off is not None and self.cut_off()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.cut():
            raise httpx.ConnectError("cut off from the API", request=request)
        response = await self._through.handle_async_request(request)
        if request.method == "GET" and self.cut():  # a long poll held across the cut
            await response.aclose()
            raise httpx.ConnectError("cut off from the API", request=request)
        return response

    async def aclose(self) -> None:
        await self._through.aclose()


class Lease:
    """The node's lease, as gpuprov/node/lease.py keeps it but in wall-clock time (the fake
    cloud's ledger keeps it across worker processes): renewed by each answered heartbeat for the
    `lease_seconds` its answer grants, counted from when that heartbeat was sent. `keep` is told
    every renewal (sent_at, seconds or None for no lease)."""

    def __init__(
        self,
        sent_at: float | None = None,
        seconds: float | None = None,
        keep: Callable[[float, float | None], None] | None = None,
    ) -> None:
        self.sent_at, self.seconds, self.keep = sent_at, seconds, keep

    def renew(self, sent_at: float, seconds: object) -> None:
        """A heartbeat sent at `sent_at` was answered, granting `seconds` (None, not a number
        or not positive: no lease)."""
        number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
        granted = float(seconds) if number else 0.0  # type: ignore[arg-type]
        self.sent_at, self.seconds = sent_at, granted if granted > 0 else None
        if self.keep is not None:
            self.keep(sent_at, self.seconds)

    @property
    def until(self) -> float | None:
        """When it lapses (None: no lease granted yet)."""
        return None if self.sent_at is None or self.seconds is None else self.sent_at + self.seconds

    def lapsed(self) -> bool:
        until = self.until
        return until is not None and time.time() >= until


class Watch:
    """What the last heartbeat's answer said: whether the worker may have work (reserved or
    busy), so an idle node does not keep asking for it."""

    def __init__(self) -> None:
        self.active = False
        self.named: str | None = None  # the work the last answer named

    def heard(self, answer: dict[str, Any]) -> None:
        self.active = answer.get("state") in ("reserved", "busy") or bool(answer.get("work_id"))
        self.named = answer.get("work_id")


async def heartbeat(
    api_url: str,
    credential: str,
    health: Callable[[], tuple[bool, str | None]],
    watch: Watch | None = None,
    *,
    lease: Lease | None = None,
    cut_off: Callable[[], bool] | None = None,
) -> None:
    """Heartbeat with `health()` (healthy, detail) until the credential is refused (401); each
    answer renews `lease` and goes to `watch`. Once `cut_off()`, none arrives (`CutOff`)."""
    interval = HEARTBEAT_INTERVAL
    headers = {"Authorization": f"Bearer {credential}"}
    link = CutOff(cut_off)
    async with httpx.AsyncClient(
        base_url=api_url, timeout=30, headers=headers, transport=link
    ) as http:
        while True:
            healthy, detail = health()
            sent_at = time.time()
            try:
                response = await http.post(
                    "/v1/workers/heartbeat", json={"healthy": healthy, "detail": detail}
                )
            except httpx.HTTPError as error:
                if not link.cut():  # a cut-off node tries on, unheard: no line each time
                    log.info("fake agent: heartbeat failed (%s), retrying", error)
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if response.status_code == 401:
                return  # revoked: the real agent exits here
            if response.status_code == 200:
                answer = response.json()
                interval = float(answer.get("interval_seconds", interval))
                if lease is not None:
                    lease.renew(sent_at, answer.get("lease_seconds"))
                if watch is not None:
                    watch.heard(answer)
            await asyncio.sleep(interval)


async def read_assignments(
    api_url: str,
    credential: str,
    watch: Watch,
    hold: Callable[[str, float], None],
    *,
    cut_off: Callable[[], bool] | None = None,
) -> None:
    """With the work run elsewhere (`run_work = false`): each assignment the heartbeats name
    is read once, as the agent reads it before starting it, and `hold` is told its id and its
    stop grace period, until the task is cancelled."""
    headers = {"Authorization": f"Bearer {credential}"}
    async with httpx.AsyncClient(
        base_url=api_url, timeout=30, headers=headers, transport=CutOff(cut_off)
    ) as http:
        held: str | None = None
        while True:
            if watch.named is not None and watch.named != held:
                assignment = await _call(http, "GET", "/v1/work", retry=False)
                if isinstance(assignment, dict) and assignment.get("id") == watch.named:
                    held = watch.named
                    hold(held, float(assignment.get("stop_grace_seconds", 30)))
            await asyncio.sleep(WORK_POLL)


async def run_work(
    api_url: str,
    credential: str,
    watch: Watch,
    *,
    lease: Lease | None = None,
    cut_off: Callable[[], bool] | None = None,
    hold: Callable[[str, float], None] | None = None,
) -> None:
    """Each assignment this worker is given, run once, until the task is cancelled (the
    instance deleted, the credential refused): whatever still runs is killed then. The work is
    asked for only while the heartbeats say the worker is reserved or busy; none starts while
    `lease` is over, and one that runs is stopped once it is. `hold` is told each assignment
    taken (its id and stop grace period)."""
    headers = {"Authorization": f"Bearer {credential}"}
    async with httpx.AsyncClient(
        base_url=api_url, timeout=30, headers=headers, transport=CutOff(cut_off)
    ) as http:
        done: set[str] = set()
        pause = WORK_POLL
        while True:
            waiting = False
            if watch.named is not None and watch.named not in done:
                pause = WORK_POLL  # a heartbeat named work: ask at once
            elif not watch.active:
                await asyncio.sleep(WORK_POLL)
                continue
            else:
                waiting = True  # reserved with no work named: a long poll, as the agent does
            began = asyncio.get_running_loop().time()
            if waiting:
                assignment = await _call(http, "GET", f"/v1/work?wait={LONG_POLL:g}",
                                         retry=False, timeout=LONG_POLL + 10)  # fmt: skip
            else:
                assignment = await _call(http, "GET", "/v1/work", retry=False)
            held_long = asyncio.get_running_loop().time() - began >= LONG_POLL / 2
            if waiting and assignment == {} and held_long:
                continue  # the API held it: ask again at once
            # {} is "none yet": a reserved node can ask before its job has written the work.
            if isinstance(assignment, dict) and assignment and assignment["id"] not in done:
                if lease is not None and lease.lapsed():
                    await asyncio.sleep(pause)  # the real agent starts nothing then
                    continue
                done.add(assignment["id"])
                if hold is not None:
                    hold(assignment["id"], float(assignment.get("stop_grace_seconds", 30)))
                await _execute(http, assignment, lease)
                pause = WORK_POLL
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_WORK_POLL)


async def _call(http: httpx.AsyncClient, method: str, path: str, body: Any = None, *,
                retry: bool = True, timeout: float | None = None) -> Any:  # fmt: skip
    """The answer's JSON ({} for 204), or the refusal's status code (a 4xx); a connection error,
    5xx or 429 is retried (or, without `retry`, None)."""
    while True:
        try:
            extra = {"timeout": timeout} if timeout is not None else {}
            response = await http.request(method, path, json=body, **extra)
        except httpx.HTTPError as error:
            log.info("fake agent: %s %s failed (%s)", method, path, error)
        else:
            if response.status_code < 300:
                return response.json() if response.content else {}
            if _final(response):
                return response.status_code
            if retry:
                await asyncio.sleep(_pause(response))
                continue
        if not retry:
            return None
        await asyncio.sleep(RETRY_PAUSE)


async def _execute(
    http: httpx.AsyncClient, assignment: dict[str, Any], lease: Lease | None = None
) -> None:
    work = f"/v1/work/{assignment['id']}"
    if not isinstance(await _call(http, "POST", f"{work}/started", {}), dict):
        return  # refused: stopped or given up before it started
    command = assignment["command"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **command.get("env", {})}
    env[WORK_MARK] = assignment["id"]
    output = _Output(http, work)
    code = 0
    groups: list[int] = []
    stop = _Stop(lease)
    try:
        for script in (command.get("setup"), command.get("run")):
            if script and code == 0:
                process = await asyncio.create_subprocess_exec(
                    "/bin/sh", "-c", script, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                    start_new_session=True,
                )  # fmt: skip
                groups.append(process.pid)
                code = await _follow(http, assignment, process, output, stop)
    finally:  # the work's end, or cancelled (the machine is gone): all it started dies with it
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        await asyncio.to_thread(sweep, assignment["id"])
    await output.flush()
    body: dict[str, Any] = {"code": code, "tail": output.tail}
    if stop.lease_lapsed:
        body["lease_lapsed"] = True
    await _call(http, "POST", f"{work}/exit", body)


async def _follow(
    http: httpx.AsyncClient,
    assignment: dict[str, Any],
    process: asyncio.subprocess.Process,
    output: _Output,
    stop: _Stop,
) -> int:
    """Until the main process has exited: its output sent, and a stop asked for (or a lapsed
    lease) honoured. Its exit is its returncode, set as it is reaped: process.wait() also waits
    for its pipes to close, which a background process it left may never do. Then what it
    wrote is read for DRAIN_SECONDS at most."""
    readers = [
        asyncio.create_task(output.read(process.stdout, "stdout")),
        asyncio.create_task(output.read(process.stderr, "stderr")),
    ]
    loop = asyncio.get_running_loop()
    look_at = loop.time() + WORK_POLL
    while process.returncode is None:
        await asyncio.sleep(EXIT_POLL)
        if process.returncode is None and loop.time() >= look_at:
            look_at = loop.time() + WORK_POLL
            await output.flush(patient=False)  # never held up here: the stop must go on
            await _honour_stop(http, assignment, process, stop)
    _, unfinished = await asyncio.wait(readers, timeout=DRAIN_SECONDS)
    for reader in unfinished:
        reader.cancel()
    return process.returncode


@dataclass
class _Stop:
    """A work's stop: since when (loop time; None: not stopping), and whether the node's lease
    lapsing began it."""

    lease: Lease | None
    since: float | None = None
    lease_lapsed: bool = False

    def lapsed(self) -> bool:
        return self.lease is not None and self.lease.lapsed()


async def _honour_stop(
    http: httpx.AsyncClient,
    assignment: dict[str, Any],
    process: asyncio.subprocess.Process,
    stop: _Stop,
) -> None:
    """Stop the work (SIGTERM, then SIGKILL once the grace period has passed) when the node's
    lease is over, or when the assignment read again says to (asked to stop, or given up)."""
    lapsed = stop.lapsed()
    current = None if lapsed else await _call(http, "GET", "/v1/work", retry=False)
    asked = current == {} or (
        isinstance(current, dict)
        and (current.get("id") != assignment["id"] or current["state"] == "stop_requested")
    )
    grace = float(assignment.get("stop_grace_seconds", 30))
    now = asyncio.get_running_loop().time()
    with contextlib.suppress(ProcessLookupError):
        if (asked or lapsed) and stop.since is None:
            stop.since, stop.lease_lapsed = now, lapsed
            os.killpg(process.pid, signal.SIGTERM)
        if stop.since is not None and now - stop.since > grace:
            os.killpg(process.pid, signal.SIGKILL)


class _Output:
    """A work's output, sent in order one chunk at a time; its last characters kept."""

    def __init__(self, http: httpx.AsyncClient, work: str) -> None:
        self.http, self.path = http, f"{work}/logs"
        self.pending: list[tuple[str, str]] = []
        self.seq = 0
        self.tail = ""

    async def read(self, stream: asyncio.StreamReader | None, name: str) -> None:
        assert stream is not None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # never half a character
        while data := await stream.read(32 * 1024):
            self.pending.append((name, decoder.decode(data)))
        self.pending.append((name, decoder.decode(b"", final=True)))

    async def flush(self, patient: bool = True) -> None:
        """Send what is pending, in order; not `patient`: stop at the first chunk that does not
        get through (it goes first next time)."""
        while self.pending:
            name, text = self.pending[0]
            if text:
                body = {"seq": self.seq, "stream": name, "data": text}
                if await _call(self.http, "POST", self.path, body, retry=patient) is None:
                    return
                self.seq += 1
                self.tail = (self.tail + text)[-TAIL_CHARS:]
            self.pending.pop(0)

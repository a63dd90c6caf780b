"""await_registrations: a job waits here until each of its nodes' agents has registered.

Registration belongs to the API (gpuprov/api/app.py): it redeems the node's single-use join token
and records a worker row bound to the token's VM. Nothing a node says reaches the workflow
directly, and no Temporal Update is involved (a job of hundreds of nodes would run into the
server's limit of in-flight Updates per workflow): this heartbeating activity reads the rows the
API wrote and returns each VM's worker id and capabilities once every node has one. All waits
of a worker share one database read per interval (RegistrationBoard), as observe calls do.

The wait is bounded by the provider's boot timeout. A node that never registered is Failed for
the offer, unless the control plane itself was out during the wait (its health endpoint did not
answer ok, or the database could not be read): then the failure blocks nothing, because our
outage says nothing about the cloud's offer.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable

import httpx
from pydantic import Field
from sqlalchemy.exc import SQLAlchemyError
from temporalio import activity

from activities.errors import classified
from activities.heartbeat import Heartbeater
from gpuprov.models import WorkerCapabilities, WorkerRegistration
from gpuprov.store.records import Records
from providers.base import Model
from providers.errors import BlockScope, ErrorKind, ProviderError

READ_INTERVAL = 0.2  # seconds between the shared reads of the workers table (one per worker)
HEALTH_INTERVAL = 10.0  # seconds between probes of the API's health endpoint
HEALTH_TIMEOUT = 5.0


class AwaitInput(Model):
    vms: list[str] = Field(min_length=1)
    timeout_seconds: float = Field(gt=0)


class AwaitProgress(Model):
    """Heartbeat details: when the wait began (its deadline's origin), who has registered, and
    whether the control plane was seen out, so a retried attempt keeps all three."""

    started_at: float
    registered: list[str] = Field(default_factory=list)
    outage: str | None = None


class RegistrationBoard:
    """One read of the workers table per interval for every VM any wait is asking about.

    A waiter is only answered by a read that starts after it asked (a registration committed
    just before the question is always seen). Owned by one worker's activities.
    """

    def __init__(self, records: Records, interval: float = READ_INTERVAL) -> None:
        self._records = records
        self._interval = interval
        self._wanted: dict[str, int] = {}
        self._next: asyncio.Task[dict[str, WorkerRegistration]] | None = None
        self._last_start = float("-inf")

    async def read(self, vms: list[str]) -> dict[str, WorkerRegistration]:
        for vm in vms:
            self._wanted[vm] = self._wanted.get(vm, 0) + 1
        try:
            if self._next is None:
                self._next = asyncio.create_task(self._read_after_interval())
                self._next.add_done_callback(_retrieve)
            found = await asyncio.shield(self._next)
        finally:
            for vm in vms:
                self._wanted[vm] -= 1
                if not self._wanted[vm]:
                    del self._wanted[vm]
        return {vm: found[vm] for vm in vms if vm in found}

    async def _read_after_interval(self) -> dict[str, WorkerRegistration]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._last_start + self._interval - loop.time()))
        self._next = None  # from now on, newcomers need a read that starts after them
        self._last_start = loop.time()
        rows = await asyncio.to_thread(self._records.workers_of_vms, sorted(self._wanted))
        return {
            vm: WorkerRegistration(
                vm=vm,
                worker_id=row.id,
                capabilities=WorkerCapabilities.model_validate(row.capabilities),
            )
            for vm, row in rows.items()
        }


class ControlPlaneProbe:
    """Whether the API answers its health endpoint with ok; asked at most once per interval
    by all waits of a worker (the answer is shared). `ca_pem`: the private CA the nodes pin for
    an https API (`[api] ca_file`), trusted here too."""

    def __init__(
        self, api_url: str, interval: float = HEALTH_INTERVAL, ca_pem: str | None = None
    ) -> None:
        self._api_url = api_url
        self._interval = interval
        self._verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cadata=ca_pem) if ca_pem else True
        )
        self._checked_at = float("-inf")
        self._outage: str | None = None
        self._lock = asyncio.Lock()

    async def outage(self) -> str | None:
        """None when the API answered ok lately; else what went wrong."""
        async with self._lock:
            now = time.monotonic()
            if now - self._checked_at >= self._interval:
                self._outage = await self._probe()
                self._checked_at = time.monotonic()
            return self._outage

    async def _probe(self) -> str | None:
        try:
            async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT, verify=self._verify) as http:
                response = await http.get(f"{self._api_url.rstrip('/')}/v1/health")
        except httpx.HTTPError as error:
            return f"the control-plane API at {self._api_url} did not answer: {error!r}"
        if response.status_code != 200:
            return f"the control-plane API answered {response.status_code} to its health check"
        return None


class RegistrationActivities:
    def __init__(
        self,
        records: Records,
        api_url: str,
        *,
        read_interval: float = READ_INTERVAL,
        probe: Callable[[], Awaitable[str | None]] | None = None,
        api_ca_pem: str | None = None,
    ) -> None:
        self._board = RegistrationBoard(records, read_interval)
        self._outage = probe or ControlPlaneProbe(api_url, ca_pem=api_ca_pem).outage
        self._read_interval = read_interval

    def all(self) -> list[object]:
        return [self.await_registrations]

    @activity.defn(name="await_registrations")
    async def await_registrations(self, request: AwaitInput) -> list[WorkerRegistration]:
        progress = Heartbeater.resume(AwaitProgress, AwaitProgress(started_at=time.time()))
        deadline = progress.started_at + request.timeout_seconds
        with classified():
            async with Heartbeater(progress, beat_at_start=False) as heartbeat:
                while True:
                    found, outage = await self._look(request.vms)
                    registered = sorted(found)
                    progress = progress.model_copy(
                        update={"registered": registered, "outage": progress.outage or outage}
                    )
                    heartbeat.note(progress)
                    if len(found) == len(request.vms):
                        return [found[vm] for vm in request.vms]
                    if time.time() >= deadline:
                        raise _not_registered(request, found, progress.outage)
                    await asyncio.sleep(self._read_interval)

    async def _look(self, vms: list[str]) -> tuple[dict[str, WorkerRegistration], str | None]:
        """What has registered, and the control plane's outage if one is visible now."""
        try:
            found = await self._board.read(vms)
        except SQLAlchemyError as error:
            return {}, f"the database could not be read: {type(error).__name__}"
        outage = None if len(found) == len(vms) else await self._outage()
        return found, outage


def _not_registered(
    request: AwaitInput, found: dict[str, WorkerRegistration], outage: str | None
) -> ProviderError:
    missing = ", ".join(vm for vm in request.vms if vm not in found)
    message = f"{missing} did not register within {request.timeout_seconds:g}s"
    if outage is None:
        return ProviderError(ErrorKind.FAILED, message)
    return ProviderError(
        ErrorKind.FAILED,
        f"{message}; the control plane was out meanwhile ({outage}), so no offer is blocked",
        block_scope=BlockScope.NONE,
    )


def _retrieve(task: asyncio.Task[object]) -> None:
    if not task.cancelled():
        task.exception()

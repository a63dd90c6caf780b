"""Long polls for a node's work: `GET /v1/work?wait=S` held until the worker's work exists or
`S` seconds pass, so a reserved node hears of its work at once and asks nothing meanwhile.

One watcher per API process serves every waiting request: while any waits, it reads the
assignments written lately (one indexed query every WATCH_EVERY seconds, however many nodes
wait) and wakes the requests of the workers named there. A woken request reads its own work
again (`WorkRecords.for_worker`, the one authority), so a wake for another run's row, or one
the watcher missed, costs nothing: the request reads its work once more when its wait ends.
The watcher looks back LOOKBACK seconds, so a row stamped by a worker whose clock is somewhat
behind this process's is still seen. It stops when nobody waits.

A process holds at most MAX_WAITERS waits; one more is answered 429 with Retry-After (the agent
backs off). `close()` (the API shutting down) ends every wait at once, so a long poll never
holds up a shutdown; `reopen()` takes waits again when the same app is served once more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from fastapi import HTTPException

from gpuprov.store.db import WorkRecord, utcnow
from gpuprov.store.work import WorkRecords

log = logging.getLogger(__name__)

MAX_WAIT = 30.0  # seconds a request may ask to be held
WATCH_EVERY = 0.2  # seconds between the watcher's reads while requests wait
LOOKBACK = 60.0  # seconds of assignments the watcher reads back
MAX_WAITERS = 20_000
BUSY_RETRY_AFTER = 5


class Waiter:
    def __init__(self) -> None:
        self.woken = asyncio.Event()
        self.seen: set[str] = set()  # work ids that woke it and were not its work


class WorkWaits:
    def __init__(
        self,
        work: WorkRecords,
        *,
        every: float = WATCH_EVERY,
        lookback: float = LOOKBACK,
        max_waiters: int = MAX_WAITERS,
    ) -> None:
        self.work = work
        self.every = every
        self.lookback = timedelta(seconds=lookback)
        self.max_waiters = max_waiters
        self._waiting: dict[str, set[Waiter]] = {}
        self._count = 0
        self._watcher: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    @property
    def waiting(self) -> int:
        return self._count

    async def until_assigned(self, worker_id: str, wait: float) -> WorkRecord | None:
        """The worker's work once it exists, or None after `wait` seconds (or at close)."""
        if self._count >= self.max_waiters:
            raise HTTPException(
                429, "too many nodes wait for work here now; try again later",
                headers={"Retry-After": str(BUSY_RETRY_AFTER)},
            )  # fmt: skip
        waiter = Waiter()
        self._waiting.setdefault(worker_id, set()).add(waiter)
        self._count += 1
        self._ensure_watcher()
        deadline = asyncio.get_running_loop().time() + wait
        try:
            while not self._closed.is_set():
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await waiter.woken.wait()
                if not waiter.woken.is_set():
                    break
                waiter.woken.clear()
                row = await asyncio.to_thread(self.work.for_worker, worker_id)
                if row is not None:
                    return row
        finally:
            waiters = self._waiting.get(worker_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiting[worker_id]
            self._count -= 1
        # The wait is over: one last read, for a row the watcher did not name in time.
        return await asyncio.to_thread(self.work.for_worker, worker_id)

    def reopen(self) -> None:
        """Take waits again (the API serving once more after a close)."""
        self._closed = asyncio.Event()

    def close(self) -> None:
        """End every wait now, and every later one at once."""
        self._closed.set()
        for waiters in self._waiting.values():
            for waiter in waiters:
                waiter.woken.set()

    def _ensure_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch(), name="work-waits")

    async def _watch(self) -> None:
        while self._waiting and not self._closed.is_set():
            try:
                since = utcnow() - self.lookback
                assigned = await asyncio.to_thread(self.work.assigned_since, since)
            except Exception as error:  # the database away: the waits end by their deadline
                log.warning("reading the latest assignments failed: %s", error)
                assigned = []
            for worker_id, work_id in assigned:
                for waiter in self._waiting.get(worker_id, ()):
                    if work_id not in waiter.seen:
                        waiter.seen.add(work_id)
                        waiter.woken.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.every):
                    await self._closed.wait()

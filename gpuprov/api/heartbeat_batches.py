"""Group commit for heartbeats: the API process writes the heartbeats that come in together in
one transaction (gpuprov/store/liveness.py `heartbeats`), one thread hop and one commit for
all of them, instead of a credential read, a write and a commit for each.

The first heartbeat to arrive opens a batch; the batch is written BATCH_WINDOW later with
every heartbeat that came in meanwhile (and those that come during a write go in the next), so
a batch grows with the load: 10,000 nodes every 30 s are about 17 heartbeats a batch. The
window is a heartbeat's only added wait, nothing beside an interval of seconds. Each request
waits for the commit of its own batch before it is answered: a heartbeat is
acknowledged only once it is recorded, so a worker is taken for lost only after `lost_after`
with no acknowledged heartbeat, as before. A failed batch fails each of its requests (503
while the database is unavailable, as for any route) and the agents send again.

One per app (app.state.heartbeats), on the event loop that serves it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from gpuprov.store.liveness import Beat, Heartbeat, Liveness

MAX_BATCH = 500  # heartbeats in one transaction: a commit stays short under any backlog
BATCH_WINDOW = 0.05  # seconds a batch stays open for more heartbeats


class HeartbeatBatches:
    def __init__(
        self, liveness: Liveness, holds_work_for: timedelta, window: float = BATCH_WINDOW
    ) -> None:
        self._liveness = liveness
        self._holds_work_for = holds_work_for
        self._window = window
        self._waiting: list[tuple[Heartbeat, asyncio.Future[Beat | None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def beat(self, heartbeat: Heartbeat) -> Beat | None:
        """Record `heartbeat` with the others in flight; its Beat once committed, or None
        when its credential is not a live worker's (nothing written for it)."""
        future: asyncio.Future[Beat | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((heartbeat, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        # A client that hangs up does not take the beat out of its batch: it is recorded.
        return await asyncio.shield(future)

    async def _write(self) -> None:
        while self._waiting:
            await asyncio.sleep(self._window)
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                answers = await asyncio.to_thread(
                    self._liveness.heartbeats,
                    [heartbeat for heartbeat, _ in batch],
                    holds_work_for=self._holds_work_for,
                )
            except Exception as error:  # each request answers it (503, 500): none is lost
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), answer in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(answer)

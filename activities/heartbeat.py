"""Heartbeats as a context manager, with typed progress that a retried attempt resumes from."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from types import TracebackType
from typing import Generic, TypeVar

from pydantic import BaseModel
from temporalio import activity

ProgressT = TypeVar("ProgressT", bound=BaseModel)

DEFAULT_INTERVAL = 5.0


class Heartbeater(Generic[ProgressT]):
    """Beats in the background at a third of the heartbeat timeout with the latest progress.

    `Heartbeater.resume(Progress, default)` returns the details saved by a previous attempt of
    this activity (another worker, after a crash), so a wait keeps its original deadline.
    """

    def __init__(self, progress: ProgressT, *, beat_at_start: bool = True) -> None:
        self.progress = progress
        # False: the first beat waits one interval, so a call that ends quickly sends none
        # (the heartbeat timeout runs from the activity's start either way).
        self._beat_at_start = beat_at_start
        timeout = activity.info().heartbeat_timeout
        self._interval = (
            timeout.total_seconds() / 3 if isinstance(timeout, timedelta) else DEFAULT_INTERVAL
        )
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def resume(model: type[ProgressT], default: ProgressT) -> ProgressT:
        details = activity.info().heartbeat_details
        if details:
            try:
                return model.model_validate(details[0])
            except ValueError:
                return default
        return default

    def update(self, progress: ProgressT) -> None:
        self.progress = progress
        activity.heartbeat(progress.model_dump(mode="json"))

    def note(self, progress: ProgressT) -> None:
        """The progress the next background beat sends, with no beat of its own: every beat
        is a write of the workflow's state on the server, and a cloud wait that ends within
        one interval needs none (each beat is a server-side write)."""
        self.progress = progress

    async def _beat(self) -> None:
        if not self._beat_at_start:
            await asyncio.sleep(self._interval)
        while True:
            activity.heartbeat(self.progress.model_dump(mode="json"))
            await asyncio.sleep(self._interval)

    async def __aenter__(self) -> Heartbeater[ProgressT]:
        self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

"""A LIFO stack of compensations that finishes even when the workflow is cancelled.

Steps are pushed *before* the forward step they undo starts (a create may land even if its
response is lost), and popped as they run, so an unwind interrupted by a crash never repeats a
finished step. Steps of one group on top of the stack (the nodes of one attempt) run at once:
a 256-node job is torn down in a few rounds, not one node after another.
`unwind_surviving_cancellation` runs the unwind in its own task behind `asyncio.shield`: a
cancel that arrives meanwhile waits for the unwind to finish, then propagates (a cancelled
workflow still gets every activity it schedules from that task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from activities.errors import StepFailure


@dataclass
class Compensation:
    name: str
    run: Callable[[], Awaitable[None]]
    # Compensations of one group that lie together on top of the stack undo independent things
    # (the nodes of one attempt): they run at once, at most MAX_AT_ONCE together.
    group: str | None = None


MAX_AT_ONCE = 32


class CompensationStack:
    def __init__(self) -> None:
        self._entries: list[Compensation] = []

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, compensation: Compensation) -> None:
        self._entries.append(compensation)

    def discard(self) -> None:
        """Forget every step (release=keep: the machines outlive the job on purpose)."""
        self._entries.clear()

    async def unwind(self, on_failure: Callable[[Compensation, StepFailure], None]) -> None:
        while self._entries:
            batch = [self._entries.pop()]
            group = batch[0].group
            while group is not None and self._entries and self._entries[-1].group == group:
                batch.append(self._entries.pop())
            gate = asyncio.Semaphore(MAX_AT_ONCE)
            await asyncio.gather(*(_undo(entry, gate, on_failure) for entry in batch))


async def _undo(
    entry: Compensation,
    gate: asyncio.Semaphore,
    on_failure: Callable[[Compensation, StepFailure], None],
) -> None:
    async with gate:
        try:
            await entry.run()
        except StepFailure as failure:
            on_failure(entry, failure)


async def unwind_surviving_cancellation(
    stack: CompensationStack, on_failure: Callable[[Compensation, StepFailure], None]
) -> None:
    task = asyncio.create_task(stack.unwind(on_failure))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise

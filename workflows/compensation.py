"""A LIFO stack of compensations that finishes even when the workflow is cancelled.

Steps are pushed *before* the forward step they undo starts (a create may land even if its
response is lost), and popped as they run, so an unwind interrupted by a crash never repeats a
finished step. `unwind_surviving_cancellation` uses the pattern verified in
shared/reference/temporal.md: the unwind runs in its own task; a cancel that arrives meanwhile
waits for it to finish, then propagates.
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
    # Terminates instances; skipped when the policy says nothing was created and no create
    # reported an id (`has_instances`).
    terminates: bool = False
    has_instances: Callable[[], bool] = lambda: False


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

    async def unwind(
        self, *, teardown: bool, on_failure: Callable[[Compensation, StepFailure], None]
    ) -> None:
        while self._entries:
            entry = self._entries.pop()
            if entry.terminates and not teardown and not entry.has_instances():
                continue
            try:
                await entry.run()
            except StepFailure as failure:
                on_failure(entry, failure)


async def unwind_surviving_cancellation(
    stack: CompensationStack,
    *,
    teardown: bool,
    on_failure: Callable[[Compensation, StepFailure], None],
) -> None:
    task = asyncio.create_task(stack.unwind(teardown=teardown, on_failure=on_failure))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise

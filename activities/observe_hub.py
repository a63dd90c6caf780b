"""Shared observe calls: every job waiting in one (provider, region) shares one list call per
poll interval inside a worker, so the call rate stays flat as the number of jobs grows.

Freshness rule: a waiter is only ever answered by a list call that STARTS after it asked, so a
stale read can never end a wait early (an instance created or deleted just before the question
is always seen as it is now). New waiters join the next scheduled call while it has not started;
calls for a region start at least `interval` apart. Providers that cannot list a region by
identity (observe_region returns None) are observed per VM, as before.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from providers.base import CloudProvider, Location, Observed

RegionKey = tuple[str, str]


@dataclass
class _RegionPoller:
    provider: CloudProvider
    location: Location
    interval: float
    last_start: float = float("-inf")
    pending: asyncio.Task[dict[str, list[Observed]] | None] | None = None

    async def read(self) -> dict[str, list[Observed]] | None:
        if self.pending is None:
            loop = asyncio.get_running_loop()
            start_at = max(loop.time(), self.last_start + self.interval)
            self.pending = asyncio.create_task(self._list_at(start_at))
            # Every waiter may give up (activities cancelled) before the call finishes: its
            # outcome is then nobody's, so retrieve it here rather than log it as unhandled.
            self.pending.add_done_callback(_retrieve)
        # shield: one waiter giving up (its activity cancelled) must not cancel the others' call
        return await asyncio.shield(self.pending)

    async def _list_at(self, start_at: float) -> dict[str, list[Observed]] | None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, start_at - loop.time()))
        self.pending = None  # from now on, newcomers need a call that starts after them
        self.last_start = loop.time()
        return await self.provider.observe_region(self.location)


def _retrieve(task: asyncio.Task[object]) -> None:
    if not task.cancelled():
        task.exception()


class ObserveHub:
    """Owned by one CloudActivities (one worker); no global state."""

    def __init__(self) -> None:
        self._pollers: dict[RegionKey, _RegionPoller] = {}
        self._per_vm_only: set[str] = set()

    async def observe(
        self, provider: CloudProvider, location: Location, vm: str, interval: float
    ) -> list[Observed]:
        if provider.name in self._per_vm_only:
            return await provider.observe(location, vm)
        key = (provider.name, location.region)
        poller = self._pollers.get(key)
        if poller is None or poller.interval != interval:
            region = Location(provider=location.provider, region=location.region)
            poller = self._pollers[key] = _RegionPoller(provider, region, interval)
        listing = await poller.read()
        if listing is None:
            self._per_vm_only.add(provider.name)
            return await provider.observe(location, vm)
        return listing.get(vm, [])

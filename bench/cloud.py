"""A FakeCloud that timestamps every call (bench only): the failover clock reads this trace."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuprov.config import FakeProviderConfig
from providers.base import InstanceSpec, Location, Observed, Offer, ResourceRequest
from providers.errors import ProviderError
from providers.fake import FakeCloud

T = TypeVar("T")


@dataclass(frozen=True)
class CallRecord:
    """One provider call as the cloud saw it: wall-clock start and end, and its error kind."""

    primitive: str
    region: str
    vm: str | None
    started: float
    ended: float
    error: str | None = None  # ErrorKind value when the call raised ProviderError


class TimedCloud(FakeCloud):
    """FakeCloud plus an in-memory call trace (when `trace`). Only the public primitives are
    wrapped, so the fake's behaviour, its latencies and its ledger (call_counts) are unchanged."""

    def __init__(self, config: FakeProviderConfig, *, trace: bool = False) -> None:
        super().__init__(config)
        self.trace = trace
        self.calls: list[CallRecord] = []

    async def _timed(self, primitive: str, region: str, vm: str | None, call: Awaitable[T]) -> T:
        if not self.trace:
            return await call
        started = time.time()
        error: str | None = None
        try:
            return await call
        except ProviderError as failure:
            error = failure.kind.value
            raise
        finally:
            self.calls.append(CallRecord(primitive, region, vm, started, time.time(), error))

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        return await self._timed("plan", "*", None, super().plan(request))

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        return await self._timed("prepare", offer.region, spec.vm, super().prepare(offer, spec))

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        call = super().create(offer, prepared, spec)
        return await self._timed("create", offer.region, spec.vm, call)

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        return await self._timed("observe", location.region, vm, super().observe(location, vm))

    async def observe_region(self, location: Location) -> dict[str, list[Observed]] | None:
        # Present once observe coalescing has landed (the region-wide "list" call).
        return await self._timed("list", location.region, None, super().observe_region(location))

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        await self._timed("delete", location.region, vm, super().delete(location, vm, ids))

    async def cleanup(self, location: Location, vm: str) -> None:
        await self._timed("cleanup", location.region, vm, super().cleanup(location, vm))

"""Fenced cloud calls, on the activity side of gpuprov/store/fences.py.

- `CallFence.holding(vm, step)`: around a prepare or create. It claims the VM identity first:
  refused (Failed, blocking nothing) once the identity's teardown has begun; waits while an
  earlier attempt's call may still land (a retry scheduled after a worker stopped heartbeating,
  or a worker that was only slow); holds the claim for the call's whole length, renewing it,
  and lets it go once the cloud has answered. A call interrupted without a clear answer (a
  cancel, a crash, a timeout, a Transient error) keeps its claim until it lapses, because its
  request may still land.
- `CallFence.raise_fence(vm)`: the first thing a teardown does. Every later claim is refused;
  it then waits while an earlier claim is live, so the delete that follows sees whatever that
  call made.
A lapsed claim (its worker died) frees the identity within `CLAIM_LEASE`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.errors import to_application_error
from gpuprov.store.db import utcnow
from gpuprov.store.fences import ClaimOutcome, VmFences
from providers.errors import BlockScope, ErrorKind, ProviderError

# A claim lapses this long after its last renewal: how long a dead worker's call blocks the
# identity, and how long a request that got no answer is given to land before anyone looks.
CLAIM_LEASE = timedelta(seconds=15)
RENEW_EVERY = CLAIM_LEASE.total_seconds() / 3
RECHECK_SECONDS = 1.0


def call_owner() -> str:
    """One activity attempt: a retry is another owner, and waits for the first to finish."""
    info = activity.info()
    return f"{info.workflow_run_id}/{info.activity_id}/{info.attempt}"


class CallFence:
    """Without a database (`fences` None) there is nothing to fence against: calls go ahead."""

    def __init__(self, fences: VmFences | None) -> None:
        self._fences = fences

    @contextlib.asynccontextmanager
    async def holding(self, vm: str, step: str) -> AsyncIterator[None]:
        if self._fences is None:
            yield
            return
        fences, owner = self._fences, call_owner()
        await self._claim(fences, vm, owner, step)
        renewing = asyncio.create_task(_renew(fences, vm, owner))
        answered = False
        try:
            yield
            answered = True
        except ApplicationError as error:
            # A classified refusal is the cloud's answer; a retryable (Transient) one may be a
            # request that landed all the same.
            answered = error.non_retryable
            raise
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            if answered:
                await asyncio.to_thread(fences.release, vm, owner)

    async def raise_fence(self, vm: str) -> bool:
        """Fence the identity, then wait out any live claim; True when it had to wait."""
        if self._fences is None:
            return False
        waited = False
        until = await asyncio.to_thread(self._fences.fence, vm)
        while until is not None:
            waited = True
            activity.logger.info("teardown of %s waits for a call in flight until %s", vm, until)
            await asyncio.sleep(RECHECK_SECONDS)
            until = await asyncio.to_thread(self._fences.in_flight_until, vm)
        return waited

    async def _claim(self, fences: VmFences, vm: str, owner: str, step: str) -> None:
        while True:
            claim = await asyncio.to_thread(fences.claim, vm, owner, utcnow() + CLAIM_LEASE)
            if claim.outcome is ClaimOutcome.CLAIMED:
                return
            if claim.outcome is ClaimOutcome.FENCED:
                refused = ProviderError(
                    ErrorKind.FAILED,
                    f"{step} of {vm} refused: its teardown has begun, so nothing is made for "
                    "it again",
                    block_scope=BlockScope.NONE,
                )
                raise to_application_error(refused, step)
            activity.logger.info(
                "%s of %s waits for an earlier call until %s", step, vm, claim.until
            )
            await asyncio.sleep(RECHECK_SECONDS)


async def _renew(fences: VmFences, vm: str, owner: str) -> None:
    while True:
        await asyncio.sleep(RENEW_EVERY)
        with contextlib.suppress(Exception):  # a missed renewal only lets the claim lapse early
            await asyncio.to_thread(fences.renew, vm, owner, utcnow() + CLAIM_LEASE)

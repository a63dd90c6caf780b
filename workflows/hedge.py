"""Hedged attempts (`placement.hedge`): a backup attempt on the next offer while the leading
one is slower than usual, for the tail of time to ready ("The Tail at Scale").

`race` keeps up to `max_parallel` attempts alive: the leading one starts at once; while no
attempt has made every node ready `after_seconds` after the latest start (`auto`: the leading
offering's p95 time to ready, workflows/selection.py `hedge_delay`), the next offer's attempt
starts beside it, as long as the losers' spend so far is under `max_extra_cost`. The first
attempt whose every node is ready wins; every other is cancelled and torn down through its own
compensation (its offer is not blocked: it did not fail). A failed attempt fails over as in a
plain job. A cancel or the provisioning deadline cancels every attempt alive and waits for
each one's teardown before it propagates, so a race never leaves a machine behind.
Deterministic only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from gpuprov.models import Attempt, AttemptOutcome, Hedge
    from gpuprov.store.costs import billed_seconds
    from providers.base import Billing, Offer, PriceQuote
    from workflows.compensation import CompensationStack


@dataclass
class Runner:
    """One attempt in the race."""

    attempt: Attempt
    task: asyncio.Task[bool]
    stack: CompensationStack  # its compensations: the winner's become the job's


# What the race asks of the job's provisioning: the next offer to try (None: none left;
# `hedge`: it would run beside another, so an unpriced offer under a cost bound is passed over),
# and an attempt on it (True: every node ready).
NextOffer = Callable[[bool], Awaitable[Offer | None]]
StartAttempt = Callable[[Offer, bool], Runner]


def accrued(attempt: Attempt, nodes: int, now: datetime) -> float:
    """What an attempt has cost so far, in its quote's currency (0 without a price)."""
    price = attempt.offer.price
    if price is None or attempt.started_at is None:
        return 0.0
    return price.amount * nodes * (now - attempt.started_at).total_seconds() / 3600


def loser_cost(attempt: Attempt, nodes: int, billing: Billing) -> PriceQuote | None:
    """A losing attempt's cost: its quote x nodes x the time from its start to its teardown,
    rounded up by the provider's billing terms. None for an unpriced offer."""
    price = attempt.offer.price
    if price is None or attempt.started_at is None or attempt.ended_at is None:
        return None
    ran = attempt.ended_at - attempt.started_at
    billed = billed_seconds(ran, billing.granularity_seconds, billing.minimum_seconds)
    return PriceQuote(
        amount=round(price.amount * nodes * billed / 3600, 6),
        currency=price.currency,
        unit="total",
        source=f"{price.amount:g} {price.currency}/{price.unit} x {nodes} node(s) x {billed:g}s",
        observed_at=attempt.ended_at,
    )


def losers_spend(attempts: list[Attempt]) -> float:
    return sum(a.cost.amount for a in attempts if a.outcome is AttemptOutcome.LOST_RACE and a.cost)


class Race:
    def __init__(
        self,
        hedge: Hedge,
        nodes: int,
        attempts: list[Attempt],
        delay_for: Callable[[Offer], float],
        next_offer: NextOffer,
        start: StartAttempt,
        on_win: Callable[[Runner], None] | None = None,
    ) -> None:
        self.hedge = hedge
        self.nodes = nodes
        self.attempts = attempts  # the job's: losers' costs are read from it
        self.delay_for = delay_for
        self.next_offer = next_offer
        self.start = start
        # Told of the winner before the losers are stopped: a cancel or the deadline landing
        # while they are torn down must find the winner's compensations where the job unwinds.
        self.on_win = on_win
        self.alive: list[Runner] = []

    def budget_left(self, now: datetime) -> bool:
        if self.hedge.max_extra_cost is None:
            return True
        hedges = sum(accrued(r.attempt, self.nodes, now) for r in self.alive[1:] if r.attempt.hedge)
        return losers_spend(self.attempts) + hedges < self.hedge.max_extra_cost

    async def run(self) -> Runner | None:
        """The winner, its nodes ready and every loser torn down; None when every offer failed."""
        try:
            return await self._race()
        except BaseException:
            await self.stop(self.alive)
            raise

    async def _race(self) -> Runner | None:
        last_start: datetime | None = None
        hedges_left = True
        while True:
            if not self.alive:
                offer = await self.next_offer(False)
                if offer is None:
                    return None
                self.alive.append(self.start(offer, False))
                last_start = workflow.now()
            timeout: float | None = None
            if hedges_left and len(self.alive) < self.hedge.max_parallel and last_start:
                due = last_start + timedelta(seconds=self._delay(self.alive[0].attempt.offer))
                timeout = (due - workflow.now()).total_seconds()
            if timeout is not None and timeout <= 0:
                done: set[asyncio.Task[bool]] = set()
            else:
                done, _ = await workflow.wait(
                    [r.task for r in self.alive],
                    timeout=timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            if not done:  # the leading attempt is slow: hedge it, if the budget allows
                offer = await self.next_offer(True) if self.budget_left(workflow.now()) else None
                if offer is None:
                    hedges_left = False
                    continue
                self.alive.append(self.start(offer, True))
                last_start = workflow.now()
                continue
            winner = None
            for runner in [r for r in self.alive if r.task in done]:
                self.alive.remove(runner)
                if runner.task.result() and winner is None:
                    winner = runner
            if winner is not None:
                if self.on_win is not None:
                    self.on_win(winner)
                losers, self.alive = self.alive, []
                for loser in losers:
                    loser.attempt.outcome = AttemptOutcome.LOST_RACE
                await self.stop(losers)
                return winner

    def _delay(self, offer: Offer) -> float:
        after = self.hedge.after_seconds
        return self.delay_for(offer) if after == "auto" else float(after)

    @staticmethod
    async def stop(runners: list[Runner]) -> None:
        """Cancel each runner and wait for its teardown, even through a cancel of our own
        (raised again once every teardown is over)."""
        for runner in runners:
            runner.task.cancel()
        cancelled = False
        for runner in runners:
            while not runner.task.done():
                try:
                    await asyncio.shield(runner.task)
                except asyncio.CancelledError:
                    if not runner.task.done():
                        cancelled = True
                except BaseException:  # the runner's own ending, read by its attempt
                    pass
        if cancelled:
            raise asyncio.CancelledError()

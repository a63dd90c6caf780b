"""The failover policy (every cell of gpuprov/policy.py's decision) and offer ranking.

Pure functions only: no Temporal server."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuprov.models import Block, BlockScope
from gpuprov.policy import (
    FORWARD_RETRY,
    TABLE,
    TEARDOWN_RETRY,
    TEARDOWN_ROUNDS,
    Decision,
    Failure,
    Stage,
    decide,
    retried_at_source,
)
from providers.base import Offer, PriceQuote
from providers.errors import ErrorKind
from workflows.selection import blocking, cost_cap_reason, rank_offers

K = ErrorKind
S = BlockScope

# ---------------------------------------------------------------- the policy: every cell

# The table as the design states it: kind -> (teardown, block, abort) for a failed attempt.
ROWS = {
    K.CAPACITY: (True, S.OFFER, False),
    K.QUOTA: (True, S.REGION, False),
    K.UNAVAILABLE: (False, S.OFFER, False),
    K.FAILED: (True, S.OFFER, False),
    K.INVALID_REQUEST: (False, S.NONE, True),
    K.CREDENTIALS: (True, S.NONE, True),
}
OVERRIDES = [None, *BlockScope]


def expected(failure: Failure) -> Decision:
    """The policy written out cell by cell, independently of gpuprov/policy.py's code."""
    kind = K.FAILED if failure.kind is K.TRANSIENT else failure.kind  # retries are spent
    teardown, block, abort = ROWS[kind]
    if failure.stage is Stage.TEARDOWN:
        again = not abort and failure.rounds_done < TEARDOWN_ROUNDS
        return Decision(retry=again, teardown=False, block=S.NONE, abort=False)
    if failure.stage is Stage.BOOKKEEPING:
        return Decision(retry=False, teardown=True, block=S.NONE, abort=True)
    if failure.scope is not None:
        block = failure.scope
    if failure.stage is Stage.PLAN:
        block = S.NONE if abort or block is S.NONE else S.PROVIDER
        return Decision(retry=False, teardown=False, block=block, abort=abort)
    return Decision(
        retry=False,
        teardown=teardown or failure.instances_may_exist,
        block=block,
        abort=abort,
    )


CELLS = [
    Failure(kind, stage, instances_may_exist=may_exist, scope=scope, rounds_done=rounds)
    for kind in ErrorKind
    for stage in Stage
    for may_exist in (False, True)
    for scope in OVERRIDES
    for rounds in range(1, TEARDOWN_ROUNDS + 1)
]


def test_every_kind_has_a_row_and_only_transient_retries_at_the_source() -> None:
    assert set(TABLE) == set(ErrorKind)
    assert [kind for kind in ErrorKind if retried_at_source(kind)] == [K.TRANSIENT]


@pytest.mark.parametrize(
    "failure",
    CELLS,
    ids=[
        f"{c.kind.value}-{c.stage.value}-{'may' if c.instances_may_exist else 'none'}-"
        f"{c.scope.value if c.scope else 'policy'}-r{c.rounds_done}"
        for c in CELLS
    ],
)
def test_every_cell_of_the_policy(failure: Failure) -> None:
    assert decide(failure) == expected(failure)


def test_named_cells_of_the_design_table() -> None:
    """A handful of cells spelled out, so a wrong `expected` cannot hide a wrong policy."""
    attempt = Stage.ATTEMPT
    assert decide(Failure(K.CAPACITY, attempt)) == Decision(False, True, S.OFFER, False)
    assert decide(Failure(K.QUOTA, attempt)) == Decision(False, True, S.REGION, False)
    assert decide(Failure(K.UNAVAILABLE, attempt)) == Decision(False, False, S.OFFER, False)
    assert decide(Failure(K.UNAVAILABLE, attempt, instances_may_exist=True)).teardown is True
    assert decide(Failure(K.INVALID_REQUEST, attempt)) == Decision(False, False, S.NONE, True)
    assert decide(Failure(K.CREDENTIALS, attempt)) == Decision(False, True, S.NONE, True)
    assert decide(Failure(K.TRANSIENT, attempt)) == decide(Failure(K.FAILED, attempt))
    # a quota that names every region of the account widens the block; a timeout blocks nothing
    assert decide(Failure(K.QUOTA, attempt, scope=S.PROVIDER)).block is S.PROVIDER
    assert decide(Failure(K.FAILED, attempt, scope=S.NONE)).block is S.NONE
    # a plan failure has no offer to blame
    assert decide(Failure(K.CAPACITY, Stage.PLAN)).block is S.PROVIDER
    assert decide(Failure(K.FAILED, Stage.PLAN, scope=S.NONE)).block is S.NONE
    assert decide(Failure(K.CREDENTIALS, Stage.PLAN)) == Decision(False, False, S.NONE, True)
    # teardown rounds, then a possible orphan; an aborting kind gets no more rounds
    rounds = [decide(Failure(K.FAILED, Stage.TEARDOWN, rounds_done=n)).retry for n in (1, 2, 3)]
    assert rounds == [True, True, False]
    assert decide(Failure(K.CREDENTIALS, Stage.TEARDOWN, rounds_done=1)).retry is False
    # the database failing for good fails the job, which releases what it holds
    assert decide(Failure(K.FAILED, Stage.BOOKKEEPING)) == Decision(False, True, S.NONE, True)


def test_retry_policies_are_bounded_and_teardown_tries_harder() -> None:
    assert FORWARD_RETRY.maximum_attempts > 1
    assert TEARDOWN_RETRY.maximum_attempts > FORWARD_RETRY.maximum_attempts


# ---------------------------------------------------------------- ranking offers

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def offer(
    offer_id: str,
    amount: float | None,
    currency: str = "USD",
    unit: str = "hour",
    provider: str = "fake",
    region: str = "r1",
) -> Offer:
    price = None
    if amount is not None:
        price = PriceQuote(
            amount=amount, currency=currency, unit=unit, source="simulated", observed_at=NOW
        )
    return Offer(id=offer_id, provider=provider, region=region, instance_type="gpu8", price=price)


def ids(offers: list[Offer]) -> list[str]:
    return [o.id for o in offers]


def test_prices_in_other_currencies_are_never_compared_as_raw_numbers() -> None:
    offers = [
        offer("usd-12", 12.0),
        offer("eur-1", 1.0, currency="EUR"),
        offer("usd-10", 10.0),
        offer("none", None),
        offer("eur-0.5-minute", 0.5, currency="EUR", unit="minute"),
        offer("usd-5-minute", 5.0, unit="minute"),
    ]
    ranked, rejected = rank_offers(offers, 1, None)
    # USD/hour by price; then other quotes, grouped by currency and unit; then no price.
    assert ids(ranked) == ["usd-10", "usd-12", "eur-1", "eur-0.5-minute", "usd-5-minute", "none"]
    assert rejected == []
    # the quotes themselves are kept as the provider gave them
    assert [o.price.currency for o in ranked if o.price] == ["USD", "USD", "EUR", "EUR", "USD"]


def test_cheapest_offer_comes_first() -> None:
    ranked, rejected = rank_offers([offer("c", 12.0), offer("a", 10.0), offer("b", 11.0)], 1, None)
    assert ids(ranked) == ["a", "b", "c"]
    assert rejected == []


def test_price_ties_break_on_offer_id() -> None:
    offers = [offer("fake/r1-b", 10.0), offer("fake/r2-a", 10.0), offer("fake/r1-a", 10.0)]
    ranked, _ = rank_offers(offers, 1, None)
    assert ids(ranked) == ["fake/r1-a", "fake/r1-b", "fake/r2-a"]


def test_unpriced_offers_go_last_without_a_cap() -> None:
    offers = [offer("z-unpriced", None), offer("b", 50.0), offer("a-unpriced", None)]
    ranked, rejected = rank_offers(offers, 1, None)
    assert ids(ranked) == ["b", "a-unpriced", "z-unpriced"]
    assert rejected == []


def test_a_free_offer_still_beats_unpriced_ones() -> None:
    ranked, _ = rank_offers([offer("a", None), offer("b", 0.0)], 1, None)
    assert ids(ranked) == ["b", "a"]


def test_unpriced_offers_are_rejected_under_a_cap() -> None:
    ranked, rejected = rank_offers([offer("unpriced", None), offer("ok", 5.0)], 1, 100.0)
    assert ids(ranked) == ["ok"]
    assert rejected == ["unpriced: no reliable price and the job has a cost cap"]


def test_cap_multiplies_the_price_by_node_count() -> None:
    offers = [offer("cheap", 10.0), offer("dear", 11.0)]
    ranked, rejected = rank_offers(offers, 4, 40.0)
    assert ids(ranked) == ["cheap"]
    assert rejected == ["dear: 44.00 USD/hour for 4 node(s) > cap 40.00"]


def test_price_exactly_at_the_cap_is_accepted() -> None:
    assert cost_cap_reason(offer("a", 20.0), 2, 40.0) is None


def test_one_node_under_the_cap_but_the_job_over_it_is_rejected() -> None:
    assert cost_cap_reason(offer("a", 30.0), 1, 40.0) is None
    assert cost_cap_reason(offer("a", 30.0), 2, 40.0) is not None


def test_non_usd_price_is_rejected_under_a_cap() -> None:
    ranked, rejected = rank_offers([offer("eur", 1.0, currency="EUR")], 1, 100.0)
    assert ranked == []
    assert rejected == ["eur: priced in EUR/hour; the cap is USD/hour"]


def test_non_hourly_price_is_rejected_under_a_cap() -> None:
    reason = cost_cap_reason(offer("monthly", 1.0, unit="month"), 1, 100.0)
    assert reason == "priced in USD/month; the cap is USD/hour"


def test_non_usd_price_is_kept_without_a_cap() -> None:
    ranked, rejected = rank_offers([offer("eur", 1.0, currency="EUR")], 1, None)
    assert ids(ranked) == ["eur"] and rejected == []


def test_no_cap_means_no_reason() -> None:
    assert cost_cap_reason(offer("a", 1_000_000.0), 256, None) is None
    assert cost_cap_reason(offer("a", None), 1, None) is None


def test_duplicate_offer_ids_collapse_to_one() -> None:
    offers = [offer("a", 10.0), offer("b", 11.0), offer("a", 10.0)]
    ranked, _ = rank_offers(offers, 1, None)
    assert ids(ranked) == ["a", "b"]


def test_rejected_offers_list_every_reason_and_keep_input_order() -> None:
    offers = [offer("dear", 99.0), offer("unpriced", None), offer("ok", 1.0)]
    _, rejected = rank_offers(offers, 1, 10.0)
    assert [line.split(":")[0] for line in rejected] == ["dear", "unpriced"]


def test_no_offers_ranks_nothing() -> None:
    assert rank_offers([], 1, 10.0) == ([], [])


# ---------------------------------------------------------------- blocks


def test_blocking_returns_the_first_block_that_covers_the_offer() -> None:
    blocks = [
        Block(scope=BlockScope.OFFER, key="other", kind=K.CAPACITY, message="sold out"),
        Block(scope=BlockScope.REGION, key="fake/r1", kind=K.QUOTA, message="limit"),
        Block(scope=BlockScope.PROVIDER, key="fake", kind=K.CREDENTIALS, message="denied"),
    ]
    found = blocking(blocks, offer("fake/r1-a/gpu8", 1.0))
    assert found is blocks[1]


def test_blocking_is_none_when_nothing_covers_the_offer() -> None:
    blocks = [Block(scope=BlockScope.REGION, key="fake/r2", kind=K.QUOTA, message="limit")]
    assert blocking(blocks, offer("fake/r1-a/gpu8", 1.0)) is None
    assert blocking([], offer("fake/r1-a/gpu8", 1.0)) is None

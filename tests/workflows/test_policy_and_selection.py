"""The failover table of DESIGN.md ("Errors are the failover policy") and offer ranking.

Pure functions only: no Temporal server."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuprov.models import Block, BlockScope
from providers.base import Offer, PriceQuote
from providers.errors import ErrorKind
from workflows.policy import (
    FORWARD_RETRY,
    POLICY,
    TEARDOWN_RETRY,
    TEARDOWN_ROUNDS,
    Action,
    action_for,
    retry_teardown,
)
from workflows.selection import blocking, cost_cap_reason, rank_offers

K = ErrorKind

# ---------------------------------------------------------------- the policy table


def test_every_kind_has_a_row() -> None:
    assert set(POLICY) == set(ErrorKind)


def test_transient_retries_the_step_and_nothing_else() -> None:
    assert POLICY[K.TRANSIENT] == Action(retry_step=True, teardown=False, block=None, abort=False)


def test_capacity_tears_down_and_blocks_the_offer() -> None:
    assert action_for(K.CAPACITY) == Action(
        retry_step=False, teardown=True, block=BlockScope.OFFER, abort=False
    )


def test_quota_tears_down_and_blocks_the_region() -> None:
    assert action_for(K.QUOTA) == Action(
        retry_step=False, teardown=True, block=BlockScope.REGION, abort=False
    )


def test_unavailable_blocks_the_offer_without_teardown() -> None:
    assert action_for(K.UNAVAILABLE) == Action(
        retry_step=False, teardown=False, block=BlockScope.OFFER, abort=False
    )


def test_failed_tears_down_and_blocks_the_offer() -> None:
    assert action_for(K.FAILED) == Action(
        retry_step=False, teardown=True, block=BlockScope.OFFER, abort=False
    )


def test_invalid_request_aborts_without_teardown() -> None:
    action = action_for(K.INVALID_REQUEST)
    assert action.abort is True and action.teardown is False and action.block is None


def test_credentials_tear_down_and_abort() -> None:
    action = action_for(K.CREDENTIALS)
    assert action.abort is True and action.teardown is True and action.block is None


@pytest.mark.parametrize("kind", [k for k in ErrorKind if k is not K.TRANSIENT])
def test_only_transient_retries_the_step(kind: ErrorKind) -> None:
    assert POLICY[kind].retry_step is False


def test_transient_that_reaches_the_workflow_is_treated_as_failed() -> None:
    assert action_for(K.TRANSIENT) == action_for(K.FAILED)
    assert action_for(K.TRANSIENT).retry_step is False


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_action_for_never_asks_the_workflow_to_retry(kind: ErrorKind) -> None:
    assert action_for(kind).retry_step is False


@pytest.mark.parametrize("kind", [K.CAPACITY, K.QUOTA, K.UNAVAILABLE, K.FAILED])
def test_failover_kinds_do_not_abort(kind: ErrorKind) -> None:
    assert action_for(kind).abort is False


@pytest.mark.parametrize("kind", [K.TRANSIENT, K.CAPACITY, K.QUOTA, K.UNAVAILABLE, K.FAILED])
def test_teardown_retries_until_the_round_limit(kind: ErrorKind) -> None:
    assert [retry_teardown(kind, done) for done in range(TEARDOWN_ROUNDS + 1)] == [
        True
    ] * TEARDOWN_ROUNDS + [False]


@pytest.mark.parametrize("kind", [K.INVALID_REQUEST, K.CREDENTIALS])
def test_teardown_is_not_retried_for_aborting_kinds(kind: ErrorKind) -> None:
    assert retry_teardown(kind, 0) is False


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

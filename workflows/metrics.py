"""gpuprov's metrics from workflow code, through `workflow.metric_meter()`.

That meter records nothing while a history is replayed (a worker restart, a cache eviction),
so each call counts once per real event. Recording a metric is not a command: adding or moving
these calls leaves the workflow's command sequence, and so its replay, unchanged. Names and
labels live in gpuprov/metrics.py.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow
from temporalio.common import MetricMeter

with workflow.unsafe.imports_passed_through():
    from gpuprov import metrics
    from gpuprov.models import JobState
    from providers.base import Offer, PriceQuote
    from providers.errors import ErrorKind


def job_state(state: JobState) -> None:
    _meter().create_counter(metrics.JOB_STATE.name, metrics.JOB_STATE.description).add(
        1, {"state": state.value}
    )


def offer_tried(offer: Offer) -> None:
    counter = _meter().create_counter(metrics.OFFERS_TRIED.name, metrics.OFFERS_TRIED.description)
    counter.add(1, {"provider": offer.provider, "region": offer.region})


def failover(kind: ErrorKind, offer: Offer) -> None:
    counter = _meter().create_counter(metrics.FAILOVERS.name, metrics.FAILOVERS.description)
    counter.add(1, {"kind": kind.value, "provider": offer.provider})


def provisioning_seconds(outcome: str) -> None:
    """Seconds since the workflow started (queue time included: what the submitter waited)."""
    started: datetime = workflow.info().workflow_start_time
    seconds = max((workflow.now() - started).total_seconds(), 0.0)
    spec = metrics.PROVISIONING_SECONDS
    histogram = _meter().create_histogram_float(spec.name, spec.description, spec.unit)
    histogram.record(seconds, {"outcome": outcome})


def estimated_spend(provider: str, quote: PriceQuote) -> None:
    """The whole job's hourly estimate, as recorded in the database when an attempt starts."""
    spec = metrics.ESTIMATED_SPEND
    histogram = _meter().create_histogram_float(spec.name, spec.description)
    histogram.record(quote.amount, {"provider": provider, "currency": quote.currency})


def _meter() -> MetricMeter:
    return workflow.metric_meter()

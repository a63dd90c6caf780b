"""gpuprov's metrics from activities, through `activity.metric_meter()` (names and labels in
gpuprov/metrics.py)."""

from __future__ import annotations

from temporalio import activity

from gpuprov import metrics


def orphan_found(provider: str) -> None:
    """A termination that did not confirm was recorded as a possible orphan."""
    _count(metrics.ORPHANS_FOUND, provider)


def orphan_resolved(provider: str) -> None:
    """A possible orphan was confirmed gone. Called by the reconciler (issue 7), which does not
    exist yet: until it does, gpuprov_orphans_resolved_total never appears on the endpoint."""
    _count(metrics.ORPHANS_RESOLVED, provider)


def _count(metric: metrics.Metric, provider: str) -> None:
    counter = activity.metric_meter().create_counter(metric.name, metric.description)
    counter.add(1, {"provider": provider})

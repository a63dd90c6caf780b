"""gpuprov's metrics from activities, through `activity.metric_meter()` (names and labels in
gpuprov/metrics.py)."""

from __future__ import annotations

from temporalio import activity

from gpuprov import metrics


def orphan_found(provider: str) -> None:
    """A possible orphan was recorded: a termination that did not confirm, or a machine with
    our identity that no live job owns (found by the reconciler)."""
    _count(metrics.ORPHANS_FOUND, provider)


def orphan_resolved(provider: str) -> None:
    """A possible orphan was confirmed gone and cleaned up by the reconciler
    (workflows/reconcile.py); until one is, gpuprov_orphans_resolved_total is absent."""
    _count(metrics.ORPHANS_RESOLVED, provider)


def _count(metric: metrics.Metric, provider: str) -> None:
    counter = activity.metric_meter().create_counter(metric.name, metric.description)
    counter.add(1, {"provider": provider})

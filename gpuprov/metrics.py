"""gpuprov's own Prometheus metrics: one catalogue of names, labels and histogram buckets.

They are emitted through Temporal's metric meters, so they share the worker's Prometheus
endpoint (`[metrics] bind`) with the Temporal SDK's runtime metrics (`temporal_*`):
- workflow code uses `workflow.metric_meter()` (workflows/metrics.py), which records nothing
  while a history is replayed, so a worker restart does not count a job twice;
- activities use `activity.metric_meter()` (activities/metrics.py).
Counters carry `_total` in their name; Temporal adds namespace/task_queue/workflow_type (or
activity_type) and service_name labels. docs/operations.md lists them for operators.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    labels: tuple[str, ...]
    unit: str | None = None


JOB_STATE = Metric(
    "gpuprov_job_state_transitions_total",
    "Jobs entering a state (queued, provisioning, ready, releasing, completed, failed, cancelled)",
    ("state",),
)
OFFERS_TRIED = Metric(
    "gpuprov_offers_tried_total",
    "Attempts started on an offer",
    ("provider", "region"),
)
FAILOVERS = Metric(
    "gpuprov_failovers_total",
    "Attempts that failed, by ErrorKind; the job moves on to its next offer "
    "(InvalidRequest and Credentials abort it instead)",
    ("kind", "provider"),
)
PROVISIONING_SECONDS = Metric(
    "gpuprov_provisioning_seconds",
    "Seconds from the job's start until it was ready, failed or was cancelled while provisioning",
    ("outcome",),
    unit="s",
)
ESTIMATED_SPEND = Metric(
    "gpuprov_estimated_spend_per_hour",
    "Whole-job hourly cost estimate recorded when an attempt starts; _sum adds the rates up",
    ("provider", "currency"),
)
ORPHANS_FOUND = Metric(
    "gpuprov_orphans_found_total",
    "Possible orphans recorded: terminations that did not confirm, and machines with the "
    "gpuprov identity that no live job owns (found by the reconciler)",
    ("provider",),
)
ORPHANS_RESOLVED = Metric(
    "gpuprov_orphans_resolved_total",
    "Possible orphans the reconciler confirmed gone",
    ("provider",),
)

ALL = (
    JOB_STATE,
    OFFERS_TRIED,
    FAILOVERS,
    PROVISIONING_SECONDS,
    ESTIMATED_SPEND,
    ORPHANS_FOUND,
    ORPHANS_RESOLVED,
)

# Temporal's default buckets are milliseconds (50 ... 10,000); ours are seconds and currency.
HISTOGRAM_BUCKETS: dict[str, list[float]] = {
    PROVISIONING_SECONDS.name: [1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600],
    ESTIMATED_SPEND.name: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
}

"""Temporal's names for gpuprov, in one place: every workflow type, signal, query, search
attribute and the default task queue, and the payloads that the SDK, the CLI, the API and the
reconciler send to or read from workflows other than the job itself (the job's own are in
gpuprov/models.py).

These names are public: scripts, the `temporal` CLI and the Temporal UI's saved views use them,
so keep them stable. Workflow code registers under them (`@workflow.defn(name=...)`) and callers
start, signal and query through them, so nothing outside this module spells one
(tests/test_contract_names.py checks). Core layer: imports only providers and models.
"""

from __future__ import annotations

from pydantic import Field
from temporalio.common import SearchAttributeKey

from gpuprov.models import OfferStats
from providers.base import Model, Offer, ResourceRequest

DEFAULT_TASK_QUEUE = "gpuprov"

# Workflow types.
PROVISION_JOB = "ProvisionJob"  # one job: workflow id job-<name> (models.workflow_id_for)
PLAN_OFFERS = "PlanOffers"  # `gpuprov offers`: plan every provider, rank, never create
CHECK_HEALTH = "CheckHealth"  # `gpuprov health`: one check per VM on the credentialed worker
RECONCILE = "Reconcile"  # the reconciler: survey the clouds, tear down what no job holds
WATCH_WORKERS = "WatchWorkers"  # the liveness sweep: lost workers, their jobs woken

# ProvisionJob's signals and queries.
JOB_STATUS = "status"  # query -> models.JobStatus
JOB_RELEASE = "release"  # signal: a ready job gives its machines back
JOB_WORKERS_CHANGED = "workers_changed"  # signal (no payload): a node's liveness changed

# Reconcile's query.
RECONCILE_REPORT = "report"  # query -> ReconcileReport, the pass so far

# Search attributes every job carries.
STATE = SearchAttributeKey.for_keyword("GpuprovState")
PROVIDER = SearchAttributeKey.for_keyword("GpuprovProvider")
REGION = SearchAttributeKey.for_keyword("GpuprovRegion")
GPU = SearchAttributeKey.for_keyword("GpuprovGpu")
TEAM = SearchAttributeKey.for_keyword("GpuprovTeam")

SEARCH_ATTRIBUTES: tuple[SearchAttributeKey[str], ...] = (STATE, PROVIDER, REGION, GPU, TEAM)


def dev_server_args() -> list[str]:
    """`temporal server start-dev` flags that register the search attributes."""
    args: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}=Keyword"]
    return args


def vm_run_tag(run_id: str) -> str:
    """Six hex digits from the random end of the job's first run id (UUIDv7 starts with a
    timestamp). A job name can be submitted again once its job ended; the tag keeps each run's
    VM identities, rows and cloud labels apart, so nothing of an earlier run is ever adopted.
    It stays the same across resets and continue-as-new."""
    return run_id.replace("-", "")[-6:]


class OffersQuery(Model):
    """PlanOffers' input."""

    request: ResourceRequest
    nodes: int = 1
    max_hourly_cost: float | None = None


class OffersResult(Model):
    """PlanOffers' result."""

    offers: list[Offer] = Field(default_factory=list)
    rejected: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)  # "provider: kind at plan: message"
    skipped: dict[str, str] = Field(default_factory=dict)  # configured but not built, and why
    # Each offered offering's recent record (gpuprov.models.offering_of(offer) -> its stats).
    stats: dict[str, OfferStats] = Field(default_factory=dict)


class HealthInput(Model):
    """One VM to check (CheckHealth's part, and the check_health activity's input)."""

    vm: str
    expected_gpus: int | None = Field(default=None, ge=0)  # what the node reported at placement


class HealthRequest(Model):
    """CheckHealth's input."""

    checks: list[HealthInput] = Field(default_factory=list)


class ReconcileInput(Model):
    """Reconcile's input."""

    grace_seconds: float = Field(default=600.0, ge=0)  # younger machines are left alone
    provider: str | None = None  # only this provider; None = every enabled one
    job: str | None = None  # only this job's VM rows and their open orphans; None = everything


class ReconcileReport(Model):
    """Reconcile's result (and its `report` query)."""

    found: int = 0  # orphans recorded for the first time by this pass
    deleted: int = 0  # candidates the cloud still showed, now confirmed gone
    resolved: int = 0  # orphan records closed: gone and cleaned up
    still_open: int = 0  # suspects left for a later pass (young, backing off, failed, ...)
    errors: list[str] = Field(default_factory=list)
    left_open: list[str] = Field(default_factory=list)  # "vm: why" (first 50)
    deleted_vms: list[str] = Field(default_factory=list)  # the `deleted` ones (first 50)
    gone_vms: list[str] = Field(default_factory=list)  # already gone, now closed (first 50)
    kept_vms: list[str] = Field(default_factory=list)  # one job's pass: kept, not touched


class WatchInput(Model):
    """WatchWorkers' input."""

    lost_after_seconds: float = Field(default=90.0, gt=0)

"""What `gpuprov orphans` reads from the database, as one typed answer (`GET /v1/orphans`):

    orphans_report(records, include_resolved)  OrphansReport: the possible orphans (machines
                                               whose termination failed, open ones; resolved
                                               ones too when asked) and the VM rows of
                                               machines that may still exist

The Temporal half of `gpuprov orphans` (which of those machines' jobs are stuck, or whose owner
is unknown: gpuprov/sdk/owners.py) is asked by the command itself; this is only the rows.
`rows()` gives them back as the database's records, which the renderer and the owner
judgement take, whichever way the report travelled.
"""

from __future__ import annotations

from datetime import datetime

from gpuprov.store.db import OrphanRecord, VmRecord
from gpuprov.store.records import Records
from providers.base import Model


class OrphanView(Model):
    """A machine whose termination failed: where, which ids, since when, how often tried."""

    id: str
    provider: str
    region: str
    zone: str | None = None
    vm: str
    instance_ids: list[str]
    first_seen: datetime
    last_seen: datetime
    last_error: str
    attempts: int
    resolved_at: datetime | None = None


class UnfinishedVm(Model):
    """A VM row neither terminated nor kept: a machine that may still exist, and its job."""

    id: str
    job: str
    run: str
    node_index: int
    attempt: int
    vm: str
    provider: str
    region: str
    zone: str | None = None
    instance_ids: list[str]
    status: str
    created_at: datetime


class OrphansReport(Model):
    orphans: list[OrphanView]
    unfinished: list[UnfinishedVm]

    def rows(self) -> tuple[list[OrphanRecord], list[VmRecord]]:
        """The orphans and the unfinished machines as the database's records."""
        return (
            [OrphanRecord(**orphan.model_dump()) for orphan in self.orphans],
            [VmRecord(**vm.model_dump()) for vm in self.unfinished],
        )


def orphans_report(records: Records, *, include_resolved: bool = False) -> OrphansReport:
    orphans = records.orphans(include_resolved=include_resolved)
    unfinished = records.unfinished_vms()
    return OrphansReport(
        orphans=[OrphanView.model_validate(row, from_attributes=True) for row in orphans],
        unfinished=[UnfinishedVm.model_validate(row, from_attributes=True) for row in unfinished],
    )

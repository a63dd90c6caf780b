"""The reconciler's survey: every machine carrying the gpuprov identity, every per-VM side
resource left without a machine, and which of them no live job owns. The workflow
(workflows/reconcile.py) then tears down what this returns.

Where it looks: for every enabled provider, every region that a VM row or an open orphan names,
plus the provider's `sweep_regions()` (regions to list even with no record there). One
`observe_region` call per region; a cloud that cannot list by identity (None) is asked with
`observe` for each VM the database knows there instead, so a machine without any record is only
found where listing works. Then one `observe_side_resources` call per region: the firewalls,
security groups and per-VM keys that prepare made. A VM that has side resources but no instance
anywhere in the provider is judged like a machine (below) and, once a candidate, gets the same
teardown, whose cleanup removes them; a VM with an instance stays on the instance path (its
teardown cleans up once the machine is confirmed gone).

How it judges each VM found, and each open orphan:
- kept (`release="keep"`): never touched, the user kept it on purpose;
- owned: its row's job workflow `job-<job>` is running AND that workflow's status query lists
  the VM among its live nodes. Database and Temporal must agree; when Temporal cannot answer, or
  the job is stuck (gpuprov/sdk/owners.py), the VM is left alone this pass (never delete on doubt).
  A VM without a row is asked about the job its identity names (`<job>-a<n>-n<i>-<tag>`): a job
  prepares a node's side resources before the node's row exists, and lists the node live then;
- otherwise an orphan once older than the grace period: age from the VM row's created_at, or,
  for a machine without a row, from the first pass that saw it (recorded then as an orphan,
  error "unowned: ..."). A recorded orphan also waits out its retry backoff (`retry_delay`).
Every candidate is recorded as an orphan before it is returned (the durable note comes before
the destructive act), so `gpuprov orphans --all` shows every machine the reconciler touched.

A survey restricted to one job (`SurveyInput.job`, what `gpuprov end` runs) lists no region: it
observes each unfinished VM row of that job and takes the open orphans of that job's VMs, and
judges them the same way. A row whose machine the cloud no longer shows is a candidate too (its
teardown confirms it gone and closes the row), and the kept and held ones are named in the
survey, so the caller can say what is left of the job and why.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import Field
from temporalio import activity
from temporalio.client import Client

from activities.heartbeat import Heartbeater
from activities.store import record_possible_orphan
from gpuprov.sdk.owners import Standing, job_situation
from gpuprov.store.db import OrphanRecord, VmRecord, utcnow
from gpuprov.store.records import Records
from providers.base import CloudProvider, Location, Model, Observed
from providers.errors import ProviderError, redact, truncate

# A pass deletes at most this many machines (about 35 history events each); the rest wait for
# the next pass, so one pass's history stays far below Temporal's limits.
MAX_CANDIDATES_PER_PASS = 100
# An orphan whose deletion failed waits this long before the next try, doubling per failure
# (4, 8, 16, 32 minutes, then hourly). The base is below the Schedule's 5-minute interval, so
# the second try is the next pass.
RETRY_BACKOFF_BASE = timedelta(minutes=4)
RETRY_BACKOFF_CAP = timedelta(hours=1)
TEMPORAL_RPC_TIMEOUT = timedelta(seconds=10)
MAX_LINES = 50  # left_open / errors listed per pass; counts stay exact
# A node's identity as workflows/attempt.py makes it: <job>-a<attempt>-n<node>-<run tag>.
VM_IDENTITY = re.compile(r"(?P<job>.+)-a\d+-n\d+-[0-9a-f]+")

Seen = dict[str, tuple[Location, list[Observed]]]  # vm -> where the cloud showed it, and what
# vm -> each region's listing of its side resources (a cloud whose resources are global, such as
# GCE firewalls or Lambda keys, shows the same ones in every region it is asked about)
Sides = dict[str, list[tuple[Location, list[str]]]]


class SurveyInput(Model):
    grace_seconds: float = Field(default=600.0, ge=0)
    provider: str | None = None  # only this provider; None = every enabled one
    job: str | None = None  # only this job's VM rows and their open orphans; None = everything


class SurveyProgress(Model):
    """Heartbeat details of a survey: nothing to resume, only a sign of life."""


class Candidate(Model):
    """A machine (or what may be left of one) to delete, confirm gone and clean up."""

    vm: str
    location: Location
    instance_ids: list[str] = Field(default_factory=list)
    attempt: int = 0  # from the VM row, when there is one
    node_index: int = 0
    observed: bool = False  # the cloud showed it in this pass (else: what may be left of it)
    reason: str


class Survey(Model):
    candidates: list[Candidate] = Field(default_factory=list)
    found: int = 0  # orphans recorded for the first time by this pass
    left_open: list[str] = Field(default_factory=list)  # "vm: why not this pass" (first 50)
    left_open_count: int = 0
    errors: list[str] = Field(default_factory=list)  # listing failures, owners unknown
    kept_vms: list[str] = Field(default_factory=list)  # one job's survey: kept, not touched


def retry_delay(attempts: int) -> timedelta:
    """How long after its last failed try an orphan waits: none while only recorded once."""
    if attempts <= 1:
        return timedelta(0)
    return min(RETRY_BACKOFF_BASE * 2 ** (attempts - 2), RETRY_BACKOFF_CAP)


class OwnerUnknown(Exception):
    """Temporal could not say whether the job holds the VM, or the job is stuck: leave it
    alone this pass."""

    def __init__(self, why: str, stuck: bool) -> None:
        super().__init__(why)
        self.stuck = stuck


class _Owners:
    """The VMs each job's workflow holds live, asked once per job per pass."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._live: dict[str, frozenset[str]] = {}

    async def live_vms(self, job: str) -> frozenset[str]:
        if job not in self._live:
            self._live[job] = await self._ask(job)
        return self._live[job]

    async def _ask(self, job: str) -> frozenset[str]:
        # The latest run of job-<name>: a VM of an earlier run of the same name carries another
        # run tag, so it is never among the current run's nodes.
        situation = await job_situation(self._client, job, TEMPORAL_RPC_TIMEOUT)
        if situation.standing in (Standing.STUCK, Standing.UNKNOWN):
            stuck = situation.standing is Standing.STUCK
            why = f"job {job} is stuck: {situation.detail}" if stuck else situation.detail
            raise OwnerUnknown(why, stuck)
        return frozenset(situation.live_vms)


@dataclass
class _Ledger:
    """What the database says, read once per pass."""

    regions: set[tuple[str, str]]
    unfinished: list[VmRecord]
    orphans: dict[str, OrphanRecord]
    rows: dict[str, VmRecord] = field(default_factory=dict)
    job: str | None = None  # a survey of this job only
    # What the cloud listed beside the database: the side resources of VMs without a machine.
    sides: Sides = field(default_factory=dict)


class ReconcileActivities:
    def __init__(
        self, providers: dict[str, CloudProvider], records: Records, client: Client
    ) -> None:
        self._providers = providers
        self._records = records
        self._client = client

    def all(self) -> list[Any]:
        return [self.reconcile_survey]

    @activity.defn(name="reconcile_survey")
    async def reconcile_survey(self, request: SurveyInput) -> Survey:
        # Beats while it lists every region, so a worker that dies mid-survey is noticed in
        # seconds; a retry surveys again from the start (it only reads and records).
        async with Heartbeater(SurveyProgress(), beat_at_start=False):
            return await self._survey(request)

    async def _survey(self, request: SurveyInput) -> Survey:
        survey = Survey()
        providers = {
            name: provider
            for name, provider in sorted(self._providers.items())
            if request.provider in (None, name)
        }
        if request.job is None:
            seen, suspects, ledger = await self._everything(request, providers, survey)
        else:
            seen, suspects, ledger = await self._one_job(request, providers, survey)
        owners = _Owners(self._client)
        grace = timedelta(seconds=request.grace_seconds)
        for vm in sorted(suspects):
            await self._judge(vm, seen.get(vm), ledger, owners, grace, survey)
        return survey

    async def _everything(
        self, request: SurveyInput, providers: dict[str, CloudProvider], survey: Survey
    ) -> tuple[Seen, set[str], _Ledger]:
        """Every machine listed in every region in use, every VM with side resources but no
        machine, and every open orphan."""
        ledger = await asyncio.to_thread(self._read_ledger)
        seen: Seen = {}
        for name, provider in providers.items():
            machines, sides = await self._list_provider(name, provider, ledger, survey)
            seen.update(machines)
            # Where a machine carries the identity, its own teardown cleans up after it.
            ledger.sides.update({vm: found for vm, found in sides.items() if vm not in machines})
        # Read again after listing: an orphan a job recorded meanwhile is judged as that record.
        ledger.orphans = await asyncio.to_thread(self._open_orphans)
        suspects = set(seen) | set(ledger.sides)
        for vm, orphan in ledger.orphans.items():
            if orphan.provider in providers:
                suspects.add(vm)
            elif request.provider in (None, orphan.provider):
                _leave_open(survey, vm, f"provider {orphan.provider} is not enabled here")
        ledger.rows = await asyncio.to_thread(self._records.get_vms, sorted(suspects))
        return seen, suspects, ledger

    async def _one_job(
        self, request: SurveyInput, providers: dict[str, CloudProvider], survey: Survey
    ) -> tuple[Seen, set[str], _Ledger]:
        """The VM rows of one job, each observed where its row says, and their open orphans."""
        assert request.job is not None
        rows = await asyncio.to_thread(self._records.vms_for_job, request.job)
        orphans = await asyncio.to_thread(self._open_orphans)
        ledger = _Ledger(
            regions=set(),
            unfinished=[],
            orphans={row.vm: orphans[row.vm] for row in rows if row.vm in orphans},
            rows={row.vm: row for row in rows},
            job=request.job,
        )
        seen: Seen = {}
        suspects: set[str] = set()
        for row in rows:
            if request.provider not in (None, row.provider):
                continue
            if row.status == "kept":
                if len(survey.kept_vms) < MAX_LINES:
                    survey.kept_vms.append(row.vm)
                continue
            if row.status == "terminated" and row.vm not in ledger.orphans:
                continue  # confirmed gone by its teardown, nothing left open
            provider = providers.get(row.provider)
            if provider is None:
                _leave_open(survey, row.vm, f"provider {row.provider} is not enabled here")
                continue
            if row.status != "terminated":
                location = Location(provider=row.provider, region=row.region, zone=row.zone)
                try:
                    observed = await provider.observe(location, row.vm)
                except ProviderError as error:
                    _error(survey, f"observe {row.vm}: {error.kind.value}: {error.message}")
                    _leave_open(survey, row.vm, "could not observe it")
                    continue
                if observed:
                    seen[row.vm] = (location, observed)
            suspects.add(row.vm)
        return seen, suspects, ledger

    def _read_ledger(self) -> _Ledger:
        return _Ledger(
            regions=self._records.vm_regions(),
            unfinished=self._records.unfinished_vms(),
            orphans=self._open_orphans(),
        )

    def _open_orphans(self) -> dict[str, OrphanRecord]:
        return {orphan.vm: orphan for orphan in self._records.open_orphans()}

    # ------------------------------------------------------------------ listing

    async def _list_provider(
        self, name: str, provider: CloudProvider, ledger: _Ledger, survey: Survey
    ) -> tuple[Seen, Sides]:
        """The machines, then the side resources, of every region of the provider in use."""
        regions = {region for p, region in ledger.regions if p == name}
        regions.update(provider.sweep_regions())
        seen: Seen = {}
        sides: Sides = {}
        for region in sorted(regions):
            location = Location(provider=name, region=region)
            try:
                listing = await provider.observe_region(location)
                if listing is None:
                    listing = await self._observe_known(provider, location, ledger, survey)
            except ProviderError as error:
                _error(survey, f"list {name}/{region}: {_said(provider, error)}")
                continue
            for vm, observed in listing.items():
                if observed:
                    seen[vm] = (location, observed)
            try:
                left = await provider.observe_side_resources(location)
            except ProviderError as error:
                _error(survey, f"list side resources {name}/{region}: {_said(provider, error)}")
                continue
            for vm, resources in (left or {}).items():
                if resources:
                    sides.setdefault(vm, []).append((location, resources))
        return seen, sides

    async def _observe_known(
        self, provider: CloudProvider, location: Location, ledger: _Ledger, survey: Survey
    ) -> dict[str, list[Observed]]:
        """Without list-by-identity: observe each VM the database knows in the region."""
        known: dict[str, str | None] = {
            row.vm: row.zone
            for row in ledger.unfinished
            if (row.provider, row.region) == (location.provider, location.region)
        }
        for orphan in ledger.orphans.values():
            if (orphan.provider, orphan.region) == (location.provider, location.region):
                known.setdefault(orphan.vm, orphan.zone)
        listing: dict[str, list[Observed]] = {}
        for vm, zone in sorted(known.items()):
            try:
                listing[vm] = await provider.observe(location.model_copy(update={"zone": zone}), vm)
            except ProviderError as error:
                _error(survey, f"observe {vm}: {_said(provider, error)}")
        return listing

    # ------------------------------------------------------------------ judging

    async def _judge(
        self,
        vm: str,
        seen: tuple[Location, list[Observed]] | None,
        ledger: _Ledger,
        owners: _Owners,
        grace: timedelta,
        survey: Survey,
    ) -> None:
        row, orphan = ledger.rows.get(vm), ledger.orphans.get(vm)
        sides = ledger.sides.get(vm, []) if seen is None else []
        if row is not None and row.status == "kept":
            return  # the user kept it on purpose
        job = row.job if row is not None else _job_named_by(vm)
        if job is not None:
            try:
                if vm in await owners.live_vms(job):
                    if ledger.job is not None:
                        _leave_open(survey, vm, f"held by its running job {job}")
                    return
            except OwnerUnknown as error:
                _error(survey, f"{vm}: left alone, owner unknown: {error}")
                why = "job stuck" if error.stuck else "Temporal did not answer"
                _leave_open(survey, vm, f"owner unknown ({why})")
                return
        candidate = _candidate(vm, seen, row, orphan, sides)
        left = _side_note(sides)
        if row is None and orphan is None:  # first sighting: the grace period starts now
            what = f"no instance, side resources left: {left}" if sides else "carries the identity"
            orphan = await self._record(candidate, f"unowned: {what}, no VM record")
            survey.found += 1
        if row is not None:
            born = row.created_at
        else:
            assert orphan is not None
            born = orphan.first_seen
        now = utcnow()  # after any first record, so a zero grace period means this pass
        if now - born < grace:
            _leave_open(survey, vm, f"younger than the grace period ({grace.total_seconds():g}s)")
            return
        if orphan is not None and now < orphan.last_seen + retry_delay(orphan.attempts):
            _leave_open(survey, vm, f"backing off after {orphan.attempts} attempts")
            return
        if len(survey.candidates) >= MAX_CANDIDATES_PER_PASS:
            _leave_open(survey, vm, f"over {MAX_CANDIDATES_PER_PASS} this pass: next pass")
            return
        if orphan is None:
            # Observed once more before the durable note. Not seen at all happens only in one
            # job's survey (a row whose machine the cloud no longer shows): its teardown then
            # confirms it gone, cleans up and closes the row.
            if seen is not None and not await self._still_there(candidate, survey):
                return  # its job's teardown finished after the listing: nothing to do
            job = row.job if row is not None else "none"
            if seen is not None:
                shown = ""
            elif sides:
                shown = f"; no instance, side resources left: {left}"
            else:
                shown = "; the cloud shows nothing, its row is open"
            await self._record(candidate, f"unowned: no live job holds it (job {job}){shown}")
            survey.found += 1
        survey.candidates.append(candidate)

    async def _still_there(self, candidate: Candidate, survey: Survey) -> bool:
        """Observe once more before recording a new orphan: a job that released the machine
        between the listing and the ownership check has confirmed it gone by now."""
        provider = self._providers[candidate.location.provider]
        try:
            observed = await provider.observe(candidate.location, candidate.vm)
        except ProviderError as error:
            _error(survey, f"observe {candidate.vm}: {_said(provider, error)}")
            _leave_open(survey, candidate.vm, "could not observe it again")
            return False
        ids = {*candidate.instance_ids, *(instance.id for instance in observed)}
        candidate.instance_ids = sorted(ids)
        return bool(observed)

    async def _record(self, candidate: Candidate, error: str) -> OrphanRecord:
        return await record_possible_orphan(
            self._records, candidate.location, candidate.vm, candidate.instance_ids, error
        )


def _job_named_by(vm: str) -> str | None:
    """The job a VM identity names, for a VM without a row."""
    match = VM_IDENTITY.fullmatch(vm)
    return match.group("job") if match else None


def _side_note(sides: list[tuple[Location, list[str]]]) -> str:
    """The side resources listed for a VM, once each, for the orphan's record."""
    names = sorted({resource for _, resources in sides for resource in resources})
    return truncate(", ".join(names), 300)


def _candidate(
    vm: str,
    seen: tuple[Location, list[Observed]] | None,
    row: VmRecord | None,
    orphan: OrphanRecord | None,
    sides: list[tuple[Location, list[str]]],
) -> Candidate:
    """Where the machine is (what the cloud showed, the row's zone being more precise) and
    every instance id known for it; the delete step observes again anyway. A VM with side
    resources only is torn down where they were listed: the row's region when they were listed
    there too (a global resource is listed in every region), else the first region listed."""
    ids: set[str] = set()
    if seen is None and sides:
        at_row = [where for where, _ in sides if row is not None and where.region == row.region]
        seen = ((at_row or [sides[0][0]])[0], [])
    if seen is not None:
        location, observed = seen
        ids.update(instance.id for instance in observed)
        if row is not None and row.region == location.region:
            location = location.model_copy(update={"zone": row.zone})
    elif row is not None:
        location = Location(provider=row.provider, region=row.region, zone=row.zone)
    else:
        assert orphan is not None  # a suspect is either seen or an open orphan
        location = Location(provider=orphan.provider, region=orphan.region, zone=orphan.zone)
    for known in (row, orphan):
        if known is not None:
            ids.update(known.instance_ids)
    reason = orphan.last_error if orphan is not None else "unowned"
    return Candidate(
        vm=vm,
        location=location,
        instance_ids=sorted(ids),
        attempt=row.attempt if row is not None else 0,
        node_index=row.node_index if row is not None else 0,
        observed=seen is not None and bool(seen[1]),
        reason=truncate(reason, 500),
    )


def _leave_open(survey: Survey, vm: str, why: str) -> None:
    survey.left_open_count += 1
    if len(survey.left_open) < MAX_LINES:
        survey.left_open.append(f"{vm}: {why}")


def _said(provider: CloudProvider, error: ProviderError) -> str:
    """The kind and the cloud's words, without any credential of the provider in them."""
    return f"{error.kind.value}: {redact(error.message, provider.secrets())}"


def _error(survey: Survey, message: str) -> None:
    if len(survey.errors) < MAX_LINES:
        survey.errors.append(truncate(message, 500))

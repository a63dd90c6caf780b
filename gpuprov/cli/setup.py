"""`gpuprov setup`: prepare a production cluster once; running it again changes nothing.

1. Database: run the Alembic migrations up to head (the same `Database.upgrade` every process
   runs at start-up; it takes a database-wide lock, so a racing worker is harmless).
2. Temporal namespace: create it when it does not exist yet (a bare `temporalio/server`, as in
   docker-compose.yml, has none), with the retention given; an existing one is left untouched.
3. Search attributes: register the four Keyword attributes of gpuprov.contract through
   the operator service, only the missing ones. An attribute that exists with another type is an
   error the operator must resolve: silently keeping it would break every job's upsert.

4. The Schedules (gpuprov/engine/schedules.py): the orphan reconciler's and the worker liveness
   sweep's, each created or updated to match the `[reconcile]` and `[workers]` settings, so
   compose's one-shot `setup` service stays the only cluster-level step. `gpuprov schedules
   apply` does this step alone.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta

from google.protobuf.duration_pb2 import Duration
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuprov import contract
from gpuprov.cli.arguments import bounded_float, bounded_int
from gpuprov.config import Settings
from gpuprov.engine.schedules import LIVENESS_SCHEDULE_ID, SCHEDULE_ID, Outcome, apply_schedules
from gpuprov.engine.worker import connect
from gpuprov.sdk.client import GpuprovError
from gpuprov.store.db import Database

KEYWORD = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
DEFAULT_RETENTION = timedelta(days=30)  # closed jobs stay inspectable in the UI this long
DEFAULT_WAIT_SECONDS = 120.0  # compose starts setup as soon as Temporal's port opens
MAX_WAIT_SECONDS = 3600.0
MAX_RETENTION_DAYS = 3650  # a protobuf Duration holds far more; ten years is already a lot
_POLL_SECONDS = 1.0


class SetupError(GpuprovError):
    """The cluster cannot be prepared; the message says what to fix."""


@dataclass
class SetupReport:
    """What `setup` found and what it changed."""

    database: str  # the URL without its password
    revision_before: str | None
    revision_after: str | None
    namespace: str
    namespace_created: bool = False
    attributes_added: list[str] = field(default_factory=list)
    attributes_present: list[str] = field(default_factory=list)
    schedule: Outcome | None = None  # the reconciler's Schedule
    liveness_schedule: Outcome | None = None  # the liveness sweep's Schedule

    @property
    def changed(self) -> bool:
        migrated = self.revision_before != self.revision_after
        schedules = (self.schedule, self.liveness_schedule)
        schedule_changed = any(outcome in ("created", "updated") for outcome in schedules)
        return migrated or self.namespace_created or bool(self.attributes_added) or schedule_changed

    def lines(self) -> list[str]:
        if self.revision_before == self.revision_after:
            migration = f"already at revision {self.revision_after}"
        else:
            migration = f"migrated {self.revision_before or 'empty'} -> {self.revision_after}"
        added = ", ".join(self.attributes_added) or "none"
        present = ", ".join(self.attributes_present) or "none"
        return [
            f"database {self.database}: {migration}",
            f"namespace {self.namespace}: {'created' if self.namespace_created else 'exists'}",
            f"search attributes added: {added}; already present: {present}",
            f"reconciler schedule {SCHEDULE_ID}: {self.schedule or 'not applied'}",
            f"liveness schedule {LIVENESS_SCHEDULE_ID}: {self.liveness_schedule or 'not applied'}",
            "setup done" if self.changed else "nothing to do: already set up",
        ]


async def setup_cluster(
    settings: Settings,
    *,
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
    retention: timedelta = DEFAULT_RETENTION,
) -> SetupReport:
    """Migrate the database, then make sure the namespace and the search attributes exist."""
    database_url = settings.database_url
    before, after = await asyncio.to_thread(_migrate, database_url)
    report = SetupReport(
        database=make_url(database_url).render_as_string(hide_password=True),
        revision_before=before,
        revision_after=after,
        namespace=settings.temporal.namespace,
    )
    deadline = time.monotonic() + wait_seconds
    client = await _connect_until(settings, deadline)
    report.namespace_created = await _ensure_namespace(client, report.namespace, retention)
    added, present = await _ensure_search_attributes(client, report.namespace, deadline)
    report.attributes_added, report.attributes_present = added, present
    report.schedule, report.liveness_schedule = await _ensure_schedules(client, settings)
    return report


async def _ensure_schedules(client: Client, settings: Settings) -> tuple[Outcome, Outcome]:
    try:
        return await apply_schedules(client, settings)
    except RPCError as error:
        raise SetupError(f"cannot apply the schedules: {error.message}") from None


def _migrate(url: str) -> tuple[str | None, str | None]:
    shown = make_url(url).render_as_string(hide_password=True)
    try:
        database = Database(url)
    except OSError as error:  # the SQLite file's directory cannot be made
        raise SetupError(f"cannot migrate database {shown}: {error.strerror}") from None
    try:
        before = database.current_revision()
        database.upgrade()
        return before, database.current_revision()
    except OperationalError as error:
        raise SetupError(f"cannot migrate database {shown}: {error.orig}") from None
    finally:
        database.dispose()


async def _connect_until(settings: Settings, deadline: float) -> Client:
    """Connect, retrying while the frontend comes up (an open port is not a serving server)."""
    while True:
        try:
            return await connect(settings.temporal, codec=settings.codec)
        except RuntimeError as error:
            if time.monotonic() >= deadline:
                address = settings.temporal.address
                raise SetupError(f"cannot reach Temporal at {address}: {error}") from None
        await asyncio.sleep(_POLL_SECONDS)


async def _ensure_namespace(client: Client, namespace: str, retention: timedelta) -> bool:
    """Create the namespace if missing; True when this call created it."""
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace)
        )
        return False
    except RPCError as error:
        if error.status is not RPCStatusCode.NOT_FOUND:
            raise SetupError(f"cannot describe namespace {namespace}: {error.message}") from None
    period = Duration(seconds=int(retention.total_seconds()))
    request = RegisterNamespaceRequest(
        namespace=namespace,
        description="gpuprov jobs",
        workflow_execution_retention_period=period,
    )
    try:
        await client.workflow_service.register_namespace(request)
    except RPCError as error:
        if error.status is RPCStatusCode.ALREADY_EXISTS:  # another setup won the race
            return False
        raise SetupError(f"cannot create namespace {namespace}: {error.message}") from None
    return True


async def _ensure_search_attributes(
    client: Client, namespace: str, deadline: float
) -> tuple[list[str], list[str]]:
    """Add the missing attributes; returns (added, already present), each in ALL's order."""
    wanted = [key.name for key in contract.SEARCH_ATTRIBUTES]
    existing = await _custom_attributes(client, namespace, deadline)
    _check_types(existing, namespace)
    missing = [name for name in wanted if name not in existing]
    if missing:
        request = AddSearchAttributesRequest(
            namespace=namespace, search_attributes=dict.fromkeys(missing, KEYWORD)
        )
        try:
            await client.operator_service.add_search_attributes(request)
        except RPCError as error:
            # ALREADY_EXISTS: a concurrent setup added them first; the check below confirms.
            if error.status is not RPCStatusCode.ALREADY_EXISTS:
                names = ", ".join(missing)
                raise SetupError(f"cannot add search attributes {names}: {error.message}") from None
        existing = await _custom_attributes(client, namespace, deadline)
        _check_types(existing, namespace)
        absent = [name for name in wanted if name not in existing]
        if absent:
            raise SetupError(
                f"search attributes {', '.join(absent)} still missing on namespace {namespace} "
                "after adding them"
            )
    present = [name for name in wanted if name not in missing]
    return missing, present


async def _custom_attributes(client: Client, namespace: str, deadline: float) -> dict[str, int]:
    """The namespace's custom attributes; waits while a new namespace reaches every frontend."""
    request = ListSearchAttributesRequest(namespace=namespace)
    while True:
        try:
            response = await client.operator_service.list_search_attributes(request)
            return dict(response.custom_attributes)
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND or time.monotonic() >= deadline:
                raise SetupError(
                    f"cannot list search attributes of namespace {namespace}: {error.message}"
                ) from None
        await asyncio.sleep(_POLL_SECONDS)


def _check_types(existing: dict[str, int], namespace: str) -> None:
    for key in contract.SEARCH_ATTRIBUTES:
        kind = existing.get(key.name)
        if kind is not None and kind != KEYWORD:
            found = IndexedValueType.Name(kind).removeprefix("INDEXED_VALUE_TYPE_").title()
            raise SetupError(
                f"search attribute {key.name} exists on namespace {namespace} as {found}; "
                f"gpuprov needs Keyword. Remove it (temporal operator search-attribute remove "
                f"--name {key.name} --namespace {namespace}) and run gpuprov setup again"
            )


# ---------------------------------------------------------------- the `gpuprov setup` command


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "setup",
        help="prepare a cluster once: migrations, namespace, search attributes, reconciler "
        "schedule (idempotent)",
        description=(
            "Run the database migrations, create the Temporal namespace if it is missing, "
            "register gpuprov's search attributes and create (or update) the orphan "
            "reconciler's Schedule. Safe to run again: it only adds or fixes what is missing."
        ),
    )
    parser.add_argument(
        "--wait",
        type=bounded_float(0, MAX_WAIT_SECONDS),
        default=DEFAULT_WAIT_SECONDS,
        help=f"seconds to wait for Temporal to serve (default {DEFAULT_WAIT_SECONDS:g})",
    )
    parser.add_argument(
        "--retention-days",
        type=bounded_int(1, MAX_RETENTION_DAYS, "days"),
        default=DEFAULT_RETENTION.days,
        help="history retention if the namespace has to be created "
        f"(default {DEFAULT_RETENTION.days})",
    )
    parser.set_defaults(handler=command)


async def command(settings: Settings, args: argparse.Namespace) -> int:
    report = await setup_cluster(
        settings, wait_seconds=args.wait, retention=timedelta(days=args.retention_days)
    )
    print(f"Temporal at {settings.temporal.address}")
    for line in report.lines():
        print(line)
    return 0

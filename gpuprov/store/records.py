"""Every read and write of gpuprov's database: VM rows, join tokens, costs, blocks, workers,
orphans.

Methods are synchronous (async callers wrap them in `asyncio.to_thread`). Each one is its own
transaction unless it takes a `session`, in which case it works inside the caller's transaction
and the caller commits. Returned rows are detached: read them freely after the call.

Races are settled by the database, not by Python: a claim is a conditional UPDATE
(`... WHERE state = 'idle'`, `... WHERE used_at IS NULL`) and whoever's UPDATE hits the row wins;
an upsert is "UPDATE, else INSERT, and on a unique-constraint clash UPDATE again". That holds
across threads and across processes, on SQLite (one writer at a time, WAL + busy_timeout) and on
PostgreSQL (row locks; READ COMMITTED re-checks the WHERE after waiting).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from gpuprov.store.capacity import CapacityBackoff
from gpuprov.store.costs import record_actual
from gpuprov.store.credentials import delete_worker_credentials, revoke_worker_credentials
from gpuprov.store.db import (
    BLOCK_SCOPES,
    COST_KINDS,
    NO_RUN,
    VM_STATUSES,
    WORKER_ORIGINS,
    WORKER_STATES,
    BlockRecord,
    CostRecord,
    Database,
    JoinToken,
    OrphanRecord,
    UtcDateTime,
    VmRecord,
    WorkerRecord,
    insert_row,
    utcnow,
)
from gpuprov.store.runs import note_run, run_of_vm
from providers.base import Billing, PriceQuote
from providers.errors import ErrorKind

TokenRejection = Literal["unknown", "used", "expired"]

# Upserts retry when a concurrent insert of the same key wins; two rounds always suffice
# (the second UPDATE finds the winner's row), the third is slack.
_UPSERT_ROUNDS = 3


class TokenRejected(Exception):
    """A join token that cannot be redeemed; `reason` is "unknown", "used" or "expired"."""

    def __init__(self, reason: TokenRejection) -> None:
        super().__init__(f"join token rejected: {reason}")
        self.reason: TokenRejection = reason


def _check(value: str, allowed: Sequence[str], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r} (expected one of {', '.join(allowed)})")
    return value


def _aware(moment: datetime, what: str) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (UTC), got {moment!r}")
    return moment


def _positive(ttl: timedelta) -> timedelta:
    if ttl <= timedelta(0):
        raise ValueError(f"ttl must be positive, got {ttl}")
    return ttl


def _time(moment: datetime) -> Any:
    """A bound timestamp for SQL expressions that do not take their type from a column."""
    return sa.literal(moment, UtcDateTime())


def _terminated(now: datetime) -> dict[str, Any]:
    """A VM row's terminated status, stamped once: a repeat keeps the first terminated_at."""
    return {
        "status": "terminated",
        "terminated_at": sa.func.coalesce(VmRecord.terminated_at, _time(now)),
    }


def _update(entity: type[Any]) -> sa.Update:
    # The session never holds a stale copy we care about: each method re-reads after writing.
    return sa.update(entity).execution_options(synchronize_session=False)


class Records:
    def __init__(self, db: Database) -> None:
        self.db = db  # public: callers open sessions for redeem_token / register_worker

    # ------------------------------------------------------------------ VMs

    def record_vm(
        self,
        *,
        job: str,
        node_index: int,
        attempt: int,
        vm: str,
        provider: str,
        region: str,
        zone: str | None,
        instance_type: str | None = None,
        price: PriceQuote | None = None,
        billing: Billing | None = None,
    ) -> VmRecord:
        """Record a VM before its create call; a second call for the same `vm` returns the
        existing row unchanged (an activity retry), unless it belongs to another job. The
        offer's quote and the cloud's billing terms stay on the row for its actual cost; the
        run is the one the identity names."""
        row = VmRecord(
            job=job,
            run=run_of_vm(vm),
            node_index=node_index,
            attempt=attempt,
            vm=vm,
            provider=provider,
            region=region,
            zone=zone,
            instance_ids=[],
            status="recorded",
            created_at=utcnow(),
            instance_type=instance_type,
            price_amount=price.amount if price else None,
            price_currency=price.currency if price else None,
            price_unit=price.unit if price else None,
            price_source=price.source if price else None,
            billing_granularity_seconds=billing.granularity_seconds if billing else None,
            billing_minimum_seconds=billing.minimum_seconds if billing else None,
        )
        try:  # the first call's one transaction; a repeat finds the row (its identity's key)
            with self.db.session() as session:
                insert_row(session, row)
                note_run(session, self.db.dialect, job, row.run)
                session.commit()
            return row
        except IntegrityError:
            existing = self.get_vm(vm)
            if existing is None:
                raise
        if existing.job != job:
            raise ValueError(f"VM {vm!r} is already recorded for job {existing.job!r}")
        return existing

    def set_vm_instances(self, vm: str, instance_ids: list[str], status: str) -> None:
        """Set the ids and status; "created" also stamps launched_at (once: the cloud accepted
        the create then, and a repeat keeps the first moment)."""
        _check(status, VM_STATUSES, "VM status")
        values: dict[str, Any] = {"instance_ids": list(instance_ids), "status": status}
        if status == "created":
            values["launched_at"] = sa.func.coalesce(VmRecord.launched_at, _time(utcnow()))
        self._update_vm(vm, values)

    def set_vm_status(self, vm: str, status: str) -> None:
        """Set the status; "terminated" also stamps terminated_at (once: a repeat keeps it)."""
        _check(status, VM_STATUSES, "VM status")
        values = _terminated(utcnow()) if status == "terminated" else {"status": status}
        self._update_vm(vm, values)

    def vm_terminated(self, vm: str, seen_ids: Sequence[str] = ()) -> None:
        """One transaction: the row says terminated (stamped once), the machine's actual cost is
        recorded (once; gpuprov/store/costs.py) and the worker that ran on the machine is revoked,
        with its credential. `seen_ids`: what teardown found and deleted, proof that a machine
        existed even where the create's answer was lost. A VM without a row (its create never
        ran) is left alone."""
        now = utcnow()
        with self.db.session() as session:
            job = session.exec(select(VmRecord.job).where(VmRecord.vm == vm)).first()
            if job is None:
                return
            session.exec(_update(VmRecord).where(col(VmRecord.vm) == vm).values(_terminated(now)))
            record_actual(session, vm, seen_ids)
            session.exec(
                _update(WorkerRecord)
                .where(
                    col(WorkerRecord.job) == job,
                    col(WorkerRecord.vm) == vm,
                    col(WorkerRecord.state) != "revoked",
                )
                .values(state="revoked", updated_at=now)
            )
            revoke_worker_credentials(session, now, col(WorkerRecord.vm) == vm)
            session.commit()

    def _update_vm(self, vm: str, values: dict[str, Any]) -> None:
        with self.db.session() as session:
            result = session.exec(_update(VmRecord).where(col(VmRecord.vm) == vm).values(values))
            if result.rowcount == 0:
                raise KeyError(f"no VM record {vm!r}")
            session.commit()

    def get_vm(self, vm: str) -> VmRecord | None:
        with self.db.session() as session:
            return session.exec(select(VmRecord).where(VmRecord.vm == vm)).first()

    def get_vms(self, vms: Sequence[str]) -> dict[str, VmRecord]:
        """The rows of the given VM identities that exist, by identity."""
        if not vms:
            return {}
        with self.db.session() as session:
            query = select(VmRecord).where(col(VmRecord.vm).in_(list(vms)))
            return {row.vm: row for row in session.exec(query).all()}

    def unfinished_vms(self) -> list[VmRecord]:
        """Rows of machines that may still exist: neither terminated nor kept on purpose."""
        with self.db.session() as session:
            query = (
                select(VmRecord)
                .where(col(VmRecord.status).not_in(("terminated", "kept")))
                .order_by(col(VmRecord.created_at), col(VmRecord.id))
            )
            return list(session.exec(query).all())

    def vm_regions(self) -> set[tuple[str, str]]:
        """Every (provider, region) that a VM row or an open orphan names."""
        with self.db.session() as session:
            vms = session.exec(select(VmRecord.provider, VmRecord.region).distinct()).all()
            open_orphans = select(OrphanRecord.provider, OrphanRecord.region).where(
                col(OrphanRecord.resolved_at).is_(None)
            )
            orphans = session.exec(open_orphans.distinct()).all()
        return {(provider, region) for provider, region in [*vms, *orphans]}

    def vms_for_job(self, job: str) -> list[VmRecord]:
        with self.db.session() as session:
            query = (
                select(VmRecord)
                .where(VmRecord.job == job)
                .order_by(col(VmRecord.attempt), col(VmRecord.node_index))
            )
            return list(session.exec(query).all())

    def note_run(self, job: str, run: str | None) -> None:
        """Record a run of the job (once; gpuprov/store/runs.py)."""
        with self.db.session() as session:
            note_run(session, self.db.dialect, job, run)
            session.commit()

    # ------------------------------------------------------------------ join tokens

    @staticmethod
    def hash_token(plaintext: str) -> str:
        return hashlib.sha256(plaintext.encode()).hexdigest()

    def mint_token(self, *, vm: str | None = None, label: str | None = None, ttl: timedelta) -> str:
        """A fresh single-use token bound to a recorded VM or to an existing-worker label.

        Only its SHA-256 is stored; the plaintext is returned once and never again. Earlier
        unused tokens for the same VM or label are deleted, so only the newest one works.
        """
        if (vm is None) == (label is None):
            raise ValueError("a join token is bound to exactly one of vm or label")
        _positive(ttl)
        plaintext = secrets.token_urlsafe(32)
        now = utcnow()
        binding = col(JoinToken.vm) == vm if vm is not None else col(JoinToken.label) == label
        with self.db.session() as session:
            known = select(VmRecord.id).where(VmRecord.vm == vm)
            if vm is not None and session.exec(known).first() is None:
                raise KeyError(f"no VM record {vm!r}: record the VM before minting its token")
            session.exec(sa.delete(JoinToken).where(binding, col(JoinToken.used_at).is_(None)))
            insert_row(
                session,
                JoinToken(
                    token_sha256=self.hash_token(plaintext),
                    vm=vm,
                    label=label,
                    expires_at=now + ttl,
                    created_at=now,
                ),
            )
            session.commit()
        return plaintext

    def token_redeemable(self, plaintext: str, now: datetime) -> bool:
        """Whether the token could be redeemed now: one read by its SHA-256, nothing written
        (the API's throttle lets such a token through whoever sent it)."""
        _aware(now, "now")
        with self.db.session() as session:
            found = session.exec(
                select(JoinToken.token_sha256).where(
                    col(JoinToken.token_sha256) == self.hash_token(plaintext),
                    col(JoinToken.used_at).is_(None),
                    col(JoinToken.expires_at) > now,
                )
            ).first()
        return found is not None

    def redeem_token(self, session: Session, plaintext: str, now: datetime) -> JoinToken:
        """Mark the token used inside the caller's transaction and return its row.

        The claim is one conditional UPDATE, the first statement this method runs, so of two
        concurrent redeems exactly one changes the row. A rejected token raises TokenRejected
        and changes nothing.
        """
        _aware(now, "now")
        digest = self.hash_token(plaintext)
        claimed = session.exec(
            _update(JoinToken)
            .where(
                col(JoinToken.token_sha256) == digest,
                col(JoinToken.used_at).is_(None),
                col(JoinToken.expires_at) > now,
            )
            .values(used_at=now)
        ).rowcount
        token = session.exec(
            select(JoinToken)
            .where(JoinToken.token_sha256 == digest)
            .execution_options(populate_existing=True)
        ).first()
        if claimed == 1 and token is not None:
            return token
        if token is None:
            raise TokenRejected("unknown")
        if token.used_at is None and token.expires_at <= now:
            raise TokenRejected("expired")
        raise TokenRejected("used")

    # ------------------------------------------------------------------ costs

    def record_cost(
        self,
        *,
        job: str,
        kind: str,
        amount: float,
        currency: str,
        unit: str,
        source: str,
        recorded_at: datetime | None = None,
        provider: str | None = None,
        run: str | None = None,
    ) -> CostRecord:
        row = CostRecord(
            job=job,
            run=run or NO_RUN,
            kind=_check(kind, COST_KINDS, "cost kind"),
            amount=amount,
            currency=currency,
            unit=unit,
            source=source,
            recorded_at=utcnow() if recorded_at is None else _aware(recorded_at, "recorded_at"),
            provider=provider,
        )
        with self.db.session() as session:
            insert_row(session, row)
            note_run(session, self.db.dialect, job, run)
            session.commit()
        return row

    def costs(self, job: str, run: str | None = None) -> list[CostRecord]:
        """The job's cost records (of one run with `run`)."""
        with self.db.session() as session:
            query = select(CostRecord).where(CostRecord.job == job)
            if run is not None:
                query = query.where(CostRecord.run == run)
            query = query.order_by(col(CostRecord.recorded_at), col(CostRecord.id))
            return list(session.exec(query).all())

    # ------------------------------------------------------------------ blocks

    def record_block(
        self,
        *,
        scope: str,
        key: str,
        kind: str,
        message: str,
        job: str,
        ttl: timedelta,
        now: datetime | None = None,
        backoff: CapacityBackoff | None = None,
    ) -> BlockRecord:
        """Block (scope, key) for every job until now + ttl.

        A block that already exists takes the new error's kind, message and job, and its expiry
        only ever moves later; one that had expired starts over (created_at = now). With
        `backoff`, a Capacity block lasts by the key's strikes instead (gpuprov/store/capacity.py)
        and its launch budget starts over. `now`: the caller's clock (a job's workflow time).
        """
        _check(scope, BLOCK_SCOPES, "block scope")
        kind = ErrorKind(kind).value
        now = _aware(now, "now") if now is not None else utcnow()
        where = (col(BlockRecord.scope) == scope, col(BlockRecord.key) == key)
        backoff_values: dict[str, Any] = {}
        strikes = 0
        if backoff is not None and kind == ErrorKind.CAPACITY.value:
            with self.db.session() as session:
                row = session.exec(select(BlockRecord).where(*where)).one_or_none()
            strikes = backoff.strikes_after_failure(row, now)
            ttl = backoff.ttl(strikes)
            backoff_values = {"strikes": strikes, "probes": 0, "probe_window_start": None}
        expires_at = now + _positive(ttl)
        refresh = {
            "kind": kind,
            "message": message,
            "job": job,
            "created_at": sa.case(
                (col(BlockRecord.expires_at) <= now, _time(now)), else_=BlockRecord.created_at
            ),
            "expires_at": sa.case(
                (col(BlockRecord.expires_at) > expires_at, BlockRecord.expires_at),
                else_=_time(expires_at),
            ),
            **backoff_values,
        }
        fresh = BlockRecord(
            scope=scope,
            key=key,
            kind=kind,
            message=message,
            job=job,
            created_at=now,
            expires_at=expires_at,
            strikes=strikes,
        )
        self._upsert(_update(BlockRecord).where(*where).values(refresh), fresh)
        with self.db.session() as session:
            return session.exec(select(BlockRecord).where(*where)).one()

    def active_blocks(self, now: datetime) -> list[BlockRecord]:
        _aware(now, "now")
        with self.db.session() as session:
            query = (
                select(BlockRecord)
                .where(col(BlockRecord.expires_at) > now)
                .order_by(col(BlockRecord.scope), col(BlockRecord.key))
            )
            return list(session.exec(query).all())

    def _upsert(self, update: sa.Update, fresh: Any) -> None:
        """UPDATE the row if it exists, else INSERT `fresh`; a racing INSERT means UPDATE."""
        for _ in range(_UPSERT_ROUNDS):
            with self.db.session() as session:
                if session.exec(update).rowcount > 0:
                    session.commit()
                    return
                session.add(fresh)
                try:
                    session.commit()
                    return
                except IntegrityError:
                    session.rollback()
                    session.expunge_all()
        raise RuntimeError(f"upsert of {type(fresh).__name__} kept colliding")

    # ------------------------------------------------------------------ workers

    def register_worker(
        self,
        session: Session,
        *,
        origin: str,
        provider: str | None,
        region: str | None,
        label: str | None,
        vm: str | None,
        job: str | None,
        capabilities: dict[str, Any],
        state: str,
    ) -> WorkerRecord:
        """Add a worker row to the caller's transaction (flushed, not committed). The
        registration is its first sign of life; its health is the probe's GPU verdict. A
        managed worker belongs to the run its machine was made for."""
        now = utcnow()
        run = None
        if vm is not None:
            run = session.exec(select(VmRecord.run).where(VmRecord.vm == vm)).first()
        runtime_ok = capabilities.get("gpu_runtime_ok") is True
        row = WorkerRecord(
            origin=_check(origin, WORKER_ORIGINS, "worker origin"),
            provider=provider,
            region=region,
            label=label,
            vm=vm,
            capabilities=dict(capabilities),
            state=_check(state, WORKER_STATES, "worker state"),
            job=job,
            run=run or NO_RUN,
            registered_at=now,
            updated_at=now,
            last_seen_at=now,
            health="healthy" if runtime_ok else "unhealthy",
            health_detail=None if runtime_ok else capabilities.get("gpu_runtime_error"),
        )
        session.add(row)
        session.flush()
        return row

    def undo_registration(self, token_sha256: str, worker_id: str) -> None:
        """Take back a committed registration the job refused: the token is unused again and
        the worker row (and its credential) is gone, as if the request had never arrived."""
        with self.db.session() as session:
            session.exec(
                _update(JoinToken)
                .where(col(JoinToken.token_sha256) == token_sha256)
                .values(used_at=None)
            )
            delete_worker_credentials(session, worker_id)
            session.exec(sa.delete(WorkerRecord).where(col(WorkerRecord.id) == worker_id))
            session.commit()

    def reserve_worker(
        self, *, job: str, eligible: Callable[[WorkerRecord], bool], run: str | None = None
    ) -> WorkerRecord | None:
        """Reserve the oldest idle existing worker that `eligible` accepts for the job's `run`,
        or return None. A draining worker (`gpuprov workers drain`) or a lost one is never
        reserved.

        Each claim is `UPDATE ... WHERE id = ? AND state = 'idle'` (and still alive, not
        draining): when another job, a drain or the liveness sweep got there first it changes
        nothing and the next candidate is tried.
        """
        available = (
            col(WorkerRecord.state) == "idle",
            sa.not_(col(WorkerRecord.draining)),
            col(WorkerRecord.liveness) == "alive",
        )
        with self.db.session() as session:
            query = (
                select(WorkerRecord)
                .where(*available, WorkerRecord.origin == "existing")
                .order_by(col(WorkerRecord.registered_at), col(WorkerRecord.id))
            )
            candidates = list(session.exec(query).all())
        for candidate in candidates:
            if not eligible(candidate):
                continue
            with self.db.session() as session:
                claim = (
                    _update(WorkerRecord)
                    .where(col(WorkerRecord.id) == candidate.id, *available)
                    .values(state="reserved", job=job, run=run or NO_RUN, updated_at=utcnow())
                )
                if session.exec(claim).rowcount == 1:
                    session.commit()
                    return session.get(WorkerRecord, candidate.id, populate_existing=True)
                session.rollback()
        return None

    def set_worker_state(self, worker_id: str, state: str, job: str | None) -> None:
        """Set the worker's state; "revoked" revokes its credential in the same transaction. A
        worker without a job belongs to no run; one with a job keeps the run it has."""
        _check(state, WORKER_STATES, "worker state")
        values: dict[str, Any] = {"state": state, "job": job, "updated_at": utcnow()}
        if job is None:
            values["run"] = NO_RUN
        with self.db.session() as session:
            result = session.exec(
                _update(WorkerRecord).where(col(WorkerRecord.id) == worker_id).values(values)
            )
            if result.rowcount == 0:
                raise KeyError(f"no worker {worker_id!r}")
            if state == "revoked":
                revoke_worker_credentials(session, utcnow(), col(WorkerRecord.id) == worker_id)
            session.commit()

    def mark_placed(self, job: str, vms: Sequence[str], worker_ids: Sequence[str]) -> None:
        """At ready, in one transaction: the rows of `vms` that exist say running, and those of
        `worker_ids` still reserved become busy for `job` (a worker released or revoked
        meanwhile is left as it is)."""
        now = utcnow()
        with self.db.session() as session:
            if vms:
                session.exec(
                    _update(VmRecord)
                    .where(col(VmRecord.vm).in_(list(vms)))
                    .values(status="running")
                )
            if worker_ids:
                session.exec(
                    _update(WorkerRecord)
                    .where(
                        col(WorkerRecord.id).in_(list(worker_ids)),
                        col(WorkerRecord.state) == "reserved",
                    )
                    .values(state="busy", job=job, updated_at=now)
                )
            session.commit()

    def get_worker(self, worker_id: str) -> WorkerRecord | None:
        with self.db.session() as session:
            return session.get(WorkerRecord, worker_id)

    def workers_of_vms(self, vms: Sequence[str]) -> dict[str, WorkerRecord]:
        """The managed, unrevoked worker registered for each VM that has one (the latest, if a
        node registered twice)."""
        if not vms:
            return {}
        with self.db.session() as session:
            query = (
                select(WorkerRecord)
                .where(
                    col(WorkerRecord.vm).in_(list(vms)),
                    col(WorkerRecord.origin) == "managed",
                    col(WorkerRecord.state) != "revoked",
                )
                .order_by(col(WorkerRecord.registered_at), col(WorkerRecord.id))
            )
            return {row.vm: row for row in session.exec(query).all() if row.vm is not None}

    def workers(self, *, state: str | None = None, job: str | None = None) -> list[WorkerRecord]:
        """Every worker (of `state`, of `job`), oldest registration first."""
        with self.db.session() as session:
            query = select(WorkerRecord).order_by(
                col(WorkerRecord.registered_at), col(WorkerRecord.id)
            )
            if state is not None:
                query = query.where(WorkerRecord.state == _check(state, WORKER_STATES, "state"))
            if job is not None:
                query = query.where(WorkerRecord.job == job)
            return list(session.exec(query).all())

    def workers_for_job(self, job: str) -> list[WorkerRecord]:
        with self.db.session() as session:
            query = (
                select(WorkerRecord)
                .where(WorkerRecord.job == job)
                .order_by(col(WorkerRecord.registered_at), col(WorkerRecord.id))
            )
            return list(session.exec(query).all())

    def release_job_workers(self, job: str, run: str | None = None) -> list[WorkerRecord]:
        """The job's existing workers go back to idle; its managed workers are revoked (they
        keep the job and run for the record), and so are their credentials. With `run`, only
        that run's workers. Returns the rows that changed; a repeat returns []."""
        now = utcnow()
        of_run = () if run is None else (col(WorkerRecord.run) == run,)
        of_job = (col(WorkerRecord.job) == job, *of_run, col(WorkerRecord.state) != "revoked")
        with self.db.session() as session:
            changed: list[WorkerRecord] = []
            for origin, values in (
                ("existing", {"state": "idle", "job": None, "run": NO_RUN, "updated_at": now}),
                ("managed", {"state": "revoked", "updated_at": now}),
            ):
                update = (
                    sa.update(WorkerRecord)
                    .where(*of_job, col(WorkerRecord.origin) == origin)
                    .values(values)
                    .returning(WorkerRecord)
                    .execution_options(synchronize_session=False, populate_existing=True)
                )
                changed.extend(session.exec(update).scalars().all())
            revoked = (col(WorkerRecord.job) == job, *of_run, col(WorkerRecord.state) == "revoked")
            revoke_worker_credentials(session, now, *revoked)
            session.commit()
        return sorted(changed, key=lambda worker: (worker.registered_at, worker.id))

    # ------------------------------------------------------------------ orphans

    def record_orphan(
        self,
        *,
        provider: str,
        region: str,
        zone: str | None,
        vm: str,
        instance_ids: list[str],
        error: str,
        retried: bool = True,
    ) -> OrphanRecord:
        """Record a machine whose termination failed; while it is unresolved, a repeat refreshes
        last_seen, last_error and instance_ids, and bumps attempts when it was a retry of the
        deletion (`retried`; a job recording its own teardown again is not: the reconciler's
        backoff counts its own tries). The VM's row, where there
        is one, says `orphaned`, unless the user kept the machine on purpose."""
        row = self.get_vm(vm)
        if row is not None and row.status not in ("orphaned", "kept"):
            self.set_vm_status(vm, "orphaned")
        now = utcnow()
        where = (col(OrphanRecord.vm) == vm, col(OrphanRecord.resolved_at).is_(None))
        update = (
            _update(OrphanRecord)
            .where(*where)
            .values(
                provider=provider,
                region=region,
                zone=zone,
                instance_ids=list(instance_ids),
                last_seen=now,
                last_error=error,
                attempts=OrphanRecord.attempts + (1 if retried else 0),
            )
        )
        fresh = OrphanRecord(
            provider=provider,
            region=region,
            zone=zone,
            vm=vm,
            instance_ids=list(instance_ids),
            first_seen=now,
            last_seen=now,
            last_error=error,
            attempts=1,
        )
        self._upsert(update, fresh)
        with self.db.session() as session:
            return session.exec(select(OrphanRecord).where(*where)).one()

    def resolve_orphan(self, vm: str) -> bool:
        """Mark the VM's open orphan resolved; False when none was open (a repeat)."""
        with self.db.session() as session:
            result = session.exec(
                _update(OrphanRecord)
                .where(col(OrphanRecord.vm) == vm, col(OrphanRecord.resolved_at).is_(None))
                .values(resolved_at=utcnow())
            )
            session.commit()
        return result.rowcount > 0

    def open_orphans(self) -> list[OrphanRecord]:
        return self.orphans()

    def orphans(self, *, include_resolved: bool = False) -> list[OrphanRecord]:
        """Open orphans (and resolved ones too when asked), oldest first."""
        with self.db.session() as session:
            query = select(OrphanRecord).order_by(
                col(OrphanRecord.first_seen), col(OrphanRecord.id)
            )
            if not include_resolved:
                query = query.where(col(OrphanRecord.resolved_at).is_(None))
            return list(session.exec(query).all())

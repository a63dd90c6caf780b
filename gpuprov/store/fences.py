"""The fence of each VM identity (table vm_fences): a teardown never races a cloud call.

A prepare or create can still reach the cloud after its job has begun tearing the node down: a
retry the server scheduled after a worker stopped heartbeating, a worker that was only slow
(its attempt timed out, it carries on), a call in flight when the job was cancelled. Three
atomic statements keep them apart, whatever process runs them:

- `claim(vm, owner, until)`: before a prepare or create calls the cloud. CLAIMED: go ahead, and
  `renew` the claim while the call runs; FENCED: the teardown has begun, call nothing; BUSY: an
  earlier attempt's call may still land until `until` (wait, then observe and adopt).
- `release(vm, owner)`: the call answered (success or the cloud's refusal). A call interrupted
  without an answer keeps its claim until it lapses: the request may still land.
- `fence(vm)`: the teardown begins. From then on every claim is refused; it returns until when
  an earlier call may still land (None: none in flight), and the teardown waits for that
  before it looks for what to delete. The VM's row says `terminating`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from sqlmodel import col, select

from gpuprov.store.db import Database, UtcDateTime, VmFence, VmRecord, dialect_insert, utcnow

# VM rows in these states are being torn down once the fence is up.
_LIVE_VM_STATUSES = ("recorded", "created", "running")


def _update() -> sa.Update:
    # Each method re-reads after writing: the session never holds a stale copy we care about.
    return sa.update(VmFence).execution_options(synchronize_session=False)


class ClaimOutcome(StrEnum):
    CLAIMED = "claimed"
    FENCED = "fenced"
    BUSY = "busy"


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    until: datetime | None = None  # BUSY: the other call's claim lapses then


class VmFences:
    def __init__(self, db: Database) -> None:
        self._db = db

    def claim(self, vm: str, owner: str, until: datetime) -> Claim:
        now = utcnow()
        self._ensure_row(vm, now)
        claim = (
            _update()
            .where(
                col(VmFence.vm) == vm,
                col(VmFence.fenced_at).is_(None),
                sa.or_(
                    col(VmFence.call_until).is_(None),
                    col(VmFence.call_until) <= now,
                    col(VmFence.call_owner) == owner,
                ),
            )
            .values(call_owner=owner, call_until=until, updated_at=now)
        )
        with self._db.session() as session:
            claimed = session.exec(claim).rowcount > 0
            session.commit()
            if claimed:
                return Claim(ClaimOutcome.CLAIMED)
            row = session.exec(select(VmFence).where(VmFence.vm == vm)).one()
        if row.fenced_at is not None:
            return Claim(ClaimOutcome.FENCED)
        return Claim(ClaimOutcome.BUSY, row.call_until)

    def renew(self, vm: str, owner: str, until: datetime) -> bool:
        """Extend this owner's claim; False when it is no longer this owner's."""
        renew = (
            _update()
            .where(col(VmFence.vm) == vm, col(VmFence.call_owner) == owner)
            .values(call_until=until, updated_at=utcnow())
        )
        with self._db.session() as session:
            renewed = session.exec(renew).rowcount > 0
            session.commit()
        return renewed

    def release(self, vm: str, owner: str) -> None:
        release = (
            _update()
            .where(col(VmFence.vm) == vm, col(VmFence.call_owner) == owner)
            .values(call_owner=None, call_until=None, updated_at=utcnow())
        )
        with self._db.session() as session:
            session.exec(release)
            session.commit()

    def fence(self, vm: str) -> datetime | None:
        """Raise the fence (once; a repeat keeps the first moment) and mark the VM's row
        terminating; returns until when an earlier call may still land, or None."""
        now = utcnow()
        self._ensure_row(vm, now)
        first = sa.func.coalesce(VmFence.fenced_at, sa.literal(now, UtcDateTime()))
        raise_fence = _update().where(col(VmFence.vm) == vm).values(fenced_at=first, updated_at=now)
        terminating = (
            sa.update(VmRecord)
            .execution_options(synchronize_session=False)
            .where(col(VmRecord.vm) == vm, col(VmRecord.status).in_(_LIVE_VM_STATUSES))
            .values(status="terminating")
        )
        with self._db.session() as session:
            session.exec(raise_fence)
            session.exec(terminating)
            session.commit()
            row = session.exec(select(VmFence).where(VmFence.vm == vm)).one()
        if row.call_until is not None and row.call_until > utcnow():
            return row.call_until
        return None

    def in_flight_until(self, vm: str) -> datetime | None:
        """Until when a claimed call may still land (None: none, or it lapsed)."""
        with self._db.session() as session:
            row = session.exec(select(VmFence).where(VmFence.vm == vm)).first()
        if row is None or row.call_until is None or row.call_until <= utcnow():
            return None
        return row.call_until

    def _ensure_row(self, vm: str, now: datetime) -> None:
        """The VM's fence row, written once, whoever writes it first. Read first: most calls
        find it, and a read takes no write lock (on SQLite, the one lock every writer waits
        for)."""
        insert = dialect_insert(self._db.dialect)
        table = VmFence.__table__  # type: ignore[attr-defined]
        with self._db.session() as session:
            if session.exec(select(VmFence.vm).where(VmFence.vm == vm)).first() is not None:
                return
            session.execute(
                insert(table)
                .values(vm=vm, updated_at=now)
                .on_conflict_do_nothing(index_elements=["vm"])
            )
            session.commit()

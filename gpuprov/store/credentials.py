"""Operator API keys and worker credentials: minted here, shown once, stored as SHA-256.

    gpo_<id>_<secret>   an operator API key (`gpuprov apikey create`): operators and services
    gpw_<id>_<secret>   a worker's credential, returned once by its registration

`<id>` finds the row; `<secret>` is 32 random bytes (urlsafe base64). The database keeps only
the SHA-256 of the whole string, compared in constant time (`hmac.compare_digest`). The prefix
says what a leaked string is (secret scanners look for such prefixes) and keeps a worker's
credential from ever passing as an operator's key.

A worker's credential dies with the worker: `revoke_worker_credentials` runs in the same
transaction as every statement that revokes a worker (gpuprov/store/records.py), and `worker()`
refuses a revoked worker's credential anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from gpuprov.store.db import (
    ROLES,
    Database,
    OperatorKey,
    TeamRecord,
    WorkerCredential,
    WorkerRecord,
    utcnow,
)

OPERATOR_PREFIX = "gpo"
WORKER_PREFIX = "gpw"
SECRET_BYTES = 32
_PRESENTED = re.compile(r"(gpo|gpw)_([0-9a-f]{32})_([A-Za-z0-9_-]{43,})")
MAX_NAME = 128


class KeyRefused(ValueError):
    """An operator key that cannot be minted as asked; `argument` names what is wrong."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _mint(prefix: str, row_id: str) -> str:
    return f"{prefix}_{row_id}_{secrets.token_urlsafe(SECRET_BYTES)}"


def _parse(presented: str, prefix: str) -> str | None:
    """The row id of a well-formed secret of this kind, else None."""
    match = _PRESENTED.fullmatch(presented)
    if match is None or match.group(1) != prefix:
        return None
    return match.group(2)


def _matches(row: Any, presented: str) -> bool:
    return row is not None and hmac.compare_digest(row.secret_sha256, sha256(presented))


def revoke_worker_credentials(session: Session, now: datetime, *workers: Any) -> None:
    """In the caller's transaction: revoke the live credentials of the workers matching the
    conditions `workers` (on WorkerRecord columns)."""
    chosen = select(WorkerRecord.id).where(*workers)
    session.exec(
        sa.update(WorkerCredential)
        .where(
            col(WorkerCredential.revoked_at).is_(None),
            col(WorkerCredential.worker_id).in_(chosen.scalar_subquery()),
        )
        .values(revoked_at=now)
        .execution_options(synchronize_session=False)
    )


def issue_worker_credential(session: Session, worker_id: str) -> str:
    """In the caller's transaction: a new credential for the worker; the plaintext is returned
    once and never stored."""
    row = WorkerCredential(worker_id=worker_id, secret_sha256="", created_at=utcnow())
    plaintext = _mint(WORKER_PREFIX, row.id)
    row.secret_sha256 = sha256(plaintext)
    session.add(row)
    session.flush()
    return plaintext


def delete_worker_credentials(session: Session, worker_id: str) -> None:
    """In the caller's transaction: forget the worker's credentials (a registration undone)."""
    session.exec(sa.delete(WorkerCredential).where(col(WorkerCredential.worker_id) == worker_id))


_WORKER_OF_CREDENTIAL = (
    sa.select(WorkerCredential.secret_sha256, WorkerCredential.revoked_at, WorkerRecord.id)
    .join(WorkerRecord, col(WorkerRecord.id) == col(WorkerCredential.worker_id))
    .where(
        col(WorkerCredential.id) == sa.bindparam("credential_id", type_=sa.String()),
        col(WorkerRecord.state) != "revoked",
    )
)


def live_worker_id(connection: sa.Connection, presented: str) -> str | None:
    """In the caller's transaction (plain Core: a batch of heartbeats checks one each): the id
    of the live worker whose live credential `presented` is, else None."""
    credential_id = _parse(presented, WORKER_PREFIX)
    if credential_id is None:
        return None
    found = connection.execute(_WORKER_OF_CREDENTIAL, {"credential_id": credential_id}).first()
    if found is None:
        return None
    secret_sha256, revoked_at, worker_id = found
    if not hmac.compare_digest(secret_sha256, sha256(presented)) or revoked_at is not None:
        return None
    return worker_id


class Credentials:
    """Reads and writes of operator_keys and worker_credentials; each call its own transaction.
    Authentication reads only: a refused secret changes nothing."""

    def __init__(self, db: Database) -> None:
        self.db = db
        # Built once: a worker's credential is checked on every heartbeat.
        self._worker_by_credential = (
            select(WorkerCredential.secret_sha256, WorkerCredential.revoked_at, WorkerRecord)
            .join(WorkerRecord, col(WorkerRecord.id) == col(WorkerCredential.worker_id))
            .where(col(WorkerCredential.id) == sa.bindparam("credential_id"))
        )

    # ------------------------------------------------------------------ operator keys

    def create_operator_key(
        self, name: str, *, role: str = "admin", team: str | None = None
    ) -> tuple[OperatorKey, str]:
        """A new key named `name` (who or what uses it) with `role`, of `team` (an admin's may
        have none: it reaches every team; a member's or viewer's must name one, which must
        exist); (its row, the key shown once). KeyRefused names the argument at fault."""
        name = name.strip()
        if not name or len(name) > MAX_NAME:
            raise KeyRefused("name", f"an API key's name must be 1-{MAX_NAME} characters")
        if role not in ROLES:
            raise KeyRefused("role", f"{role!r} is not a role ({', '.join(ROLES)})")
        if team is None and role != "admin":
            raise KeyRefused("team", f"a {role}'s key belongs to a team: name one")
        row = OperatorKey(name=name, secret_sha256="", created_at=utcnow(), role=role, team=team)
        plaintext = _mint(OPERATOR_PREFIX, row.id)
        row.secret_sha256 = sha256(plaintext)
        with self.db.session() as session:
            if team is not None and session.get(TeamRecord, team) is None:
                raise KeyRefused("team", f"no team named {team!r} (gpuprov team create {team})")
            session.add(row)
            session.commit()
        return row, plaintext

    def operator_keys(self, *, include_revoked: bool = False) -> list[OperatorKey]:
        with self.db.session() as session:
            query = select(OperatorKey).order_by(col(OperatorKey.created_at), col(OperatorKey.id))
            if not include_revoked:
                query = query.where(col(OperatorKey.revoked_at).is_(None))
            return list(session.exec(query).all())

    def revoke_operator_keys(self, id_or_name: str) -> list[OperatorKey]:
        """Revoke the live key with this id, or every live key with this name; the rows
        revoked ([] when none matched: unknown, or revoked already)."""
        now = utcnow()
        with self.db.session() as session:
            revoked = session.exec(
                sa.update(OperatorKey)
                .where(
                    col(OperatorKey.revoked_at).is_(None),
                    sa.or_(col(OperatorKey.id) == id_or_name, col(OperatorKey.name) == id_or_name),
                )
                .values(revoked_at=now)
                .returning(OperatorKey)
                .execution_options(synchronize_session=False, populate_existing=True)
            )
            rows = list(revoked.scalars().all())
            session.commit()
        return sorted(rows, key=lambda row: (row.created_at, row.id))

    def operator(self, presented: str) -> OperatorKey | None:
        """The live operator key `presented` is, else None."""
        key_id = _parse(presented, OPERATOR_PREFIX)
        if key_id is None:
            return None
        with self.db.session() as session:
            row = session.get(OperatorKey, key_id)
        if not _matches(row, presented) or row.revoked_at is not None:
            return None
        return row

    # ------------------------------------------------------------------ worker credentials

    def worker(self, presented: str) -> WorkerRecord | None:
        """The live worker whose live credential `presented` is, else None. One SELECT: every
        heartbeat of every node comes through here."""
        credential_id = _parse(presented, WORKER_PREFIX)
        if credential_id is None:
            return None
        with self.db.session() as session:
            found = session.exec(
                self._worker_by_credential, params={"credential_id": credential_id}
            ).first()
        if found is None:
            return None
        secret_sha256, revoked_at, worker = found
        if not hmac.compare_digest(secret_sha256, sha256(presented)) or revoked_at is not None:
            return None
        if worker.state == "revoked":
            return None
        return worker

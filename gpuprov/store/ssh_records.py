"""SSH keys in the database: the host key pinned per VM, and the deployment's client keys.

Both are public. A pin is the key a VM must present (injected at create, reported by its cloud,
or seen first at bootstrap); any worker verifies any VM against it, so workers on other hosts
share nothing on disk. The first pin of a VM wins and is never replaced: two workers pinning the
same VM at once get the same answer, and the one that lost compares its key with the winner's.

The client keys are the public halves of the keys workers log in to nodes with. The private
half is configuration (`[ssh] client_key`), never stored. A worker records its key when it
starts, so one that generated a key of its own learns whether the deployment already uses
another (gpuprov/engine/worker.py refuses to start it then).

Synchronous, each method its own transaction, like gpuprov.store.records.Records.
"""

from __future__ import annotations

from typing import Literal

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from gpuprov.store.db import Database, HostKeyPin, SshClientKey, utcnow

ClientKeySource = Literal["configured", "generated"]


class SshRecords:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ host keys

    def pin_host_key(self, vm: str, public_key: str) -> str:
        """Record `public_key` (an OpenSSH line) as the key `vm` must present, unless a key is
        recorded already; returns the recorded line (a different one: another worker or an
        earlier contact pinned first, and that one stands)."""
        recorded = self.host_key(vm)
        if recorded is not None:
            return recorded
        try:
            with self.db.session() as session:
                session.add(HostKeyPin(vm=vm, public_key=public_key, created_at=utcnow()))
                session.commit()
            return public_key
        except IntegrityError:  # another worker pinned it between our read and our insert
            recorded = self.host_key(vm)
            if recorded is None:
                raise
            return recorded

    def host_key(self, vm: str) -> str | None:
        """The OpenSSH line `vm` must present; None when nothing is pinned for it."""
        with self.db.session() as session:
            query = select(HostKeyPin.public_key).where(col(HostKeyPin.vm) == vm)
            return session.exec(query).first()

    # ------------------------------------------------------------------ client keys

    def register_client_key(
        self, fingerprint: str, public_key: str, *, source: ClientKeySource, host: str
    ) -> SshClientKey | None:
        """Record the client key a worker starts with (idempotent per fingerprint).

        A configured key is always accepted (None). A generated key is accepted only while the
        deployment records no other key; otherwise the oldest other key is returned, and a row
        this call added is taken back, so a refused worker leaves nothing that would refuse the
        next one. Of two workers with generated keys registering at once, at most one is
        accepted: each reads after its own insert, so the later reader sees the other's row."""
        added = self._add_client_key(fingerprint, public_key, source, host)
        if source == "configured":
            return None
        with self.db.session() as session:
            query = (
                select(SshClientKey)
                .where(col(SshClientKey.fingerprint) != fingerprint)
                .order_by(col(SshClientKey.registered_at), col(SshClientKey.id))
            )
            other = session.exec(query).first()
        if other is not None and added:
            with self.db.session() as session:
                session.exec(
                    sa.delete(SshClientKey).where(col(SshClientKey.fingerprint) == fingerprint)
                )
                session.commit()
        return other

    def client_keys(self) -> list[SshClientKey]:
        """Every client key recorded for the deployment, oldest first."""
        with self.db.session() as session:
            query = select(SshClientKey).order_by(
                col(SshClientKey.registered_at), col(SshClientKey.id)
            )
            return list(session.exec(query).all())

    def _add_client_key(
        self, fingerprint: str, public_key: str, source: ClientKeySource, host: str
    ) -> bool:
        """Insert the key's row; False when it was there already."""
        row = SshClientKey(
            fingerprint=fingerprint,
            public_key=public_key,
            source=source,
            host=host[:255],
            registered_at=utcnow(),
        )
        try:
            with self.db.session() as session:
                session.add(row)
                session.commit()
        except IntegrityError:
            return False
        return True

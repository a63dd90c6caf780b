"""The secrets vault: values a team's jobs refer to from `env` as `${{ secrets.NAME }}`.

    Vault.set(team, name, value)    store (or replace) a value, encrypted
    Vault.names(team)               what `team` sees (its own and the global ones), never values
    Vault.delete(team, name)        forget one
    Vault.missing(team, names)      the names `team` cannot see (a spec's unknown references)
    Vault.values(team, names)       the plaintexts, for the API to hand to a node with its work

Each value is encrypted with AES-256-GCM under the configured active key (`[secrets]`,
gpuprov/config.py), a fresh 96-bit nonce each time, and the team and name as associated data:
a row copied to another team or name does not decrypt. The row keeps the key's id, so old keys
still decrypt after a rotation. Team "" is global: every team sees it, and a team's own secret
of the same name shadows it. Nothing here logs or returns a value but `values`.

`redact(text, values)` and `resolve(env, values)` are what the API does with the plaintexts: a
value in a node's output becomes `***` before it is stored, and a reference in `env` becomes
its value only in the answer a node's agent gets.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from datetime import datetime

import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlmodel import col, select

from gpuprov.config import SecretsSettings
from gpuprov.models import SECRET_NAME_PATTERN, SECRET_REFERENCE
from gpuprov.store.db import Database, SecretRecord, utcnow
from providers.base import Model

GLOBAL = ""  # the team of a secret every team sees
MAX_VALUE_BYTES = 16 * 1024
MIN_VALUE_CHARS = 4  # shorter values would turn every such string in the output into ***
REDACTED = "***"
NONCE_BYTES = 12


class VaultLocked(Exception):
    """No active key is configured: nothing can be stored (or a stored value's key is gone)."""


class SecretRefused(ValueError):
    """A name or value that cannot be stored; the message names which."""


class SecretView(Model):
    """What anyone may see of a secret: never its value."""

    name: str
    team: str | None  # None: global
    created_at: datetime
    updated_at: datetime


def _associated(team: str, name: str) -> bytes:
    return f"gpuprov-secret\x00{team}\x00{name}".encode()


def check_name(name: str) -> str:
    if not re.fullmatch(SECRET_NAME_PATTERN, name):
        raise SecretRefused(
            f"name: {name[:64]!r} is not a secret name (letters, digits and _, not starting "
            "with a digit, at most 128)"
        )
    return name


def check_value(value: str) -> str:
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise SecretRefused(f"value: at most {MAX_VALUE_BYTES} bytes")
    if len(value) < MIN_VALUE_CHARS:
        raise SecretRefused(
            f"value: at least {MIN_VALUE_CHARS} characters (a shorter one could not be told "
            "from ordinary output, to be hidden as ***)"
        )
    if "\x00" in value:
        raise SecretRefused("value: no NUL characters (it becomes an environment variable)")
    return value


class Vault:
    """Reads and writes of `secrets`; each call its own transaction."""

    def __init__(self, db: Database, keys: Mapping[str, bytes], active_key: str | None) -> None:
        self.db = db
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self._active = active_key

    @classmethod
    def configured(cls, db: Database, settings: SecretsSettings) -> Vault:
        """The vault with `[secrets]`'s keys."""
        return cls(db, settings.key_bytes(), settings.active_key)

    @property
    def unlocked(self) -> bool:
        """New values can be stored."""
        return self._active is not None and self._active in self._ciphers

    def set(self, team: str, name: str, value: str) -> SecretView:
        check_name(name)
        check_value(value)
        if not self.unlocked or self._active is None:
            raise VaultLocked(
                "no secrets key is configured, so no secret can be stored: set [secrets] keys "
                "and active_key (base64 of 32 random bytes: head -c 32 /dev/urandom | base64) "
                "where the API runs"
            )
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self._active].encrypt(nonce, value.encode(), _associated(team, name))
        now = utcnow()
        with self.db.session() as session:
            row = session.exec(
                select(SecretRecord).where(SecretRecord.team == team, SecretRecord.name == name)
            ).first()
            if row is None:
                row = SecretRecord(team=team, name=name, key_id="", nonce=b"", ciphertext=b"")
                row.created_at = now
            row.key_id, row.nonce, row.ciphertext, row.updated_at = (
                self._active,
                nonce,
                sealed,
                now,
            )
            session.add(row)
            session.commit()
            session.refresh(row)
            return _view(row)

    def names(self, team: str | None) -> list[SecretView]:
        """The secrets `team` sees (its own and the global ones); every one for None."""
        with self.db.session() as session:
            query = select(SecretRecord).order_by(col(SecretRecord.team), col(SecretRecord.name))
            if team is not None:
                query = query.where(col(SecretRecord.team).in_([team, GLOBAL]))
            return [_view(row) for row in session.exec(query).all()]

    def delete(self, team: str, name: str) -> bool:
        with self.db.session() as session:
            deleted = session.exec(
                sa.delete(SecretRecord).where(
                    col(SecretRecord.team) == team, col(SecretRecord.name) == name
                )
            )
            session.commit()
        return bool(deleted.rowcount)

    def missing(self, team: str, names: Iterable[str]) -> list[str]:
        wanted = sorted(set(names))
        if not wanted:
            return []
        with self.db.session() as session:
            found = set(
                session.exec(
                    select(SecretRecord.name).where(
                        col(SecretRecord.team).in_([team, GLOBAL]),
                        col(SecretRecord.name).in_(wanted),
                    )
                ).all()
            )
        return [name for name in wanted if name not in found]

    def values(self, team: str, names: Iterable[str]) -> dict[str, str]:
        """The plaintexts of the named secrets `team` sees (its own before the global ones);
        names it cannot see are left out. VaultLocked when a value's key is not configured."""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        with self.db.session() as session:
            rows = session.exec(
                select(SecretRecord).where(
                    col(SecretRecord.team).in_([team, GLOBAL]),
                    col(SecretRecord.name).in_(wanted),
                )
            ).all()
        chosen: dict[str, SecretRecord] = {}
        for row in sorted(rows, key=lambda row: row.team != GLOBAL):  # global first, then own
            chosen[row.name] = row
        return {name: self._open(row) for name, row in chosen.items()}

    def _open(self, row: SecretRecord) -> str:
        cipher = self._ciphers.get(row.key_id)
        if cipher is None:
            raise VaultLocked(
                f"secret {row.name!r} was stored with key {row.key_id!r}, which is not "
                "configured in [secrets] keys"
            )
        try:
            plain = cipher.decrypt(row.nonce, row.ciphertext, _associated(row.team, row.name))
        except InvalidTag:
            raise VaultLocked(
                f"secret {row.name!r} does not decrypt with key {row.key_id!r} (altered, or "
                "moved from another team or name)"
            ) from None
        return plain.decode()


def _view(row: SecretRecord) -> SecretView:
    return SecretView(
        name=row.name,
        team=row.team or None,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def unknown_secret(variable: str, name: str, team: str) -> str:
    """The one-line refusal of a job whose `env.<variable>` names a secret its team cannot see
    (the same words from the API, the CLI and the job's own admission)."""
    return (
        f"env.{variable}: no secret named {name!r} that team {team!r} can see "
        f"(gpuprov secret list --team {team})"
    )


def referenced(env: Mapping[str, str]) -> list[str]:
    """Every secret name `env`'s values refer to."""
    return sorted({name for value in env.values() for name in SECRET_REFERENCE.findall(value)})


def resolve(env: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """`env` with each reference replaced by its value (a reference without one is left as
    it is: the job's admission refused unknown names already)."""

    def value_of(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group(0))

    return {name: SECRET_REFERENCE.sub(value_of, text) for name, text in env.items()}


def redact(text: str, values: Iterable[str]) -> str:
    """`text` with every occurrence of each value replaced by ***, longest value first (so a
    value that contains another is hidden whole)."""
    for value in sorted({v for v in values if v}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text

"""The secrets a node's work refers to: resolved for its agent, hidden in what it reports.

`GET /v1/work` answers the work's `env` with each `${{ secrets.NAME }}` replaced by the value
the job's team sees (gpuprov/store/secrets.py); the row in the database keeps the reference.
Every chunk of output and every exit tail the node reports has each of those values replaced
by `***` before it is stored, so the log chunks, the status, failure messages and every API
answer built from them never hold one. A value printed split across two chunks is not seen by
either chunk's check; the agent sends whole lines where it can.

The values of a run are read once and kept for a short while (a node reports its output often),
bounded in memory; a secret changed meanwhile is seen within `TTL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from fastapi import HTTPException

from gpuprov.models import DEFAULT_TEAM
from gpuprov.store.db import WorkRecord
from gpuprov.store.secrets import Vault, VaultLocked, redact, referenced, resolve
from gpuprov.store.teams import Teams
from gpuprov.store.work import RunCommand

TTL_SECONDS = 30.0
MAX_RUNS = 1024


class WorkSecrets:
    def __init__(
        self, vault: Vault, teams: Teams, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._vault = vault
        self._teams = teams
        self._clock = clock
        self._cache: OrderedDict[tuple[str, str, tuple[str, ...]], tuple[float, dict[str, str]]]
        self._cache = OrderedDict()

    def _values(self, row: WorkRecord) -> dict[str, str]:
        names = tuple(referenced(RunCommand.model_validate(row.command).env))
        if not names:
            return {}
        key = (row.job, row.run, names)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            self._cache.move_to_end(key)
            return cached[1]
        team = self._teams.team_of(row.job, row.run or None) or DEFAULT_TEAM
        values = self._vault.values(team, names)
        self._cache[key] = (now + TTL_SECONDS, values)
        while len(self._cache) > MAX_RUNS:
            self._cache.popitem(last=False)
        return values

    async def values(self, row: WorkRecord) -> dict[str, str]:
        try:
            return await asyncio.to_thread(self._values, row)
        except VaultLocked as locked:
            # The node retries: the values must never be dropped for an unresolved reference.
            raise HTTPException(503, f"the work's secrets cannot be read now: {locked}") from None

    async def resolved(self, row: WorkRecord) -> RunCommand:
        """The work's command with its references resolved, for its agent only."""
        command = RunCommand.model_validate(row.command)
        values = await self.values(row)
        if not values:
            return command
        return command.model_copy(update={"env": resolve(command.env, values)})

    async def hidden(self, row: WorkRecord, text: str) -> str:
        """`text` with every secret value the work was given replaced by ***."""
        values = await self.values(row)
        return redact(text, values.values()) if values else text

"""Who may call the control-plane API: FastAPI dependencies that every endpoint declares.

    Depends(require_operator)   an operator API key:       Authorization: Bearer gpo_...
    Depends(require_viewer)     an operator key of any role: reads its own team's
    Depends(require_member)     a member's or an admin's key: acts on its own team's jobs
    Depends(require_admin)      an admin's key: everything, every team
    Depends(require_worker)     a registered worker's credential: Authorization: Bearer gpw_...
    Depends(guard)              for endpoints that check a secret themselves (registration's
                                join token): `Guard.refused(secret, detail)` on a bad one

Every operator route declares its role with one of the three role dependencies (the route x
role table in tests/gpuprov/test_roles.py walks them all): a key below the role is 403 and
changes nothing. A route about one team's things (a job's logs and cost, a worker of a job, a
team's secrets) also checks the team: `Caller.reads(team)` and `Caller.acts_on(team)`, 403
naming both teams when the key's team is another. An admin key belongs to no team and reaches
every one; a member's or viewer's belongs to exactly one.

Only /v1/health is open. A refused secret is 401 with `WWW-Authenticate: Bearer`, and the
lookup only reads, so a refused call changes nothing in the database.

Throttling costs only failures, never a good secret. Every secret is checked first (a worker's
credential or an operator's key by its row, a join token by its SHA-256, both single indexed
reads; a malformed one without the database), and a valid one is served whoever sent it. Only a
refusal is counted, twice: against the client's address and against the refused secret itself
(its SHA-256), each a sliding window (`AuthFailures`). A refusal while either count is full is
429 with Retry-After instead of 401. So a stream of bad tokens from one address (every node
behind one NAT gateway shares it) slows only that stream, never a neighbour's registration or
heartbeat, and one bad secret retried from many addresses is slowed too. Secrets are 32 random
bytes, so guessing one is hopeless either way; the throttle keeps refusals cheap and tells a
misconfigured client to back off. The tables are bounded, the least recently failing forgotten
first.

`install(app, credentials)` puts what the dependencies need in `app.state`. Behind a reverse
proxy, the client address is the proxy's unless uvicorn trusts its X-Forwarded-For
(`--forwarded-allow-ips`, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpuprov.store.credentials import Credentials
from gpuprov.store.db import ROLES, OperatorKey, WorkerRecord
from providers.base import Model

# An address (or one secret) may be refused this many times within the window; the next
# refusal is 429. A valid secret is never refused, so this never holds one up.
MAX_FAILURES = 20
WINDOW_SECONDS = 60.0
MAX_CLIENTS = 10_000  # addresses and secrets remembered; memory below MAX_CLIENTS x MAX_FAILURES

# What an endpoint documents about its refusals (OpenAPI), merged into its `responses`.
REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing, unknown or revoked credential"},
    429: {
        "description": "a bad secret, from an address (or the same bad secret) refused too "
        "often lately; see Retry-After. A valid one is never throttled"
    },
}

# What a route that checks the caller's role (and team) documents besides REFUSALS.
FORBIDDEN: dict[int | str, dict[str, Any]] = {
    403: {"description": "the key's role, or its team, does not allow this"},
}
ROLE_REFUSALS: dict[int | str, dict[str, Any]] = {**REFUSALS, **FORBIDDEN}

# What the body-limit middleware answers any request that carries a body.
BODY_REFUSALS: dict[int | str, dict[str, Any]] = {
    408: {"description": "the body did not arrive in time"},
    413: {"description": "body over 64 KiB"},
}

_operator_key = HTTPBearer(
    scheme_name="OperatorKey",
    description="An operator API key (gpuprov apikey create): `Bearer gpo_...`",
    auto_error=False,
)
worker_credential = HTTPBearer(
    scheme_name="WorkerCredential",
    description="The credential a worker's registration returned: `Bearer gpw_...`",
    auto_error=False,
)


class AuthFailures:
    """Recent authentication failures per key (a client address, a refused secret's digest):
    a sliding window each, bounded memory."""

    def __init__(
        self,
        limit: int = MAX_FAILURES,
        window: float = WINDOW_SECONDS,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until `client` may try again, or None when it may now."""
        times = self._failures.get(client)
        if not times:
            return None
        now = self._clock()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        if len(times) < self.limit:
            return None
        return max(1, math.ceil(times[0] + self.window - now))

    def failed(self, client: str) -> None:
        times = self._failures.pop(client, None) or deque(maxlen=self.limit)
        times.append(self._clock())
        self._failures[client] = times  # now the most recent
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)


def install(app: FastAPI, credentials: Credentials | None, failures: AuthFailures | None) -> None:
    app.state.credentials = credentials
    app.state.auth_failures = failures if failures is not None else AuthFailures()


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _secret_key(secret: str) -> str:
    """What a refused secret is counted under: its digest, never the secret itself."""
    return "secret:" + hashlib.sha256(secret.encode()).hexdigest()


class Guard:
    """One request's view of the throttle: whether its bad secret would be throttled now, and
    the refusal to raise for one (401, counted; or 429 while its address or the secret itself
    was refused too often)."""

    def __init__(self, request: Request) -> None:
        self._failures: AuthFailures = request.app.state.auth_failures
        self._address = client_address(request)

    def _keys(self, secret: str | None) -> list[str]:
        return [self._address] if not secret else [self._address, _secret_key(secret)]

    def wait(self, secret: str | None) -> int | None:
        """Seconds until a refusal of `secret` from this address is 401 again; None: now."""
        waits = [self._failures.retry_after(key) for key in self._keys(secret)]
        return max((wait for wait in waits if wait is not None), default=None)

    def refused(self, secret: str | None, detail: str) -> HTTPException:
        wait = self.wait(secret)
        if wait is not None:
            return too_many(wait)
        for key in self._keys(secret):
            self._failures.failed(key)
        return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def too_many(wait: int) -> HTTPException:
    return HTTPException(
        429,
        "too many bad secrets from this address; try again later",
        headers={"Retry-After": str(wait)},
    )


async def guard(request: Request) -> Guard:
    return Guard(request)


async def require_operator(
    request: Request,
    throttle: Annotated[Guard, Depends(guard)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_operator_key)],
) -> OperatorKey:
    """The caller's operator API key; 401 without a live one (429 while throttled)."""
    if bearer is None:
        raise throttle.refused(
            None, "an operator API key is required (Authorization: Bearer gpo_...)"
        )
    credentials: Credentials = request.app.state.credentials
    key = await asyncio.to_thread(credentials.operator, bearer.credentials)
    if key is None:
        raise throttle.refused(bearer.credentials, "unknown or revoked operator API key")
    return key


async def require_worker(
    request: Request,
    throttle: Annotated[Guard, Depends(guard)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(worker_credential)],
) -> WorkerRecord:
    """The calling worker, by its credential; 401 without a live one (a revoked worker's too;
    429 while throttled)."""
    if bearer is None:
        raise throttle.refused(
            None, "a worker credential is required (Authorization: Bearer gpw_...)"
        )
    credentials: Credentials = request.app.state.credentials
    worker = await asyncio.to_thread(credentials.worker, bearer.credentials)
    if worker is None:
        raise throttle.refused(bearer.credentials, "unknown or revoked worker credential")
    return worker


# ---------------------------------------------------------------- roles and teams


class Caller(Model):
    """Who an operator API key is: its role (ROLES) and its team (None: an admin's, every team)."""

    key_id: str
    name: str
    role: str
    team: str | None

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def reads(self, team: str) -> bool:
        """May see `team`'s jobs, workers, logs, cost and secret names."""
        return self.admin or team == self.team

    def acts_on(self, team: str) -> bool:
        """May submit, release and cancel `team`'s jobs and set its secrets."""
        return self.admin or (self.role == "member" and team == self.team)

    def forbidden(self, team: str, what: str) -> HTTPException:
        mine = f"team {self.team!r}" if self.team else "no team"
        return HTTPException(403, f"this key ({self.role}, {mine}) may not {what} of team {team!r}")

    def check_reads(self, team: str, what: str) -> None:
        if not self.reads(team):
            raise self.forbidden(team, f"read {what}")

    def check_acts_on(self, team: str, what: str) -> None:
        if not self.acts_on(team):
            raise self.forbidden(team, f"change {what}")


def caller_of(key: OperatorKey) -> Caller:
    role = key.role if key.role in ROLES else "viewer"  # an unknown role is the least of them
    return Caller(key_id=key.id, name=key.name, role=role, team=key.team)


def _at_least(key: OperatorKey, role: str) -> Caller:
    caller = caller_of(key)
    if ROLES.index(caller.role) > ROLES.index(role):
        raise HTTPException(403, f"this route needs the {role} role; this key is a {caller.role}")
    return caller


async def require_viewer(key: Annotated[OperatorKey, Depends(require_operator)]) -> Caller:
    """Any live operator key: a viewer, a member or an admin."""
    return _at_least(key, "viewer")


async def require_member(key: Annotated[OperatorKey, Depends(require_operator)]) -> Caller:
    """A member's or an admin's key."""
    return _at_least(key, "member")


async def require_admin(key: Annotated[OperatorKey, Depends(require_operator)]) -> Caller:
    """An admin's key."""
    return _at_least(key, "admin")


# The role dependency of each role, for the route x role table.
ROLE_DEPENDENCIES = {"viewer": require_viewer, "member": require_member, "admin": require_admin}

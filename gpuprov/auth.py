"""Who may call the control-plane API: FastAPI dependencies that every endpoint declares.

    Depends(require_operator)   an operator API key:       Authorization: Bearer gpo_...
    Depends(require_worker)     a registered worker's credential: Authorization: Bearer gpw_...
    Depends(not_throttled)      for endpoints that check a secret themselves (registration's
                                join token); they call `auth_failed(request)` on a bad one

Only /v1/health is open. A refused secret is 401 with `WWW-Authenticate: Bearer`, and the
lookup only reads, so a refused call changes nothing in the database. A client address that
keeps presenting bad keys, credentials or join tokens gets 429 with Retry-After until its
oldest recent failure is a window old (`AuthFailures`); the table of addresses is bounded,
the least recently failing forgotten first.

`install(app, credentials)` puts what the dependencies need in `app.state`. Behind a reverse
proxy, the client address is the proxy's unless uvicorn trusts its X-Forwarded-For
(`--forwarded-allow-ips`, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpuprov.credentials import Credentials
from gpuprov.db import OperatorKey, WorkerRecord

# A client may get this many secrets wrong within the window; the next call is 429.
MAX_FAILURES = 20
WINDOW_SECONDS = 60.0
MAX_CLIENTS = 10_000  # addresses remembered; memory stays below MAX_CLIENTS x MAX_FAILURES

# What an endpoint documents about its refusals (OpenAPI), merged into its `responses`.
REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing, unknown or revoked credential"},
    429: {"description": "too many bad credentials from this address; see Retry-After"},
}

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
_worker_credential = HTTPBearer(
    scheme_name="WorkerCredential",
    description="The credential a worker's registration returned: `Bearer gpw_...`",
    auto_error=False,
)


class AuthFailures:
    """Recent authentication failures per client address: a sliding window, bounded memory."""

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


def auth_failed(request: Request) -> None:
    """Count a bad secret against the caller's address."""
    request.app.state.auth_failures.failed(client_address(request))


async def not_throttled(request: Request) -> None:
    """429 for an address that got too many secrets wrong lately."""
    wait = request.app.state.auth_failures.retry_after(client_address(request))
    if wait is not None:
        raise HTTPException(
            429,
            "too many bad credentials from this address; try again later",
            headers={"Retry-After": str(wait)},
        )


def _refuse(request: Request, detail: str) -> HTTPException:
    auth_failed(request)
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


async def require_operator(
    request: Request,
    _: Annotated[None, Depends(not_throttled)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_operator_key)],
) -> OperatorKey:
    """The caller's operator API key; 401 without a live one."""
    if bearer is None:
        raise _refuse(request, "an operator API key is required (Authorization: Bearer gpo_...)")
    credentials: Credentials = request.app.state.credentials
    key = await asyncio.to_thread(credentials.operator, bearer.credentials)
    if key is None:
        raise _refuse(request, "unknown or revoked operator API key")
    return key


async def require_worker(
    request: Request,
    _: Annotated[None, Depends(not_throttled)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_worker_credential)],
) -> WorkerRecord:
    """The calling worker, by its credential; 401 without a live one (a revoked worker's too)."""
    if bearer is None:
        raise _refuse(request, "a worker credential is required (Authorization: Bearer gpw_...)")
    credentials: Credentials = request.app.state.credentials
    worker = await asyncio.to_thread(credentials.worker, bearer.credentials)
    if worker is None:
        raise _refuse(request, "unknown or revoked worker credential")
    return worker

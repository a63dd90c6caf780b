"""The control-plane HTTP API: nodes register here with their single-use join token.

    POST /v1/workers/register  {token, capabilities, identity?}   the join token in the body
    GET  /v1/workers; drain, undrain, remove                      a viewer (its team's); admins
    GET  /v1/workers/me, POST /v1/workers/heartbeat               the worker's credential
    GET  /v1/work, POST /v1/work/{id}/started|exit|logs           the worker's credential
    POST /v1/jobs; GET /v1/jobs, /v1/jobs/{name}; POST .../release|cancel  a member (to change)
                                                                  or viewer of the job's team
    GET  /v1/jobs/{job}/logs                                      a viewer of the job's team
    GET  /v1/cost[?job=NAME&team=T]                               a viewer of the team
    GET  /v1/offers/stats[?offering=KEY]                          any operator API key
    GET  /v1/teams, /v1/teams/{team}                              a viewer of the team
    GET, PUT, DELETE /v1/secrets[/{name}]                         a viewer; a member to change
    GET  /v1/orphans[?all=true]                                   an admin's API key
    GET  /v1/health                                               open
    /ui/...                                                       the dashboard: signed in with
                                                                  an operator key (a cookie)
    GET  /v1/node/agent.pyz                                       open (no secret in it)

Who may call what is declared per endpoint with gpuprov/api/auth.py's dependencies; the workers
endpoints live in gpuprov/api/workers.py, the work and log ones in gpuprov/api/work.py. A
registration answers the worker's credential once (only its SHA-256 is stored): the node
presents it on every later call. The cost endpoint lives in gpuprov/api/cost.py, the offer
statistics in gpuprov/api/offers.py, teams in gpuprov/api/teams.py, the secrets vault in
gpuprov/api/secrets.py; which team a job or worker belongs to, gpuprov/api/scope.py.

The token is checked by its SHA-256 (unknown, used and expired tokens are 401), used once, and
bound to one VM row (a managed node) or one reservation label (an existing worker). Identity —
provider, region, label, job — comes from that record; claims in the body that disagree are
logged and ignored. The registration is one committed transaction: the token used, the worker
row written. A managed node's job reads that row (activities/registrations.py); nothing is sent
to the workflow for a registration. A node whose machine is already being torn down is refused
(409) with nothing changed. The one thing the API may send Temporal is a job's
`workers_changed` when a node reports its work started or ended (gpuprov/api/work.py).

While the database is unavailable (unreachable, restarting, locked, its SQLite file gone) every
request that needs it is answered 503 with a Retry-After header; the next request after it is
back is served again. A body must arrive within BODY_TIMEOUT_SECONDS and a request head within
HEAD_TIMEOUT_SECONDS, so a client that stalls cannot hold a connection open.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import h11
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import Field
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gpuprov.api import auth
from gpuprov.api import cost as api_cost
from gpuprov.api import jobs as api_jobs
from gpuprov.api import node as api_node
from gpuprov.api import offers as api_offers
from gpuprov.api import orphans as api_orphans
from gpuprov.api import secrets as api_secrets
from gpuprov.api import teams as api_teams
from gpuprov.api import work as api_work
from gpuprov.api import workers as api_workers
from gpuprov.api.auth import AuthFailures
from gpuprov.api.dashboard import routes as api_dashboard
from gpuprov.api.heartbeats import PATH as HEARTBEAT_PATH
from gpuprov.api.heartbeats import HeartbeatPath
from gpuprov.api.work import TemporalSource
from gpuprov.api.work_secrets import WorkSecrets
from gpuprov.config import ConfigError, JobsSettings, WorkersSettings
from gpuprov.models import WorkerCapabilities
from gpuprov.sdk import pem
from gpuprov.sdk.client import DEFAULT_TASK_QUEUE
from gpuprov.store.credentials import Credentials, issue_worker_credential
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records, TokenRejected
from gpuprov.store.secrets import Vault
from gpuprov.store.teams import Teams
from providers.base import Model

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
# A machine whose teardown has begun (or ended) registers nothing.
RETIRED_VM_STATUSES = frozenset({"terminating", "terminated", "orphaned"})
# A registration body is a few KiB: a client that has not sent it all by then has stalled.
BODY_TIMEOUT_SECONDS = 15.0
HEAD_TIMEOUT_SECONDS = 15.0  # from connecting (or the previous response) to a complete head
RETRY_AFTER_SECONDS = 5  # what a 503 asks the node to wait
# Database errors that mean "not now": unreachable, restarting, locked, the file missing.
DATABASE_UNAVAILABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
)
TOKEN_ERRORS = {
    "unknown": "unknown join token",
    "used": "join token already used",
    "expired": "join token expired",
}


class IdentityClaims(Model):
    """What a node says about itself. Never trusted: the token's record decides."""

    provider: str | None = Field(default=None, max_length=64)
    region: str | None = Field(default=None, max_length=128)
    label: str | None = Field(default=None, max_length=128)
    job: str | None = Field(default=None, max_length=128)
    vm: str | None = Field(default=None, max_length=128)


class RegisterRequest(Model):
    token: str = Field(min_length=16, max_length=256)
    capabilities: WorkerCapabilities
    identity: IdentityClaims | None = None


class RegisterResponse(Model):
    worker_id: str
    # Shown once: the worker's credential for every later call (Authorization: Bearer gpw_...).
    credential: str
    origin: str  # managed / existing
    job: str | None
    vm: str | None
    label: str | None
    provider: str | None
    region: str | None


class RegistrationRefused(Exception):
    """The token's machine is no longer waited for (its teardown has begun)."""


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, declared or streamed; 408 (and the
    connection closed) for one not complete `timeout` seconds after the app first asks for it."""

    def __init__(
        self, app: ASGIApp, limit: int = MAX_BODY_BYTES, timeout: float = BODY_TIMEOUT_SECONDS
    ) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _too_large(send)
            return
        received = 0
        deadline: float | None = None
        complete = False

        async def limited_receive() -> Message:
            nonlocal received, deadline, complete
            if complete:  # e.g. a wait for the client to disconnect: not bounded here
                return await receive()
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.timeout
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise StarletteHTTPException(
                    408, "request body not received in time", headers={"Connection": "close"}
                ) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            received += len(message.get("body", b""))
            if received > self.limit:
                # FastAPI wraps body-reading errors in a 400, but re-raises HTTPException.
                raise StarletteHTTPException(413, "request body too large")
            return message

        await self.app(scope, limited_receive, send)


async def _too_large(send: Send) -> None:
    headers = [(b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": b"request body too large"})


async def _database_unavailable(request: Request, error: Exception) -> JSONResponse:
    cause = getattr(error, "orig", None) or error
    log.warning(
        "%s %s: database unavailable: %s",
        request.method,
        request.url.path,
        (str(cause).strip().splitlines() or [type(cause).__name__])[0],
    )
    # The caller sees that the database is the cause, not its words (hosts, users).
    return JSONResponse(
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        content={"detail": "the database is unavailable; retry later", "cause": "database"},
    )


class ControlPlaneApp(FastAPI):
    """The API's FastAPI, with HeartbeatPath in front of all of it: a well-formed heartbeat
    (the request every node sends every interval) is answered before the framework's
    telemetry check, error, exception and body-limit layers; anything else, and any heartbeat
    it does not answer with a 200, goes through all of them (BodyLimit included)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._heartbeats_first = HeartbeatPath(functools.partial(FastAPI.__call__, self))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == HEARTBEAT_PATH:
            scope["app"] = self
            await self._heartbeats_first(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(
    records: Records,
    *,
    auth_failures: AuthFailures | None = None,
    body_timeout: float = BODY_TIMEOUT_SECONDS,
    workers: WorkersSettings | None = None,
    jobs: JobsSettings | None = None,
    temporal: TemporalSource = None,
    vault: Vault | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
    temporal_ui_url: str | None = None,
    namespace: str = "default",
) -> FastAPI:
    """The API over `records`. `temporal` (a client, or how to connect when first needed) lets
    a node's report wake its job at once; without it the liveness sweep does. `vault` holds the
    secrets' keys (none: no secret can be stored, and a stored one cannot be handed out).
    `temporal_ui_url` is where the dashboard links each job's workflow (none: no link)."""
    # No /docs, /redoc or /openapi.json: nothing but health is served to an unauthenticated
    # caller. `create_app(...).openapi()` still builds the document.
    app = ControlPlaneApp(
        title="gpuprov control plane", version="1", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(BodyLimit, timeout=body_timeout)
    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)
    app.state.records = records
    auth.install(app, Credentials(records.db) if records is not None else None, auth_failures)
    app.state.liveness = Liveness(records.db) if records is not None else None
    if records is not None:
        app.state.teams = Teams(records.db)
        app.state.vault = vault or Vault(records.db, {}, None)
        app.state.work_secrets = WorkSecrets(app.state.vault, app.state.teams)
    else:
        app.state.teams = app.state.vault = app.state.work_secrets = None
    jobs = jobs or JobsSettings()
    app.state.waker = api_work.JobWaker(app.state.liveness, temporal)
    api_workers.add_routes(app, workers or WorkersSettings(), jobs)
    api_work.add_routes(app, jobs)
    api_cost.add_routes(app)
    api_orphans.add_routes(app)
    api_offers.add_routes(app, jobs)
    api_teams.add_routes(app)
    api_jobs.add_routes(app, task_queue)
    api_secrets.add_routes(app)
    api_node.add_routes(app)
    api_dashboard.add_routes(app, temporal_ui_url, namespace)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes each bad input back: that can be the join token, and an
        # Infinity in the body made the echo itself fail (500). Name the field, not the value.
        detail = [
            {
                "loc": list(problem.get("loc", ())),
                "msg": problem.get("msg"),
                "type": problem.get("type"),
            }
            for problem in error.errors()
        ]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(
        "/v1/workers/register",
        responses={
            400: {"description": "the body is not decodable JSON"},
            401: {"description": "unknown, used or expired join token"},
            408: {"description": "the body did not arrive in time"},
            409: {"description": "the node's machine is being torn down"},
            413: {"description": "body over 64 KiB"},
            503: {"description": "the database is unavailable now; retry after Retry-After"},
            429: auth.REFUSALS[429],
        },
    )
    async def register(
        body: RegisterRequest, throttle: Annotated[auth.Guard, Depends(auth.guard)]
    ) -> RegisterResponse:
        wait = throttle.wait(body.token)
        # Throttled: a read tells a good token from a bad one before anything is written, so
        # the neighbours' bad tokens never hold up this node's registration.
        if wait is not None and not await asyncio.to_thread(
            records.token_redeemable, body.token, datetime.now(UTC)
        ):
            raise auth.too_many(wait)
        try:
            return await _register(records, body)
        except HTTPException as error:
            if error.status_code == 401:  # a bad join token counts like a bad key
                raise throttle.refused(body.token, str(error.detail)) from None
            raise

    return app


async def _register(records: Records, body: RegisterRequest) -> RegisterResponse:
    try:
        return await asyncio.to_thread(_claim, records, body)
    except TokenRejected as rejected:
        raise HTTPException(401, TOKEN_ERRORS.get(rejected.reason, "invalid token")) from None
    except RegistrationRefused as refused:
        raise HTTPException(409, str(refused)) from None


def _claim(records: Records, body: RegisterRequest) -> RegisterResponse:
    """Redeem the token and record the worker, in one committed transaction."""
    with records.db.session() as session:
        token = records.redeem_token(session, body.token, datetime.now(UTC))
        vm = records.get_vm(token.vm) if token.vm else None
        if vm is not None and vm.status in RETIRED_VM_STATUSES:
            session.rollback()  # the token stays unused: nothing changed
            raise RegistrationRefused(f"{vm.vm} is {vm.status}: its job no longer waits for it")
        identity: dict[str, Any] = {
            "provider": vm.provider if vm else None,
            "region": vm.region if vm else None,
            "label": token.label,
            "job": vm.job if vm else None,
            "vm": token.vm,
        }
        _log_disagreeing_claims(body.identity, identity)
        worker = records.register_worker(
            session,
            origin="managed" if vm else "existing",
            capabilities=body.capabilities.model_dump(mode="json"),
            state="reserved" if vm else "idle",
            **identity,
        )
        credential = issue_worker_credential(session, worker.id)
        session.commit()
        return RegisterResponse(
            worker_id=worker.id,
            credential=credential,
            origin="managed" if vm else "existing",
            **identity,
        )


def _log_disagreeing_claims(claims: IdentityClaims | None, record: dict[str, Any]) -> None:
    if claims is None:
        return
    for field, claimed in claims.model_dump(exclude_none=True).items():
        if claimed != record.get(field):
            log.warning(
                "ignoring identity claim %s=%r: the token's record says %r",
                field,
                claimed,
                record.get(field),
            )


KEEP_ALIVE_SECONDS = 5.0  # uvicorn's own default, for apps other than the API


class CannotListen(ConfigError):
    """The configured host and port cannot be listened on (in use, not an address here, ...)."""


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request head.

    uvicorn waits without limit for a new connection's first request line and headers, and for
    the rest of a head once a byte of it has come: a client that connects and stalls would hold
    the connection forever. The deadline starts at the connection (or the first byte of a later
    request) and is not extended by a trickle.
    """

    def __init__(
        self, *args: Any, head_timeout: float = HEAD_TIMEOUT_SECONDS, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _follow_head(self) -> None:
        if self.conn.their_state is not h11.IDLE:  # a complete head arrived
            self._stop_head_timer()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here: uvicorn would log a bind error and exit the whole
    process from inside the event loop; this names the address in one line instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except (OSError, OverflowError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise CannotListen(f"cannot listen on {host}:{port}: {reason}") from None


@asynccontextmanager
async def serving(
    app: FastAPI,
    host: str,
    port: int,
    *,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
    head_timeout: float = HEAD_TIMEOUT_SECONDS,
    keep_alive_seconds: float = KEEP_ALIVE_SECONDS,
) -> AsyncIterator[uvicorn.Server]:
    """Run the API with uvicorn inside the current event loop until the block exits; HTTPS
    with a certificate and key (checked first: a wrong one is a ConfigError naming it). An idle
    connection is kept `keep_alive_seconds` for the client's next request (the API's: the
    workers' `keep_alive`, past one heartbeat interval)."""
    if tls_cert_file is not None and tls_key_file is not None:
        pem.check_files("api.tls_cert_file", tls_cert_file, "api.tls_key_file", tls_key_file)
    listener = _listen(host, port)
    # (`app` may be a wrapper of the API, or another app: only the API's own has waits.)
    waits = getattr(getattr(app, "state", None), "work_waits", None)
    if waits is not None:
        waits.reopen()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        ssl_certfile=tls_cert_file,
        ssl_keyfile=tls_key_file,
        http=functools.partial(HeadTimeoutProtocol, head_timeout=head_timeout),
        timeout_keep_alive=keep_alive_seconds,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        if task.done():
            task.result()  # surfaces a bind error
            raise RuntimeError(f"the API did not start on {host}:{port}")
        await asyncio.sleep(0.02)
    try:
        yield server
    finally:
        if waits is not None:  # a long poll held now would hold the shutdown up
            waits.close()
        server.should_exit = True
        await task

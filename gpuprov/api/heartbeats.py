"""A node's heartbeat, `POST /v1/workers/heartbeat`, answered for as little CPU as the API can:
every node sends one every interval, so at 10,000 nodes this is most of what the API does.

    HeartbeatRequest / HeartbeatResponse   the body and the answer (the OpenAPI document's)
    Heartbeats.record(credential, body)    the beat recorded in its batch (heartbeat_batches.py);
                                           its job woken if it changed what the job acts on;
                                           the answer, or None for a refused credential
    HeartbeatPath                          ASGI middleware: the happy path, without the
                                           framework's routing and dependencies

HeartbeatPath takes a heartbeat with a declared body of at most FAST_BODY_BYTES, a Bearer
credential and a body that validates, and answers it itself. Anything else, and a heartbeat it
could not answer with a 200 (a refused credential, an unavailable database), goes on to the
FastAPI route in gpuprov/api/workers.py with its body replayed, and the route gives the answer
it gives any request: 401/429 through the throttle, 422 naming the field, 413, 408, 503. Both
call `Heartbeats.record`, so what a heartbeat writes and answers is the same either way.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import Field, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuprov.api.heartbeat_batches import HeartbeatBatches
from gpuprov.models import NodeNotice
from gpuprov.store.liveness import MAX_DETAIL, Heartbeat, Liveness
from providers.base import Model

PATH = "/v1/workers/heartbeat"
FAST_BODY_BYTES = 8192  # a heartbeat's body is a few hundred bytes; more goes to the route
BODY_WAIT_SECONDS = 10.0  # then the route reads the rest under its own body deadline


class HeartbeatRequest(Model):
    """The node's fresh GPU verdict (the registration probe plus `nvidia-smi -q`) and the
    cloud's notice about its machine, if its agent watches one and the cloud gave one."""

    healthy: bool
    detail: str | None = Field(default=None, max_length=MAX_DETAIL)
    notice: NodeNotice | None = None


class HeartbeatResponse(Model):
    interval_seconds: float  # when to send the next one
    # The node's lease, counted from when it sent this heartbeat: with no answer for this
    # long, it stops its work (SIGTERM, grace, SIGKILL) and reports the end when it can.
    lease_seconds: float
    draining: bool
    state: str  # idle / reserved / busy
    work_id: str | None = None  # the worker's current work (GET /v1/work says what it is)
    stop_requested: bool = False  # that work is to stop: SIGTERM, grace, SIGKILL, report


class Heartbeats:
    """What a heartbeat does, for the route and the fast path alike (app.state.heartbeats)."""

    def __init__(
        self,
        liveness: Liveness,
        waker: object,  # gpuprov/api/work.py JobWaker: `tell(worker_id, job, changed_at)`
        *,
        interval_seconds: float,
        lease_seconds: float,
        holds_work_for: timedelta,
    ) -> None:
        self._batches = HeartbeatBatches(liveness, holds_work_for)
        self._waker = waker
        self._interval = interval_seconds
        self._lease = lease_seconds

    async def record(self, credential: str, body: HeartbeatRequest) -> HeartbeatResponse | None:
        notice = body.notice.model_dump(mode="json") if body.notice is not None else None
        beat = await self._batches.beat(Heartbeat(credential, body.healthy, body.detail, notice))
        if beat is None:  # unknown or revoked: nothing was written
            return None
        if beat.changed and beat.job and beat.worker_id and beat.at is not None:
            await self._waker.tell(beat.worker_id, beat.job, beat.at)  # type: ignore[attr-defined]
        return HeartbeatResponse(
            interval_seconds=self._interval,
            lease_seconds=self._lease,
            draining=beat.draining,
            state=beat.state,
            work_id=beat.work_id,
            stop_requested=beat.stop_requested,
        )


def _bearer(value: bytes | None) -> str | None:
    scheme, _, credential = (value or b"").decode("latin-1").partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential else None


class HeartbeatPath:
    """ASGI middleware: a well-formed heartbeat answered without the framework; anything else
    passed on unchanged (its body replayed) to the app behind."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"")
        heartbeats: Heartbeats | None = getattr(scope["app"].state, "heartbeats", None)
        if heartbeats is None or not declared.isdigit() or int(declared) > FAST_BODY_BYTES:
            await self.app(scope, receive, send)
            return
        read: list[Message] = []
        answer = await self._answer(heartbeats, headers, int(declared), receive, read)
        if answer is None:
            await self.app(scope, _replaying(read, receive), send)
            return
        content = answer.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(content)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})

    async def _answer(
        self,
        heartbeats: Heartbeats,
        headers: dict[bytes, bytes],
        declared: int,
        receive: Receive,
        read: list[Message],
    ) -> HeartbeatResponse | None:
        """The 200 answer, or None: the route answers (every message read is in `read`)."""
        body = b""
        try:
            async with asyncio.timeout(BODY_WAIT_SECONDS):
                while True:
                    message = await receive()
                    read.append(message)
                    if message["type"] != "http.request":
                        return None
                    body += message.get("body", b"")
                    if len(body) > declared:
                        return None
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return None
        credential = _bearer(headers.get(b"authorization"))
        if credential is None:
            return None
        try:
            request = HeartbeatRequest.model_validate_json(body)
        except ValidationError:
            return None
        try:
            return await heartbeats.record(credential, request)
        except Exception:  # the route records it again and answers the failure (503, 500)
            return None


def _replaying(read: list[Message], receive: Receive) -> Receive:
    pending = list(read)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay

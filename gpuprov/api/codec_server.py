"""The codec server: lets the Temporal UI (and `temporal` CLI) show encrypted payloads.

    POST .../encode   {"payloads": [{"metadata": {"encoding": "<base64>"}, "data": "<base64>"}]}
    POST .../decode   the same shape back, decoded
    GET  /health

The body is Temporal's `Payloads` message in protobuf JSON (bytes as base64), as in Temporal's
remote codec protocol; only the last path segment selects the operation, so the server can be
mounted under a prefix such as /<namespace>/. The UI sends `X-Namespace`; one key set serves
every namespace. Browsers may call it only from the configured UI origins (CORS).

Whoever can reach this server can decrypt payloads: keep it on localhost (the default) or
behind an authenticating proxy. It never logs payloads or keys.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from starlette.middleware.cors import CORSMiddleware
from temporalio.api.common.v1 import Payloads

from gpuprov.api.app import BodyLimit
from gpuprov.config import Settings
from gpuprov.sdk.codec import EncryptionCodec, PayloadDecryptionError

log = logging.getLogger(__name__)

# Temporal's default blob limit is 2 MiB per payload; the UI batches several per request.
MAX_BODY_BYTES = 16 * 1024 * 1024


def ui_origins(settings: Settings, ui_port: int | None = None) -> list[str]:
    """Origins allowed by CORS: `[codec] ui_origins`, else the local UI on `ui_port`."""
    if settings.codec.ui_origins:
        return list(settings.codec.ui_origins)
    port = ui_port or settings.temporal.ui_port
    return [f"http://localhost:{port}", f"http://127.0.0.1:{port}"]


def endpoint_url(host: str, port: int) -> str:
    """The URL a browser on this machine uses for a server bound to host:port."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def create_codec_app(codec: EncryptionCodec, origins: list[str]) -> FastAPI:
    app = FastAPI(title="gpuprov codec server", version="1", docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins,
        allow_methods=["POST"],
        allow_headers=["Content-Type", "X-Namespace", "Authorization"],
        max_age=600,
    )

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def transcode(request: Request, operation: str) -> Response:
        body = await request.body()
        payloads = Payloads()
        try:
            json_format.Parse(body, payloads)
        except (json_format.ParseError, UnicodeDecodeError) as error:
            return _bad_request(f"body is not Payloads JSON: {error}")
        try:
            if operation == "encode":
                result = await codec.encode(payloads.payloads)
            else:
                result = await codec.decode(payloads.payloads)
        except PayloadDecryptionError as error:
            namespace = request.headers.get("x-namespace", "-")
            log.warning("codec server: %s failed (namespace %s): %s", operation, namespace, error)
            return _bad_request(str(error))
        return JSONResponse({"payloads": [json_format.MessageToDict(p) for p in result]})

    # Only the last segment matters (the protocol), so /encode and /<anything>/encode both work.
    def route(operation: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await transcode(request, operation)

        return endpoint

    for operation in ("encode", "decode"):
        endpoint = route(operation)
        app.add_api_route(f"/{operation}", endpoint, methods=["POST"], responses={400: {}, 413: {}})
        app.add_api_route(
            f"/{{prefix:path}}/{operation}",
            endpoint,
            methods=["POST"],
            include_in_schema=False,
        )
    return app


def _bad_request(message: str) -> Response:
    return JSONResponse({"error": message}, status_code=400)

"""An HTTP client that talks to a FastAPI app in this process (httpx's ASGI transport), as one
remote address; the API tests' `api` fixture (tests/gpuprov/conftest.py) is one of these."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

CALLER = ("203.0.113.7", 40000)  # documentation addresses: the throttle keys on the caller
OTHER_CALLER = ("198.51.100.9", 40000)


def client_for(app: FastAPI, caller: tuple[str, int] = CALLER) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=caller)
    return httpx.AsyncClient(transport=transport, base_url="http://api")

"""A small Lambda Cloud API v1 client: one httpx.AsyncClient, bearer auth, `{"data": ...}`
unwrapped, every failure a classified ProviderError (providers/lambdalabs/errors.py).

Launches are paced: Lambda accepts one `POST /instance-operations/launch` per 12 s per account,
so this client (one per adapter, no global state) starts launches at least
`min_launch_interval` seconds apart. The API key is only ever in the Authorization header, and
`secrets()` hands it to the core, which scrubs it out of any error text the cloud echoes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from .errors import Op, classify, malformed, retry_after_seconds, transport_failure

API_PREFIX = "/api/v1"


class LambdaClient:
    def __init__(
        self,
        api_key: str,
        base_url: str,
        *,
        timeout: float = 30.0,
        min_launch_interval: float = 12.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._api_key = api_key
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + API_PREFIX,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )
        self._min_launch_interval = min_launch_interval
        self._clock = clock
        self._sleep = sleep
        self._launch_lock = asyncio.Lock()
        self._last_launch: float | None = None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def get(self, op: Op, path: str) -> Any:
        return await self._call(op, "GET", path)

    async def post(self, op: Op, path: str, body: dict[str, Any]) -> Any:
        return await self._call(op, "POST", path, body)

    async def post_only(self, op: Op, path: str, body: dict[str, Any]) -> None:
        """A POST whose 2xx is all we need (terminate): its body is not read."""
        await self._call(op, "POST", path, body, read=False)

    async def delete(self, op: Op, path: str) -> None:
        await self._call(op, "DELETE", path, read=False)

    async def launch(self, body: dict[str, Any]) -> Any:
        """POST /instance-operations/launch, no sooner than `min_launch_interval` after the
        previous launch of this client (concurrent launches queue behind each other)."""
        async with self._launch_lock:
            if self._last_launch is not None:
                wait = self._last_launch + self._min_launch_interval - self._clock()
                if wait > 0:
                    await self._sleep(wait)
            try:
                return await self._call(Op.LAUNCH, "POST", "/instance-operations/launch", body)
            finally:
                self._last_launch = self._clock()

    async def _call(
        self, op: Op, method: str, path: str, body: dict[str, Any] | None = None, read: bool = True
    ) -> Any:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.HTTPError as error:
            raise transport_failure(op, error) from None
        if response.is_success:
            return self._data(op, response) if read else None
        code, message, suggestion = _error_fields(response)
        retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        raise classify(op, response.status_code, code, message, suggestion, retry_after)

    def _data(self, op: Op, response: httpx.Response) -> Any:
        try:
            payload = response.json()
        except (ValueError, RecursionError):
            raise malformed(op, "the body is not JSON") from None
        if not isinstance(payload, dict) or "data" not in payload:
            raise malformed(op, 'no "data" in the body')
        return payload["data"]

    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,)


def _error_fields(response: httpx.Response) -> tuple[str | None, str | None, str | None]:
    """(code, message, suggestion) of Lambda's `{"error": {...}}`; None where absent or not
    text (a proxy's HTML page, a bare 429)."""
    try:
        payload = response.json()
    except (ValueError, RecursionError):
        return (None, None, None)
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return (None, None, None)
    fields = (error.get("code"), error.get("message"), error.get("suggestion"))
    code, message, suggestion = (value if isinstance(value, str) else None for value in fields)
    return (code or None, message, suggestion)

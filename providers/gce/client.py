"""The Compute Engine REST v1 client: one httpx.AsyncClient, bearer tokens, classified errors.

Every call goes through `call`, which adds the token, maps transport failures to Transient and
HTTP errors through `errors.http_error` (by reason), and reads JSON that must be an object.
`pages` follows `nextPageToken`; `wait_operation` is the bounded `operations.wait` loop that
create may use. Paths are relative to `<base_url>/projects/<project>`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from providers.errors import ErrorKind, ProviderError
from providers.gce.auth import TokenProvider
from providers.gce.errors import GceApiError, http_error, malformed, words
from providers.gce.parse import Operation, read

MAX_PAGES = 200  # a listing that never ends is a broken listing
WAIT_CALL_SECONDS = 130.0  # operations.wait blocks up to about 2 minutes server-side
# A token lives an hour; a message about a call made just before a refresh names the old one.
TOKENS_KEPT = 4


class GceClient:
    def __init__(
        self,
        project: str,
        tokens: TokenProvider,
        base_url: str,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.project = project
        self._tokens = tokens
        self._base = base_url.rstrip("/")
        self._timeout = timeout
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._issued: list[str] = []  # the latest access tokens, oldest first

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._tokens.aclose()

    def url(self, path: str) -> str:
        return f"{self._base}/projects/{self.project}/{path.lstrip('/')}"

    async def call(
        self,
        method: str,
        url: str,
        action: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        writes: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; the parsed JSON object, or a classified ProviderError."""
        headers = {"Authorization": f"Bearer {await self._token(action)}"}
        try:
            response = await self._http.request(
                method,
                url,
                params={k: v for k, v in (params or {}).items() if v is not None},
                json=body,
                headers=headers,
                timeout=timeout or self._timeout,
            )
        except httpx.TimeoutException:
            raise ProviderError(ErrorKind.TRANSIENT, f"{action}: timed out") from None
        except httpx.HTTPError as error:
            raise ProviderError(
                ErrorKind.TRANSIENT, f"{action}: {type(error).__name__}: {words(error)}"
            ) from None
        data = _json(response)
        if response.status_code >= 400:
            raise http_error(response.status_code, data, response.headers, action, writes)
        if not isinstance(data, dict):
            raise malformed(action, f"HTTP {response.status_code} without a JSON object")
        return data

    async def _token(self, action: str) -> str:
        from google.auth import exceptions

        try:
            token = await self._tokens.token()
        except exceptions.RefreshError as error:
            raise ProviderError(
                ErrorKind.CREDENTIALS,
                f"{action}: cannot refresh the Google access token: {words(error)}",
            ) from None
        except (exceptions.TransportError, OSError) as error:
            raise ProviderError(
                ErrorKind.TRANSIENT, f"{action}: token refresh failed: {type(error).__name__}"
            ) from None
        if token not in self._issued:
            self._issued = [*self._issued[1 - TOKENS_KEPT :], token]
        return token

    def secrets(self) -> tuple[str, ...]:
        """The access tokens this client sent lately: the core scrubs them out of messages."""
        return tuple(self._issued)

    async def pages(
        self, url: str, action: str, params: Mapping[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Each page of a list call, following nextPageToken."""
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.call(
                "GET", url, action, params={**(params or {}), "pageToken": token}
            )
            yield page
            token = page.get("nextPageToken")
            if not token:
                return
            if not isinstance(token, str):
                raise malformed(action, "nextPageToken is not a string")
        raise malformed(action, f"more than {MAX_PAGES} pages")

    async def wait_operation(
        self, zone: str, operation: Operation, action: str, timeout: float, pause: float
    ) -> Operation:
        """`POST zones/<z>/operations/<op>/wait` until DONE or `timeout` seconds have passed;
        returns the last state seen (DONE or not). The wait call may return early, so pause
        `pause` seconds between calls that came back unfinished."""
        deadline = time.monotonic() + timeout
        url = self.url(f"zones/{zone}/operations/{operation.name}/wait")
        while not operation.done:
            left = deadline - time.monotonic()
            if left <= 0:
                return operation
            try:
                data = await self.call(
                    "POST", url, action, timeout=min(WAIT_CALL_SECONDS, left + 5)
                )
            except GceApiError as error:
                if error.gone:  # the operation record expired: the outcome is for observe
                    return operation
                if error.kind is not ErrorKind.TRANSIENT:
                    raise
                await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                continue
            except ProviderError as error:
                if error.kind is not ErrorKind.TRANSIENT:
                    raise
                await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                continue  # a failed wait says nothing about the operation: ask again
            operation = read(Operation, data, action)
            if not operation.done and pause:
                await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        return operation


def _json(response: httpx.Response) -> object:
    if not response.content:
        return None
    try:
        return json.loads(response.content)
    except (ValueError, RecursionError):
        return None

"""A thin async client for the Prime Intellect Compute API (`https://api.primeintellect.ai`).

Paths are written exactly as the vendor's OpenAPI document has them: collection paths end in a
slash (`/api/v1/pods/`, `/api/v1/ssh_keys/`), item paths do not (`/api/v1/pods/{pod_id}`).
Every failure leaves as a classified `ProviderError` (providers/prime/errors.py), or `PodGone`
where a delete finds nothing to delete. The API key travels only in the Authorization header;
`secrets()` hands it to the core, which scrubs it out of any error text Prime echoes it in.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from providers.prime.errors import (
    PodGone,
    classify_status,
    classify_transport,
    malformed,
    response_body,
)

AVAILABILITY_GPUS = "/api/v1/availability/gpus"
PODS = "/api/v1/pods/"
SSH_KEYS = "/api/v1/ssh_keys/"
PAGE_SIZE = 100  # the availability endpoint's maximum; the pods list's default


def pod_path(pod_id: str) -> str:
    return f"/api/v1/pods/{_segment(pod_id)}"


def _segment(value: str) -> str:
    """An id as one path segment: nothing in it may walk to another path."""
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"not a usable id: {value!r}")
    return quote(value, safe="")


class PrimeClient:
    """One HTTP client per adapter instance (closed by `aclose`)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._api_key = api_key
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
            follow_redirects=False,  # a redirect would re-send the key somewhere unchecked
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,)

    async def get(self, operation: str, path: str, params: Any = None) -> Any:
        return await self._call(operation, "GET", path, params=params)

    async def post(self, operation: str, path: str, body: dict[str, Any]) -> Any:
        return await self._call(operation, "POST", path, json=body)

    async def delete(self, operation: str, path: str) -> None:
        """DELETE; a pod that is already gone raises PodGone for the caller to accept."""
        await self._call(operation, "DELETE", path, want_body=False)

    async def _call(
        self,
        operation: str,
        method: str,
        path: str,
        params: Any = None,
        json: dict[str, Any] | None = None,
        want_body: bool = True,
    ) -> Any:
        try:
            response = await self._http.request(method, path, params=params, json=json)
        except httpx.HTTPError as error:  # connect, read, timeout, protocol
            raise classify_transport(operation, method, path, error) from None
        if not response.is_success:
            failure = classify_status(operation, response)
            raise failure from None
        if not want_body:
            return None
        body = response_body(response)
        if isinstance(body, str):
            raise malformed(operation, f"{method} {path} answered non-JSON")
        return body


__all__ = ["PodGone", "PrimeClient", "pod_path"]

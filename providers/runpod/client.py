"""A small async client for the RunPod REST v2 calls gpuprov makes, over httpx.

Every call returns the decoded JSON of a 2xx answer or raises a classified `ProviderError`
(providers/runpod/errors.py). The API key travels only in the Authorization header;
`secrets()` hands it to the core, which scrubs it out of every message before a log or Temporal
history sees one.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx

from providers.runpod.errors import (
    Operation,
    classify,
    network_error,
    parse_retry_after,
    unreadable,
)

GONE = object()  # what `delete_pod` returns for a pod that was already gone (404)


class RunPodClient:
    """`https://api.runpod.io/v2`: catalog, pods, and (read-only) account SSH keys."""

    def __init__(
        self,
        api_key: str,
        base_url: str = "https://api.runpod.io",
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._api_key = api_key
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ calls

    async def list_gpu_types(
        self, cloud: str, count: int, min_cuda_version: str | None = None
    ) -> Any:
        """GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=C"""
        params: dict[str, str] = {
            "include": "AVAILABILITY",
            "product": "POD",
            "count": str(count),
            "cloud": cloud,
        }
        if min_cuda_version is not None:
            params["minCudaVersion"] = min_cuda_version
        return await self._call("read", "GET", "/v2/catalog/gpus", params=params)

    async def list_pods(self) -> Any:
        """GET /v2/pods (the account's pods; one list, no pagination in v2)."""
        return await self._call("read", "GET", "/v2/pods")

    async def create_pod(self, body: dict[str, Any]) -> Any:
        """POST /v2/pods: 201 with the Pod."""
        return await self._call("create", "POST", "/v2/pods", body=body)

    async def delete_pod(self, pod_id: str) -> object | None:
        """DELETE /v2/pods/{id}: 204; a 404 (already gone) returns GONE."""
        return await self._call("delete", "DELETE", f"/v2/pods/{quote(pod_id, safe='')}")

    async def account_ssh_keys(self) -> Any:
        """GET /v2/account/ssh-keys (never PUT: that replaces the user's whole key set)."""
        return await self._call("read", "GET", "/v2/account/ssh-keys")

    # ------------------------------------------------------------------ internals

    async def _call(
        self,
        operation: Operation,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        what = f"{method} {path.split('?')[0]}"
        try:
            response = await self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as error:
            raise network_error(what, error) from None
        if operation == "delete" and response.status_code == 404:
            return GONE
        if not response.is_success:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            raise classify(operation, response.status_code, response.content, what, retry_after)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return json.loads(response.content)
        except (ValueError, RecursionError) as error:
            raise unreadable(operation, what, f"not JSON ({type(error).__name__})") from None

    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,)

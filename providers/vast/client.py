"""The Vast.ai HTTP client: four calls, paced per endpoint, every failure classified.

| method | call |
| --- | --- |
| search_offers | POST /api/v0/bundles/ (filters, order, limit, type) -> `offers` |
| create_instance | PUT /api/v0/asks/{ask_id}/ -> `new_contract` (the instance id) |
| list_instances | GET /api/v1/instances/?limit=25[&select_filters=][&after_token=], every page |
| destroy_instance | DELETE /api/v0/instances/{id}/ (gone is success) |

Paths keep their trailing slash, as the live API and Vast's per-endpoint OpenAPI files have
them. The key travels only in the `Authorization: Bearer` header (never `?api_key=`, which would
put it into URLs and so into exception texts); `secrets()` hands it to the core, which scrubs it
out of every error message.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any

import httpx

from providers.errors import ErrorKind, ProviderError
from providers.vast import parse
from providers.vast.config import VastMinIntervals
from providers.vast.errors import Op, classify, is_gone

PAGE_SIZE = 25  # the list endpoint's maximum
MAX_PAGES = 400  # 10,000 instances: beyond that the answer is not one we can trust
_NOT_JSON = object()


@dataclass
class CreateAnswer:
    """What a create call left behind: the instance id Vast reported (even beside an error:
    then something exists that must be destroyed) and the classified error, if any."""

    contract: int | None
    error: ProviderError | None


class Pacer:
    """Keeps calls to one endpoint at least its minimum interval apart (per client)."""

    def __init__(self, intervals: VastMinIntervals) -> None:
        self._intervals = {
            Op.SEARCH: intervals.search,
            Op.CREATE: intervals.create,
            Op.LIST: intervals.list_page,
            Op.DESTROY: intervals.destroy,
        }
        self._last: dict[Op, float] = {}
        self._locks: dict[Op, asyncio.Lock] = {}

    async def wait(self, op: Op) -> None:
        interval = self._intervals[op]
        if interval <= 0:
            return
        lock = self._locks.setdefault(op, asyncio.Lock())
        async with lock:
            loop = asyncio.get_running_loop()
            delay = self._last.get(op, -math.inf) + interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._last[op] = loop.time()


class VastClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        intervals: VastMinIntervals | None = None,
    ) -> None:
        self._api_key = api_key
        self._pacer = Pacer(intervals or VastMinIntervals())
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,)

    # ------------------------------------------------------------------ the four calls

    async def search_offers(self, body: dict[str, Any]) -> list[Any]:
        payload = await self._json(Op.SEARCH, "POST", "/api/v0/bundles/", json=body)
        offers = payload.get("offers")
        if not isinstance(offers, list):
            raise self._malformed(Op.SEARCH, f"offers is {type(offers).__name__}, not a list")
        return offers

    async def create_instance(self, ask_id: int, body: dict[str, Any]) -> CreateAnswer:
        response = await self._send(Op.CREATE, "PUT", f"/api/v0/asks/{ask_id}/", json=body)
        payload = _json_body(response)
        answer = payload if isinstance(payload, dict) else None
        contract = parse.new_contract(answer)
        if response.is_success and payload is _NOT_JSON:
            # It may have landed: Transient makes the core observe by label and adopt it.
            error = ProviderError(
                ErrorKind.TRANSIENT, f"{Op.CREATE.value}: HTTP {response.status_code}, not JSON"
            )
            return CreateAnswer(contract=None, error=error)
        if response.is_success and answer is not None and answer.get("success") is not False:
            if contract is not None:
                return CreateAnswer(contract=contract, error=None)
            error = self._malformed(Op.CREATE, "success without a new_contract id")
            return CreateAnswer(contract=None, error=error)
        error = self._error(Op.CREATE, response, answer)
        return CreateAnswer(contract=contract, error=error)

    async def list_instances(self, select_filters: dict[str, Any] | None = None) -> list[Any]:
        """Every instance matching the filters, across all pages (`next_token` ->
        `after_token`), each page paced by the list endpoint's interval."""
        instances: list[Any] = []
        params: dict[str, str] = {"limit": str(PAGE_SIZE)}
        if select_filters:
            params["select_filters"] = json.dumps(select_filters, separators=(",", ":"))
        seen_tokens: set[str] = set()
        for _ in range(MAX_PAGES):
            payload = await self._json(Op.LIST, "GET", "/api/v1/instances/", params=params)
            page = payload.get("instances")
            if not isinstance(page, list):
                raise self._malformed(Op.LIST, f"instances is {type(page).__name__}, not a list")
            instances.extend(page)
            token = payload.get("next_token")
            if token is None or token == "":
                return instances
            if not isinstance(token, str) or token in seen_tokens:
                raise self._malformed(Op.LIST, "next_token repeats or is not a string")
            seen_tokens.add(token)
            params["after_token"] = token
        raise self._malformed(Op.LIST, f"more than {MAX_PAGES} pages of instances")

    async def destroy_instance(self, instance_id: int) -> None:
        """Destroy one instance; one that is already gone is success. A 404 counts as gone
        even without a code: the core only believes an instance gone once observe agrees."""
        response = await self._send(Op.DESTROY, "DELETE", f"/api/v0/instances/{instance_id}/")
        payload = _json_body(response)
        answer = payload if isinstance(payload, dict) else None
        if response.is_success and (answer is None or answer.get("success") is not False):
            return
        if response.status_code == 404 or is_gone(answer):
            return
        raise self._error(Op.DESTROY, response, answer)

    # ------------------------------------------------------------------ plumbing

    async def _send(
        self,
        op: Op,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
    ) -> httpx.Response:
        await self._pacer.wait(op)
        try:
            return await self._http.request(method, path, params=params, json=json)
        except (httpx.HTTPError, httpx.StreamError) as error:
            # Timeouts and broken connections: retry. A create that landed is adopted by the
            # core (it observes by label before trying again).
            message = f"{op.value}: {type(error).__name__}: {error}"
            raise ProviderError(ErrorKind.TRANSIENT, message) from None

    async def _json(self, op: Op, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """A successful call's JSON object; errors classified; unreadable is Transient (a cut
        connection), a JSON value of the wrong shape is Failed."""
        response = await self._send(op, method, path, **kwargs)
        payload = _json_body(response)
        answer = payload if isinstance(payload, dict) else None
        if not response.is_success or (answer is not None and answer.get("success") is False):
            raise self._error(op, response, answer)
        if payload is _NOT_JSON:
            raise ProviderError(
                ErrorKind.TRANSIENT, f"{op.value}: HTTP {response.status_code}, not JSON"
            )
        if answer is None:
            raise self._malformed(op, f"a JSON {type(payload).__name__}, not an object")
        return answer

    def _error(
        self,
        op: Op,
        response: httpx.Response,
        answer: dict[str, Any] | None,
    ) -> ProviderError:
        return classify(
            op,
            response.status_code,
            answer,
            _text(response),
            headers=dict(response.headers),
        )

    def _malformed(self, op: Op, what: str) -> ProviderError:
        return ProviderError(ErrorKind.FAILED, f"{op.value}: unexpected answer from Vast: {what}")


def _json_body(response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return _NOT_JSON


def _text(response: httpx.Response) -> str:
    return response.content.decode("utf-8", errors="replace")

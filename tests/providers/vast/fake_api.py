"""A small stateful Vast.ai on a respx router: listings, contracts, labels, pages, destroys.

It answers the four calls the adapter makes the way Vast documents them, checks every request
against Vast's OpenAPI files (`violations`), and lets a test make a listing vanish
(`gone_asks`: create answers 404 no_such_ask) or script other answers (`scripted`).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
import respx

from tests.providers.vast import fixtures
from tests.providers.vast.contract import request_violation


@dataclass
class FakeVastApi:
    listings: list[dict[str, Any]] = field(default_factory=list)
    page_size: int = 25
    boot_polls: int = 1  # list calls a new instance spends loading before it runs
    ssh: tuple[str, int] | None = None  # every instance's public IP and 22/tcp port
    gone_asks: set[int] = field(default_factory=set)
    instances: dict[int, dict[str, Any]] = field(default_factory=dict)
    destroyed: list[int] = field(default_factory=list)
    created: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (ask, body)
    violations: list[str] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)
    # (method, path) -> answers (or exceptions to raise) before the stateful ones
    scripted: dict[tuple[str, str], deque[httpx.Response | Exception]] = field(default_factory=dict)
    next_id: int = 4000
    _polls: dict[int, int] = field(default_factory=dict)

    def install(self, router: respx.Router) -> respx.Router:
        base = fixtures.BASE_URL
        router.post(f"{base}/api/v0/bundles/").mock(side_effect=self._search)
        router.put(url__regex=rf"^{base}/api/v0/asks/(?P<ask>\d+)/$").mock(side_effect=self._create)
        router.get(url__regex=rf"^{base}/api/v1/instances/(\?.*)?$").mock(side_effect=self._list)
        router.delete(url__regex=rf"^{base}/api/v0/instances/(?P<iid>\d+)/$").mock(
            side_effect=self._destroy
        )
        return router

    def script(self, method: str, path: str, *responses: httpx.Response | Exception) -> None:
        self.scripted.setdefault((method, path), deque()).extend(responses)

    def live_instances(self) -> list[dict[str, Any]]:
        return list(self.instances.values())

    # ------------------------------------------------------------------ handlers

    def _seen(self, request: httpx.Request) -> httpx.Response | None:
        self.requests.append(request)
        if (violation := request_violation(request)) is not None:
            self.violations.append(violation)
        if request.headers.get("authorization") != f"Bearer {fixtures.API_KEY}":
            return httpx.Response(401, json=fixtures.AUTH_ERROR_401)
        queue = self.scripted.get((request.method, request.url.path))
        if not queue:
            return None
        answer = queue.popleft()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _search(self, request: httpx.Request) -> httpx.Response:
        if (answer := self._seen(request)) is not None:
            return answer
        body = json.loads(request.content)
        names = body.get("gpu_name", {}).get("in")
        count = body.get("num_gpus", {}).get("eq")
        offers = [
            offer
            for offer in self.listings
            if (names is None or offer["gpu_name"] in names)
            and (count is None or offer["num_gpus"] == count)
        ]
        offers.sort(key=lambda offer: (offer["dph_total"], offer["id"]))
        return httpx.Response(200, json={"offers": offers[: body.get("limit", 64)]})

    def _create(self, request: httpx.Request, ask: str) -> httpx.Response:
        if (answer := self._seen(request)) is not None:
            return answer
        ask_id = int(ask)
        if ask_id in self.gone_asks or all(o["id"] != ask_id for o in self.listings):
            return httpx.Response(404, json=fixtures.NO_SUCH_ASK_404)
        body = json.loads(request.content)
        self.created.append((ask_id, body))
        instance_id = self.next_id
        self.next_id += 1
        self.instances[instance_id] = fixtures.booting(instance_id, body.get("label"))
        self._polls[instance_id] = 0
        return httpx.Response(200, json={"success": True, "new_contract": instance_id})

    def _list(self, request: httpx.Request) -> httpx.Response:
        if (answer := self._seen(request)) is not None:
            return answer
        params = request.url.params
        filters = json.loads(params.get("select_filters", "{}"))
        wanted = filters.get("label", {}).get("eq")
        matching = [
            self._advance(i) for i in sorted(self.instances) if wanted in (None, self._label(i))
        ]
        start = int(params.get("after_token", "0") or 0)
        chunk = matching[start : start + self.page_size]
        more = start + self.page_size < len(matching)
        return httpx.Response(
            200, json=fixtures.page(chunk, str(start + self.page_size) if more else None)
        )

    def _destroy(self, request: httpx.Request, iid: str) -> httpx.Response:
        if (answer := self._seen(request)) is not None:
            return answer
        instance_id = int(iid)
        if self.instances.pop(instance_id, None) is None:
            return httpx.Response(404, json=fixtures.DESTROY_NOT_FOUND_404)
        self.destroyed.append(instance_id)
        return httpx.Response(200, json=fixtures.DESTROYED)

    # ------------------------------------------------------------------ state

    def _label(self, instance_id: int) -> str | None:
        return self.instances[instance_id].get("label")

    def _advance(self, instance_id: int) -> dict[str, Any]:
        """Each listing of an instance is a poll; after `boot_polls` it runs, port mapped."""
        self._polls[instance_id] = self._polls.get(instance_id, 0) + 1
        current = self.instances[instance_id]
        port = self.ssh[1] if self.ssh else 40000 + instance_id
        if current["actual_status"] == "loading" and self._polls[instance_id] > self.boot_polls:
            current.update(
                fixtures.instance(
                    instance_id,
                    current.get("label"),
                    public_ipaddr=self.ssh[0] if self.ssh else "198.51.100.7",
                    ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(port)}]},
                )
            )
        return dict(current)

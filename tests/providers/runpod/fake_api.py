"""A stateful stand-in for RunPod's REST v2 on a respx router (no network): the catalog, pods
that boot over a few list calls, stockouts per (GPU type, data centre), deletes. Every request
and answer is kept, so tests can check them against RunPod's OpenAPI document."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import respx

from providers.runpod.client import RunPodClient
from providers.runpod.cloud import RunPodCloud
from providers.runpod.config import RunPodConfig
from tests.providers.runpod.samples import API_KEY, BASE_URL, STOCKOUT_400, USER_KEY, catalog, pod

# What a new pod reports on the list calls after its create, then RUNNING with ssh.direct.
BOOT_SEQUENCE: tuple[tuple[str, bool], ...] = (("PROVISIONING", False), ("RUNNING", False))


@dataclass
class FakeRunPod:
    catalog: dict[str, Any] = field(default_factory=catalog)
    stockouts: set[tuple[str, str]] = field(default_factory=set)  # (gpu id, data centre)
    # (gpu id, data centre) -> the problem document its creates answer (its status with it)
    refusals: dict[tuple[str, str], bytes] = field(default_factory=dict)
    account_keys: list[str] = field(default_factory=lambda: [USER_KEY])
    ssh_direct: tuple[str, int] = ("195.26.233.3", 34446)  # every running pod's ssh.direct
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    exchanges: list[tuple[httpx.Request, httpx.Response]] = field(default_factory=list)
    created: list[dict[str, Any]] = field(default_factory=list)  # bodies of successful creates
    deleted: list[str] = field(default_factory=list)
    _lists_seen: dict[str, int] = field(default_factory=dict)
    _next_id: int = 0

    def __post_init__(self) -> None:
        self.router = respx.MockRouter(base_url=BASE_URL, assert_all_called=False)
        self.router.get("/v2/catalog/gpus").mock(side_effect=self._catalog)
        self.router.get("/v2/pods").mock(side_effect=self._list)
        self.router.post("/v2/pods").mock(side_effect=self._create)
        self.router.delete(path__regex=r"^/v2/pods/(?P<pod_id>[^/]+)$").mock(
            side_effect=self._delete
        )
        self.router.get("/v2/account/ssh-keys").mock(side_effect=self._keys)

    # ------------------------------------------------------------------ wiring

    def client(self) -> RunPodClient:
        transport = httpx.MockTransport(self._handle)
        return RunPodClient(API_KEY, BASE_URL, timeout=5.0, transport=transport)

    def cloud(self, **settings: Any) -> RunPodCloud:
        return RunPodCloud(RunPodConfig(base_url=BASE_URL, **settings), client=self.client())

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        response = await self.router.async_handler(request)
        await response.aread()
        self.exchanges.append((request, response))
        return response

    def calls(self, method: str, path: str) -> int:
        return sum(1 for r, _ in self.exchanges if (r.method, r.url.path) == (method, path))

    def live_pods(self) -> list[str]:
        return sorted(self.pods)

    # ------------------------------------------------------------------ endpoints

    def _catalog(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=self.catalog)

    def _list(self, request: httpx.Request) -> httpx.Response:
        for pod_id, document in self.pods.items():
            seen = self._lists_seen[pod_id] = self._lists_seen.get(pod_id, 0) + 1
            status, direct = (
                BOOT_SEQUENCE[seen - 1] if seen <= len(BOOT_SEQUENCE) else ("RUNNING", True)
            )
            self.pods[pod_id] = {
                **pod(
                    pod_id,
                    document["name"],
                    status,
                    direct,
                    document["dataCenterId"],
                    endpoint=self.ssh_direct,
                ),
                "env": document["env"],
                "gpu": {"id": document["gpu"]["id"], "count": document["gpu"]["count"]},
            }
        return httpx.Response(200, json={"pods": list(self.pods.values())})

    def _create(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        data_center = (body.get("dataCenterIds") or [None])[0]
        if (body["gpu"]["id"], data_center) in self.stockouts:
            return _problem(STOCKOUT_400)
        if (refusal := self.refusals.get((body["gpu"]["id"], data_center))) is not None:
            return _problem(refusal)
        self._next_id += 1
        pod_id = f"rp{self._next_id:08d}"
        document = {
            **pod(pod_id, body["name"], "PROVISIONING", False, data_center),
            "env": body.get("env", {}),
            "gpu": {"id": body["gpu"]["id"], "count": body["gpu"].get("count", 1)},
        }
        self.pods[pod_id] = document
        self.created.append(body)
        return httpx.Response(201, json=document)

    def _delete(self, request: httpx.Request, pod_id: str) -> httpx.Response:
        if self.pods.pop(pod_id, None) is None:
            return _problem(
                b'{"title": "Not Found", "status": 404, "detail": "pod not found"}', 404
            )
        self.deleted.append(pod_id)
        return httpx.Response(204)

    def _keys(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"keys": self.account_keys})


def _problem(body: bytes, status: int | None = None) -> httpx.Response:
    status = status or json.loads(body)["status"]
    return httpx.Response(
        status, content=body, headers={"Content-Type": "application/problem+json"}
    )

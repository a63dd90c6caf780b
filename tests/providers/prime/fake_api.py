"""Test support: the vendor OpenAPI contract, and a small stateful Prime Intellect API for respx.

`contract()` loads tests/fixtures/openapi/prime-intellect/ once, with two test-time repairs that
SOURCES.md explains: the `GPUType` enum lists RTX3070_8GB twice (de-duplicated here, as strict
JSON Schema tooling refuses it), and query parameters typed `anyOf: [array, null]` become the
array (openapi-core cannot split a repeated query key under anyOf). Nothing else is changed, so
paths (trailing slashes), bodies (PodRequestConfig has additionalProperties false), enums and
security are checked as the vendor wrote them.

`FakePrime` answers availability, pods and SSH keys from in-memory state, checks every request
and every answer it gives against the contract (violations are collected, tests assert none),
and walks a created pod through PROVISIONING -> ACTIVE/installing -> ACTIVE/FINISHED, one step
per pods listing, and DELETING -> TERMINATED -> gone after a delete.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import respx
import yaml
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict

from tests.providers.prime import bodies

SPEC = (
    Path(__file__).parents[2]
    / "fixtures/openapi/prime-intellect/prime-intellect-compute-api-openapi.yml"
)
BASE_URL = "https://api.primeintellect.ai"
API_KEY = "test-key-not-a-secret"


@functools.cache
def contract() -> OpenAPI:
    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    gpu_type = spec["components"]["schemas"]["GPUType"]
    gpu_type["enum"] = list(dict.fromkeys(gpu_type["enum"]))
    for operations in spec["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                arrays = [
                    s for s in parameter["schema"].get("anyOf", []) if s.get("type") == "array"
                ]
                if parameter["in"] == "query" and arrays:
                    parameter["schema"] = arrays[0]
    return OpenAPI.from_dict(spec)


class _Request:
    """openapi-core's Request protocol over an httpx.Request."""

    def __init__(self, request: httpx.Request) -> None:
        self._request = request
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(list(request.url.params.multi_items())),
            header=Headers(dict(request.headers)),
            cookie=ImmutableMultiDict(),
        )

    @property
    def host_url(self) -> str:
        return f"{self._request.url.scheme}://{self._request.url.netloc.decode()}"

    @property
    def path(self) -> str:
        return self._request.url.path

    @property
    def method(self) -> str:
        return self._request.method.lower()

    @property
    def body(self) -> bytes | None:
        return self._request.content or None

    @property
    def content_type(self) -> str:
        return self._request.headers.get("content-type", "")


class _Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status_code = status
        self.data = json.dumps(body).encode()
        self.content_type = "application/json"
        self.headers = Headers({"Content-Type": "application/json"})


def request_violation(request: httpx.Request) -> str | None:
    """Why the vendor document rejects `request`, or None."""
    try:
        contract().validate_request(_Request(request))
    except Exception as error:  # noqa: BLE001 - every validation failure is a finding
        return f"{request.method} {request.url}: {type(error).__name__}: {error}"
    return None


def response_violation(request: httpx.Request, status: int, body: Any) -> str | None:
    """Why the vendor document rejects `body` as the `status` answer to `request`, or None."""
    try:
        contract().validate_response(_Request(request), _Response(status, body))
    except Exception as error:  # noqa: BLE001
        return f"answer {status} to {request.method} {request.url.path}: {error}"
    return None


class FakePrime:
    """In-memory Prime Intellect: `transport()` goes into PrimeCloud(transport=...)."""

    def __init__(
        self, offers: list[dict[str, Any]] | None = None, ssh: tuple[str, int] | None = None
    ) -> None:
        self.offers = copy.deepcopy(offers or [])
        self.ssh = ssh  # every pod's SSH host and port (default: its own ip, port 22)
        self.pods: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, dict[str, Any]] = {}
        self.create_errors: dict[str, tuple[int, Any]] = {}  # cloudId -> answer
        self.violations: list[str] = []
        self.created: list[dict[str, Any]] = []  # create bodies, in order
        self.deleted: list[str] = []  # pod ids, in order
        self.calls: list[str] = []  # "METHOD path"
        self._ids = itertools.count(1)
        self.router = respx.Router(base_url=BASE_URL, assert_all_called=False)
        self._routes()

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.router.async_handler)

    def live_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p["status"] != "TERMINATED"]

    # ------------------------------------------------------------------ routes

    def _routes(self) -> None:
        r = self.router
        r.get("/api/v1/availability/gpus").mock(side_effect=self._checked(self._availability))
        r.get("/api/v1/pods/").mock(side_effect=self._checked(self._list_pods))
        r.post("/api/v1/pods/").mock(side_effect=self._checked(self._create))
        r.delete(path__regex=r"^/api/v1/pods/(?P<pod_id>[^/]+)$").mock(
            side_effect=self._checked(self._delete)
        )
        r.get("/api/v1/ssh_keys/").mock(side_effect=self._checked(self._list_keys))
        r.post("/api/v1/ssh_keys/").mock(side_effect=self._checked(self._add_key))

    def _checked(self, handler: Any) -> Any:
        def answer(request: httpx.Request, **path: str) -> httpx.Response:
            self.calls.append(f"{request.method} {request.url.path}")
            if (violation := request_violation(request)) is not None:
                self.violations.append(violation)
                return httpx.Response(422, json={"errors": [{"param": "?", "details": violation}]})
            status, body = handler(request, **path)
            # Only answers the document declares can be checked (it lists 200, 401 and 422).
            checkable = status == 200
            if checkable and (violation := response_violation(request, status, body)):
                self.violations.append(violation)
            return httpx.Response(status, json=body)

        return answer

    def _availability(self, request: httpx.Request) -> tuple[int, Any]:
        params = request.url.params
        page, size = int(params.get("page", 1)), int(params.get("page_size", 100))
        regions = params.get_list("regions")
        gpu_type = params.get("gpu_type")
        items = [
            o
            for o in self.offers
            if (not regions or o.get("region") in regions)
            and (gpu_type is None or o["gpuType"] == gpu_type)
        ]
        return 200, bodies.availability(*items[(page - 1) * size : page * size], total=len(items))

    def _list_pods(self, request: httpx.Request) -> tuple[int, Any]:
        offset, limit = int(request.url.params["offset"]), int(request.url.params["limit"])
        for pod in list(self.pods.values()):
            self._advance(pod)
        listed = list(self.pods.values())
        self.pods = {i: p for i, p in self.pods.items() if p["status"] != "TERMINATED"}
        page = listed[offset : offset + limit]
        return 200, bodies.pods_page(*page, offset=offset, total=len(listed))

    def _advance(self, pod: dict[str, Any]) -> None:
        """One lifecycle step per listing (what a real pod does between two polls)."""
        if pod["status"] == "PROVISIONING":
            pod.update(status="ACTIVE", installationStatus="ACTIVE", installationProgress=40)
        elif pod["status"] == "ACTIVE" and pod["installationStatus"] == "ACTIVE":
            pod.update(
                installationStatus="FINISHED",
                installationProgress=100,
                sshConnection=f"root@{pod['ip']} -p {self.ssh[1] if self.ssh else 22}",
            )
        elif pod["status"] == "DELETING":
            pod["status"] = "TERMINATED"

    def _create(self, request: httpx.Request) -> tuple[int, Any]:
        body = json.loads(request.content)
        self.created.append(body)
        spec = body["pod"]
        if spec["cloudId"] in self.create_errors:
            return self.create_errors[spec["cloudId"]]
        number = next(self._ids)
        pod_id = f"pod-{number:04d}"
        self.pods[pod_id] = bodies.pod(
            pod_id,
            spec["name"],
            gpuName=spec["gpuType"],
            gpuCount=spec["gpuCount"],
            ip=self.ssh[0] if self.ssh else f"203.0.113.{number}",
            socket=spec["socket"],
            providerType=body["provider"]["type"],
        )
        return 200, self.pods[pod_id]

    def _delete(self, request: httpx.Request, pod_id: str) -> tuple[int, Any]:
        self.deleted.append(pod_id)
        pod = self.pods.get(pod_id)
        if pod is None:
            return 404, bodies.NOT_FOUND
        pod["status"] = "DELETING"
        return 200, {"status": "DELETING"}

    def _list_keys(self, request: httpx.Request) -> tuple[int, Any]:
        return 200, bodies.keys_page(*self.keys.values())

    def _add_key(self, request: httpx.Request) -> tuple[int, Any]:
        body = json.loads(request.content)
        key_id = f"key-{next(self._ids):04d}"
        self.keys[key_id] = bodies.ssh_key(key_id, body["name"], body["publicKey"])
        return 200, self.keys[key_id]

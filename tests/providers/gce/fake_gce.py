"""A small stateful Compute Engine behind a respx router, for whole-job tests (reusable).

`FakeGce` answers the calls the gce adapter makes, with documented response shapes:
machineTypes/acceleratorTypes aggregated lists, firewalls insert/delete/list, instances insert
(honouring `requestId`: a repeat returns the same operation and makes nothing), zone-operation
waits (PENDING -> RUNNING -> DONE, one step per wait), label-filtered lists (paginated, zone and
aggregated), get, delete (STOPPING, then gone), zone operations, and Cloud Billing SKUs.

Zones in `stockout_zones` fail every insert through the operation with
ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS, as Compute Engine does; with `exceeded_quota` set
(e.g. "GPUS_ALL_REGIONS") every insert fails with QUOTA_EXCEEDED naming it. Instances boot one
status per observation (PROVISIONING -> STAGING -> RUNNING with an external IP).

    fake = FakeGce(stockout_zones={"us-central1-a"})
    cloud = fake.cloud()              # a GceCloud on this fake (static token, no credentials)
    ... run a job with {"gce": cloud} ...
    assert fake.live_instances() == [] and fake.firewalls == {}
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import respx
from temporalio.client import Client

from gpuprov.engine.worker import build_worker, open_records
from gpuprov.sdk.client import GpuprovClient
from providers.base import CloudProvider
from providers.gce.auth import StaticToken
from providers.gce.cloud import GceCloud
from providers.gce.config import GceConfig, GceMachineType, PriceComponent, region_of

BASE_URL = "https://compute.test/compute/v1"
BILLING_URL = "https://billing.test/v1"
PROJECT = "gpuprov-test"
TOKEN = "test-token-not-a-secret"
LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}"
GPU_SKU_AMERICAS = "0A1B-2C3D-4E5F"  # test SKUs: USD per GPU-hour
GPU_SKU_EMEA = "1A1B-2C3D-4E5F"
ZONES = ("us-central1-a", "us-central1-b", "europe-west4-a")
STOCKOUT = {
    "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "message": "The zone 'projects/{project}/zones/{zone}' does not have enough resources "
    "available to fulfill the request. '(resource type:compute)'.",
    "errorDetails": [
        {
            "errorInfo": {
                "reason": "resource_availability",
                "domain": "compute.googleapis.com",
                "metadatas": {"zone": "{zone}", "vmType": "a3-highgpu-8g"},
            }
        },
        {
            "help": {
                "links": [
                    {
                        "description": "Troubleshooting documentation",
                        "url": "https://cloud.google.com/compute/docs/resource-error",
                    }
                ]
            }
        },
    ],
}


def quota_error(quota: str) -> dict[str, Any]:
    """An operation error for an exceeded quota, as Compute Engine reports it."""
    metric = quota.lower()
    return {
        "code": "QUOTA_EXCEEDED",
        "message": f"Quota '{quota}' exceeded.  Limit: 0.0 globally.",
        "errorDetails": [
            {
                "quotaInfo": {
                    "metricName": f"compute.googleapis.com/{metric}",
                    "limitName": f"{quota.replace('_', '-')}-per-project",
                    "limit": 0,
                }
            }
        ],
    }


def h100_machine(zone: str) -> dict[str, Any]:
    return {
        "kind": "compute#machineType",
        "id": "1000130",
        "name": "a3-highgpu-8g",
        "description": "208 vCPUs, 1872 GB RAM, 8 accelerator cards",
        "guestCpus": 208,
        "memoryMb": 1916928,
        "maximumPersistentDisks": 128,
        "zone": zone,
        "selfLink": f"{LINK}/zones/{zone}/machineTypes/a3-highgpu-8g",
        "isSharedCpu": False,
        "accelerators": [{"guestAcceleratorType": "nvidia-h100-80gb", "guestAcceleratorCount": 8}],
    }


def h100_accelerator(zone: str) -> dict[str, Any]:
    return {
        "kind": "compute#acceleratorType",
        "id": "10039",
        "name": "nvidia-h100-80gb",
        "description": "NVIDIA H100 80GB",
        "zone": f"{LINK}/zones/{zone}",
        "selfLink": f"{LINK}/zones/{zone}/acceleratorTypes/nvidia-h100-80gb",
        "maximumCardsPerInstance": 8,
    }


def gpu_sku(sku_id: str, regions: list[str], usd: float, where: str, spot: bool = False) -> dict:
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    prefix = "Spot Preemptible " if spot else ""
    return {
        "name": f"services/6F81-5844-456A/skus/{sku_id}",
        "skuId": sku_id,
        "description": f"{prefix}Nvidia H100 80GB GPU running in {where}",
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": "GPU",
            "usageType": "Preemptible" if spot else "OnDemand",
        },
        "serviceRegions": regions,
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": "h",
                    "displayQuantity": 1,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {
                                "currencyCode": "USD",
                                "units": str(units),
                                "nanos": nanos,
                            },
                        }
                    ],
                    "usageUnitDescription": "hour",
                    "baseUnit": "s",
                    "baseUnitDescription": "second",
                    "baseUnitConversionFactor": 3600,
                },
                "currencyConversionRate": 1,
                "effectiveTime": "2026-08-01T00:00:00.000Z",
            }
        ],
        "serviceProviderName": "Google",
    }


def h100_catalogue() -> list[GceMachineType]:
    """a3-highgpu-8g priced as 8 x the test GPU SKU of its geography."""
    component = PriceComponent(quantity=8, skus=[GPU_SKU_AMERICAS, GPU_SKU_EMEA])
    return [GceMachineType(machine_type="a3-highgpu-8g", price_skus=[component])]


@dataclass
class FakeOperation:
    body: dict[str, Any]
    steps: list[str]  # statuses still to come, one per wait
    then: Any = None  # called when the operation reaches DONE

    def advance(self) -> None:
        if self.steps:
            self.body["status"] = self.steps.pop(0)
            if self.body["status"] == "DONE" and self.then is not None:
                self.then()
                self.then = None


@dataclass
class FakeGce:
    zones: tuple[str, ...] = ZONES
    stockout_zones: set[str] = field(default_factory=set)
    exceeded_quota: str | None = None  # e.g. "GPUS_ALL_REGIONS": every insert fails on it
    page_size: int = 2
    boot_polls: int = 2  # observations spent in PROVISIONING/STAGING before RUNNING
    skus: list[dict[str, Any]] = field(
        default_factory=lambda: [
            gpu_sku(GPU_SKU_AMERICAS, ["us-central1", "us-east4"], 1.0, "Americas"),
            gpu_sku(GPU_SKU_EMEA, ["europe-west4"], 1.25, "EMEA"),
        ]
    )
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, FakeOperation] = field(default_factory=dict)
    inserts: list[tuple[str, str]] = field(default_factory=list)  # (zone, name) per insert made
    request_ids: dict[str, str] = field(default_factory=dict)  # requestId -> operation name

    def __post_init__(self) -> None:
        self.router = respx.MockRouter(assert_all_called=False, base_url=None)
        self._route()

    # ------------------------------------------------------------------ building clouds

    def config(self, **overrides: Any) -> GceConfig:
        settings: dict[str, Any] = dict(
            project=PROJECT,
            zones=list(self.zones),
            machine_types=h100_catalogue(),
            base_url=BASE_URL,
            billing_base_url=BILLING_URL,
            boot_timeout=10,
            delete_timeout=10,
            poll_interval=0.05,
            operation_timeout=5,
            operation_poll_interval=0,
        )
        settings.update(overrides)
        return GceConfig(**settings)

    def cloud(self, **overrides: Any) -> GceCloud:
        transport = httpx.MockTransport(self.router.async_handler)
        return GceCloud(
            self.config(**overrides),
            tokens=StaticToken(TOKEN),
            http=httpx.AsyncClient(transport=transport),
        )

    def live_instances(self) -> list[str]:
        return sorted(f"{zone}/{name}" for zone, name in self.instances)

    # ------------------------------------------------------------------ routes

    def _route(self) -> None:
        project = re.escape(f"{BASE_URL}/projects/{PROJECT}")
        r = self.router
        r.get(url__regex=rf"^{project}/aggregated/machineTypes").mock(side_effect=self._machines)
        r.get(url__regex=rf"^{project}/aggregated/acceleratorTypes").mock(
            side_effect=self._accelerators
        )
        r.post(url__regex=rf"^{project}/global/firewalls\?").mock(side_effect=self._fw_insert)
        r.get(url__regex=rf"^{project}/global/firewalls(\?|$)").mock(side_effect=self._fw_list)
        r.delete(url__regex=rf"^{project}/global/firewalls/(?P<name>[^/?]+)").mock(
            side_effect=self._fw_delete
        )
        zone = rf"^{project}/zones/(?P<zone>[a-z0-9-]+)"
        r.post(url__regex=rf"{zone}/instances\?").mock(side_effect=self._insert)
        r.post(url__regex=rf"{zone}/operations/(?P<op>[^/]+)/wait").mock(side_effect=self._wait)
        r.get(url__regex=rf"{zone}/operations(\?|$)").mock(side_effect=self._zone_operations)
        r.get(url__regex=rf"{zone}/instances(\?|$)").mock(side_effect=self._list_zone)
        r.get(url__regex=rf"{zone}/instances/(?P<name>[^/?]+)").mock(side_effect=self._get)
        r.delete(url__regex=rf"{zone}/instances/(?P<name>[^/?]+)").mock(side_effect=self._delete)
        r.get(url__regex=rf"^{project}/aggregated/instances").mock(side_effect=self._list_all)
        r.get(url__regex=rf"^{re.escape(BILLING_URL)}/services/6F81-5844-456A/skus").mock(
            side_effect=self._skus
        )

    def _machines(self, request: httpx.Request) -> httpx.Response:
        items = {f"zones/{z}": {"machineTypes": [h100_machine(z)]} for z in self.zones}
        return _json({"kind": "compute#machineTypeAggregatedList", "items": items})

    def _accelerators(self, request: httpx.Request) -> httpx.Response:
        items = {f"zones/{z}": {"acceleratorTypes": [h100_accelerator(z)]} for z in self.zones}
        return _json({"kind": "compute#acceleratorTypeAggregatedList", "items": items})

    def _skus(self, request: httpx.Request) -> httpx.Response:
        return _json({"skus": self.skus, "nextPageToken": ""})

    def _fw_insert(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if replay := self._replayed(request):
            return replay
        if body["name"] in self.firewalls:
            return _error(409, "alreadyExists", f"The resource '{body['name']}' already exists")
        self.firewalls[body["name"]] = body
        return self._operation(request, "global", "insert", body["name"], ["DONE"], now=True)

    def _fw_list(self, request: httpx.Request) -> httpx.Response:
        """The rules whose whole name matches the `name eq "<RE2>"` filter; one page."""
        query = parse_qs(urlsplit(str(request.url)).query).get("filter", [""])[0]
        pattern = re.fullmatch(r'name eq "(.*)"', query)
        items = [
            {"kind": "compute#firewall", **body}
            for name, body in sorted(self.firewalls.items())
            if pattern is None or re.fullmatch(pattern.group(1), name)
        ]
        return _json({"kind": "compute#firewallList", "id": "firewalls", "items": items})

    def _fw_delete(self, request: httpx.Request, name: str) -> httpx.Response:
        if replay := self._replayed(request):
            return replay
        if self.firewalls.pop(name, None) is None:
            return _error(404, "notFound", f"The resource 'global/firewalls/{name}' was not found")
        return self._operation(request, "global", "delete", name, ["DONE"], now=True)

    def _insert(self, request: httpx.Request, zone: str) -> httpx.Response:
        body = json.loads(request.content)
        if replay := self._replayed(request):
            return replay
        name = body["name"]
        if (zone, name) in self.instances:
            return _error(409, "alreadyExists", f"The resource '{name}' already exists")
        if self.exceeded_quota:
            failure = quota_error(self.exceeded_quota)
            return self._operation(request, zone, "insert", name, ["RUNNING", "DONE"], failure)
        if zone in self.stockout_zones:
            failure = json.loads(json.dumps(STOCKOUT).replace("{zone}", zone))
            failure["message"] = failure["message"].replace("{project}", PROJECT)
            return self._operation(request, zone, "insert", name, ["RUNNING", "DONE"], failure)
        self.inserts.append((zone, name))
        self.instances[(zone, name)] = _instance(zone, body)
        return self._operation(request, zone, "insert", name, ["RUNNING", "DONE"])

    def _wait(self, request: httpx.Request, zone: str, op: str) -> httpx.Response:
        operation = self.operations.get(op)
        if operation is None:
            return _error(404, "notFound", f"The resource 'operations/{op}' was not found")
        operation.advance()
        return _json(operation.body)

    def _delete(self, request: httpx.Request, zone: str, name: str) -> httpx.Response:
        if replay := self._replayed(request):
            return replay
        instance = self.instances.get((zone, name))
        if instance is None:
            return _error(
                404, "notFound", f"The resource 'zones/{zone}/instances/{name}' was not found"
            )
        instance["status"] = "STOPPING"
        return self._operation(request, zone, "delete", name, ["RUNNING", "DONE"])

    def _get(self, request: httpx.Request, zone: str, name: str) -> httpx.Response:
        instance = self.instances.get((zone, name))
        if instance is None:
            return _error(
                404, "notFound", f"The resource 'zones/{zone}/instances/{name}' was not found"
            )
        return _json(_public(instance))

    def _zone_operations(self, request: httpx.Request, zone: str) -> httpx.Response:
        return _json({"kind": "compute#operationList", "items": []})

    def _list_zone(self, request: httpx.Request, zone: str) -> httpx.Response:
        self._tick()
        found = [i for (z, _), i in sorted(self.instances.items()) if z == zone]
        page, token = self._page(request, _filtered(found, _query(request, "filter")))
        return _json(_listing({"kind": "compute#instanceList", "items": page}, token))

    def _list_all(self, request: httpx.Request) -> httpx.Response:
        self._tick()
        found = [i for _, i in sorted(self.instances.items())]
        page, token = self._page(request, _filtered(found, _query(request, "filter")))
        items: dict[str, Any] = {
            f"zones/{z}": {"warning": {"code": "NO_RESULTS_ON_PAGE"}} for z in self.zones
        }
        for instance in page:
            items[f"zones/{_zone(instance)}"] = {
                "instances": [*items[f"zones/{_zone(instance)}"].get("instances", []), instance]
            }
        return _json(_listing({"kind": "compute#instanceAggregatedList", "items": items}, token))

    # ------------------------------------------------------------------ mechanics

    def _tick(self) -> None:
        """One observation: booting instances move on, deleted ones disappear."""
        for key, instance in list(self.instances.items()):
            if instance["status"] == "STOPPING":
                instance["_stopping"] = instance.get("_stopping", 0) + 1
                if instance["_stopping"] > 1:  # seen STOPPING once, then gone
                    del self.instances[key]
            elif instance["status"] in ("PROVISIONING", "STAGING"):
                instance["_polls"] = instance.get("_polls", 0) + 1
                if instance["_polls"] >= self.boot_polls:
                    instance["status"] = "RUNNING"
                    nic = instance["networkInterfaces"][0]
                    for config in nic.get("accessConfigs", []):
                        config["natIP"] = "34.118.0.10"
                else:
                    instance["status"] = "STAGING"

    def _page(self, request: httpx.Request, found: list[dict]) -> tuple[list[dict], str | None]:
        start = int(_query(request, "pageToken") or 0)
        end = start + self.page_size
        page = [_public(i) for i in found[start:end]]
        return page, (str(end) if end < len(found) else None)

    def _replayed(self, request: httpx.Request) -> httpx.Response | None:
        request_id = _query(request, "requestId")
        if request_id and request_id in self.request_ids:
            return _json(self.operations[self.request_ids[request_id]].body)
        return None

    def _operation(
        self,
        request: httpx.Request,
        zone: str,
        kind: str,
        target: str,
        steps: list[str],
        error: dict[str, Any] | None = None,
        now: bool = False,
    ) -> httpx.Response:
        name = f"operation-{len(self.operations) + 1:06d}-{kind}-{target}"[:63]
        scope = "global" if zone == "global" else f"zones/{zone}"
        body: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(9_000_000 + len(self.operations)),
            "name": name,
            "operationType": kind,
            "targetLink": f"{LINK}/{scope}/{'firewalls' if zone == 'global' else 'instances'}/"
            f"{target}",
            "status": "DONE" if now else "PENDING",
            "progress": 0,
            "insertTime": "2026-08-20T10:00:00.000-07:00",
            "selfLink": f"{LINK}/{scope}/operations/{name}",
        }
        if zone != "global":
            body["zone"] = f"{LINK}/zones/{zone}"
        operation = FakeOperation(body=body, steps=[] if now else list(steps))
        if error is not None:
            operation.then = lambda: body.update(
                error={"errors": [error]},
                httpErrorStatusCode=503,
                httpErrorMessage="SERVICE UNAVAILABLE",
            )
        self.operations[name] = operation
        if request_id := _query(request, "requestId"):
            self.request_ids[request_id] = name
        return _json(body)


def _instance(zone: str, body: dict[str, Any]) -> dict[str, Any]:
    nic = dict(body["networkInterfaces"][0])
    nic["networkIP"] = "10.128.0.7"
    nic["name"] = "nic0"
    return {
        **body,
        "kind": "compute#instance",
        "id": "4567890123456789012",
        "status": "PROVISIONING",
        "zone": f"{LINK}/zones/{zone}",
        "machineType": f"{LINK}/{body['machineType']}",
        "selfLink": f"{LINK}/zones/{zone}/instances/{body['name']}",
        "networkInterfaces": [nic],
        "creationTimestamp": "2026-08-20T10:00:00.000-07:00",
    }


def _public(instance: dict[str, Any]) -> dict[str, Any]:
    """The instance without the fake's own bookkeeping (`_polls`, `_stopping`)."""
    return {k: v for k, v in instance.items() if not k.startswith("_")}


def _listing(body: dict[str, Any], token: str | None) -> dict[str, Any]:
    """A list page; Compute Engine leaves `nextPageToken` out on the last page."""
    return {**body, "nextPageToken": token} if token else body


def _zone(instance: dict[str, Any]) -> str:
    return instance["zone"].rsplit("/", 1)[-1]


def _filtered(instances: Iterable[dict[str, Any]], query: str | None) -> list[dict[str, Any]]:
    if not query:
        return list(instances)
    if match := re.fullmatch(r'labels\.(\w+) = "([^"]*)"', query):
        key, value = match.groups()
        return [i for i in instances if i.get("labels", {}).get(key) == value]
    if match := re.fullmatch(r"labels\.(\w+):\*", query):
        return [i for i in instances if match.group(1) in i.get("labels", {})]
    raise AssertionError(f"the fake does not understand filter {query!r}")


def _query(request: httpx.Request, name: str) -> str | None:
    values = parse_qs(urlsplit(str(request.url)).query).get(name)
    return values[0] if values else None


def _json(body: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=body)


def _error(status: int, reason: str, message: str) -> httpx.Response:
    return _json(
        {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
            }
        },
        status,
    )


def regions_of(zones: Iterable[str]) -> list[str]:
    return sorted({region_of(zone) for zone in zones})


@asynccontextmanager
async def gce_worker(
    client: Client,
    task_queue: str,
    providers: dict[str, CloudProvider],
    api_url: str = "http://127.0.0.1:9",
) -> AsyncIterator[GpuprovClient]:
    """A gpuprov worker over `providers` (e.g. {"gce": fake.cloud(), "aws": ...}) and a fresh
    SQLite database; closes the providers afterwards."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-gce-") as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        worker = build_worker(client, task_queue, providers, records, api_url=api_url)
        try:
            async with worker:
                yield GpuprovClient(client, task_queue)
        finally:
            for provider in providers.values():
                await provider.aclose()
            records.db.dispose()

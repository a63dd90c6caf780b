"""A small Lambda Cloud account in memory, served over HTTP by a respx router: what the adapter
sees, with Lambda's documented bodies (fixtures.py) and error codes.

Firewall rulesets are kept as documented (`instance_ids` filled by launches that name them); a
ruleset still used by an instance refuses deletion with `firewall-ruleset-in-use`.
Instances move on with each `GET /instances`: `booting` for `boot_lists` listings, then
`active`; after a terminate `terminating` for one listing, then `terminated` for one, then
gone. Launch answers insufficient-capacity where the type lists no capacity in that region,
or whatever `launch_answers[(region, type)]` says.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import httpx
import respx

from providers.lambdalabs import cloud as cloud_module
from providers.lambdalabs import config as config_module

from .fixtures import API, API_KEY, IMAGES, INSTANCE_TYPES, USER_KEY
from .fixtures import error as error_body
from .fixtures import instance as instance_body
from .fixtures import region as region_body

LambdaCloud = cloud_module.LambdaCloud
LambdaConfig = config_module.LambdaConfig

INSUFFICIENT = error_body(
    "instance-operations/launch/insufficient-capacity",
    "Not enough capacity to fulfill launch request.",
)
RULESET_IN_USE = error_body(
    "firewall-rulesets/firewall-ruleset-in-use",
    "Firewall ruleset is in use by one or more instances.",
    "Terminate all instances that are using the ruleset before deleting it.",
)


class FakeLambda:
    def __init__(
        self,
        instance_types: dict[str, Any] | None = None,
        *,
        boot_lists: int = 1,
        keys: list[dict[str, str]] | None = None,
    ) -> None:
        self.instance_types = copy.deepcopy(
            INSTANCE_TYPES if instance_types is None else instance_types
        )
        self.instances: dict[str, dict[str, Any]] = {}
        self.keys = {key["id"]: dict(key) for key in (keys if keys is not None else [USER_KEY])}
        self.images = copy.deepcopy(IMAGES)
        self.launch_answers: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
        self.boot_lists = boot_lists
        self.rulesets: dict[str, dict[str, Any]] = {}  # id -> FirewallRuleset
        self.launches: list[dict[str, Any]] = []  # every launch body received
        self.terminated: list[str] = []  # ids, in the order terminate calls named them
        self._ages: dict[str, int] = {}
        self._ids = itertools.count(1)
        self.router = respx.Router(base_url=API, assert_all_called=False)
        route = self.router
        route.get("/instance-types").mock(side_effect=self._instance_types)
        route.post("/instance-operations/launch").mock(side_effect=self._launch)
        route.get("/instances").mock(side_effect=self._list)
        route.get(path__regex=r"/instances/(?P<instance_id>[^/]+)$").mock(side_effect=self._get)
        route.post("/instance-operations/terminate").mock(side_effect=self._terminate)
        route.get("/ssh-keys").mock(side_effect=self._keys)
        route.post("/ssh-keys").mock(side_effect=self._add_key)
        route.delete(path__regex=r"/ssh-keys/(?P<key_id>[^/]+)$").mock(side_effect=self._delete_key)
        route.get("/images").mock(side_effect=lambda request: self._ok(request, self.images))
        route.get("/firewall-rulesets").mock(
            side_effect=lambda request: self._ok(request, list(self.rulesets.values()))
        )
        route.post("/firewall-rulesets").mock(side_effect=self._add_ruleset)
        route.delete(path__regex=r"/firewall-rulesets/(?P<ruleset_id>[^/]+)$").mock(
            side_effect=self._delete_ruleset
        )

    # ------------------------------------------------------------------ for tests

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.router.async_handler)

    def cloud(self, **settings: Any) -> Any:
        settings = {"base_url": API.removesuffix("/api/v1"), "min_launch_interval": 0} | settings
        return LambdaCloud(LambdaConfig(**settings), api_key=API_KEY, transport=self.transport())

    def plant(self, *instances: dict[str, Any]) -> None:
        """Put instances into the account as they are (tests of odd states)."""
        for body in instances:
            self.instances[body["id"]] = body

    def live(self) -> list[dict[str, Any]]:
        return [i for i in self.instances.values() if i["status"] != "terminated"]

    def calls(self) -> list[tuple[httpx.Request, httpx.Response]]:
        return [(call.request, call.response) for call in self.router.calls]

    # ------------------------------------------------------------------ handlers

    def _ok(self, request: httpx.Request, data: Any) -> httpx.Response:
        return self._checked(request) or httpx.Response(200, json={"data": data})

    def _checked(self, request: httpx.Request) -> httpx.Response | None:
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return httpx.Response(
                401, json=error_body("global/invalid-api-key", "API key was invalid.", "Check it.")
            )
        return None

    def _instance_types(self, request: httpx.Request) -> httpx.Response:
        return self._ok(request, self.instance_types)

    def _launch(self, request: httpx.Request) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        body = json.loads(request.content)
        self.launches.append(body)
        region, kind = body["region_name"], body["instance_type_name"]
        if (region, kind) in self.launch_answers:
            status, answer = self.launch_answers[(region, kind)]
            return httpx.Response(status, json=answer)
        item = self.instance_types.get(kind)
        if item is None:
            return httpx.Response(
                400, json=error_body("global/invalid-parameters", "Invalid request data.")
            )
        key_names = {key["name"] for key in self.keys.values()}
        if len(body["ssh_key_names"]) != 1 or body["ssh_key_names"][0] not in key_names:
            missing = error_body(
                "global/object-does-not-exist", "Specified SSH key does not exist.", "Check it."
            )
            return httpx.Response(404, json=missing)
        attached = [entry["id"] for entry in body.get("firewall_rulesets", [])]
        if any(
            self.rulesets.get(ruleset_id, {}).get("region", {}).get("name") != region
            for ruleset_id in attached
        ):
            missing = error_body(
                "global/object-does-not-exist", "Firewall ruleset does not exist.", "Check it."
            )
            return httpx.Response(404, json=missing)
        if region not in {r["name"] for r in item["regions_with_capacity_available"]}:
            return httpx.Response(400, json=INSUFFICIENT)
        number = next(self._ids)
        instance_id = f"{number:032x}"
        for ruleset_id in attached:
            self.rulesets[ruleset_id]["instance_ids"].append(instance_id)
        self.instances[instance_id] = instance_body(
            instance_id,
            name=body.get("name"),
            status="booting",
            region_name=region,
            ip=None,
            kind=item["instance_type"],
            tags=body.get("tags", []),
            ssh_key_names=body["ssh_key_names"],
        )
        self._ages[instance_id] = 0
        return httpx.Response(200, json={"data": {"instance_ids": [instance_id]}})

    def _list(self, request: httpx.Request) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        listed = [copy.deepcopy(i) for i in self.instances.values()]
        self._advance()
        return httpx.Response(200, json={"data": listed})

    def _advance(self) -> None:
        for number, (instance_id, body) in enumerate(list(self.instances.items())):
            self._ages[instance_id] = self._ages.get(instance_id, 0) + 1
            if body["status"] == "booting" and self._ages[instance_id] >= self.boot_lists:
                body |= {"status": "active", "ip": f"198.51.100.{number % 250 + 2}"}
                body["actions"] = {name: {"available": True} for name in body["actions"]}
            elif body["status"] == "terminating":
                body["status"] = "terminated"
            elif body["status"] == "terminated":
                del self.instances[instance_id]
                for ruleset in self.rulesets.values():
                    if instance_id in ruleset["instance_ids"]:
                        ruleset["instance_ids"].remove(instance_id)

    def _get(self, request: httpx.Request, instance_id: str) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        found = self.instances.get(instance_id)
        if found is None:
            return httpx.Response(404, json=_instance_missing())
        return httpx.Response(200, json={"data": found})

    def _terminate(self, request: httpx.Request) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        ids = json.loads(request.content)["instance_ids"]
        found = [self.instances.get(i) for i in ids]
        if any(body is None or body["status"] == "terminated" for body in found):
            return httpx.Response(404, json=_instance_missing())
        for body in found:
            assert body is not None
            body["status"] = "terminating"
        self.terminated.extend(ids)
        return httpx.Response(200, json={"data": {"terminated_instances": found}})

    def _keys(self, request: httpx.Request) -> httpx.Response:
        return self._ok(request, list(self.keys.values()))

    def _add_key(self, request: httpx.Request) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        body = json.loads(request.content)
        if any(key["name"] == body["name"] for key in self.keys.values()):
            taken = error_body("global/invalid-parameters", "SSH key name already in use.")
            return httpx.Response(400, json=taken)
        key_id = f"{next(self._ids):032x}"
        self.keys[key_id] = {"id": key_id, "name": body["name"], "public_key": body["public_key"]}
        return httpx.Response(200, json={"data": self.keys[key_id]})

    def _delete_key(self, request: httpx.Request, key_id: str) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        if self.keys.pop(key_id, None) is None:
            missing = error_body("global/not-found", "The requested resource was not found.")
            return httpx.Response(404, json=missing)
        return httpx.Response(200, json={"data": {}})

    def _add_ruleset(self, request: httpx.Request) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        body = json.loads(request.content)
        ruleset_id = f"{next(self._ids):032x}"
        self.rulesets[ruleset_id] = {
            "id": ruleset_id,
            "name": body["name"],
            "region": region_body(body["region"]),
            "rules": body["rules"],
            "created": "2026-08-20T10:00:00+00:00",
            "instance_ids": [],
        }
        return httpx.Response(200, json={"data": self.rulesets[ruleset_id]})

    def _delete_ruleset(self, request: httpx.Request, ruleset_id: str) -> httpx.Response:
        if denied := self._checked(request):
            return denied
        ruleset = self.rulesets.get(ruleset_id)
        if ruleset is None:
            missing = error_body(
                "global/object-does-not-exist",
                "Firewall ruleset does not exist or you do not have permission to access it.",
                "Check your firewall ruleset ID and try again.",
            )
            return httpx.Response(404, json=missing)
        if ruleset["instance_ids"]:
            return httpx.Response(400, json=RULESET_IN_USE)
        del self.rulesets[ruleset_id]
        return httpx.Response(200, json={"data": {}})


def _instance_missing() -> dict[str, Any]:
    return error_body("global/object-does-not-exist", "Specified instance does not exist.")

"""The adapter against Lambda's published OpenAPI document (1.10.0, tests/fixtures/openapi/
lambda): every request it sends (path, method, auth, body) is one the document accepts, and
every response fixture matches the documented schema of its operation and status.

The document's server is `https://cloud.lambda.ai/` and its paths carry `/api/v1` (see
SOURCES.md), so requests to the test host are checked as if sent to the documented server."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from jsonschema_path import SchemaPath
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_schema_validator import OAS31Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from werkzeug.datastructures import Headers, ImmutableMultiDict

from providers.base import InstanceSpec, Location, NodeBootstrap, ResourceRequest
from providers.errors import ErrorKind, ProviderError

from . import fixtures as fx
from .fake_lambda import FakeLambda

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

DOCUMENT = Path(__file__).parents[2] / "fixtures/openapi/lambda/lambda-labs-openapi.json"
SERVER = "https://cloud.lambda.ai"
VM = "train-a1-n0-abc123"


@functools.cache
def spec_dict() -> dict[str, Any]:
    return json.loads(DOCUMENT.read_text())


@functools.cache
def openapi() -> OpenAPI:
    return OpenAPI(SchemaPath.from_dict(spec_dict()))


class DocumentedRequest:
    """An httpx request in openapi-core's Request protocol, re-homed on the documented server."""

    def __init__(self, request: httpx.Request) -> None:
        url = urlsplit(str(request.url))
        self.host_url = SERVER
        self.path = url.path
        self.method = request.method.lower()
        self.body = request.content or None
        self.content_type = request.headers.get("Content-Type", "application/json")
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(parse_qs(url.query)),
            header=Headers(dict(request.headers)),
            cookie=ImmutableMultiDict(),
        )


class DocumentedResponse:
    def __init__(self, status: int, body: Any) -> None:
        self.status_code = status
        self.data = json.dumps(body).encode()
        self.content_type = "application/json"
        self.headers = Headers({"Content-Type": "application/json"})


def request(method: str, path: str) -> DocumentedRequest:
    auth = {"Authorization": f"Bearer {fx.API_KEY}"}
    return DocumentedRequest(httpx.Request(method, f"{fx.API}{path}", headers=auth))


async def test_every_request_the_adapter_sends_is_documented(account: FakeLambda):
    account.launch_answers[("us-east-3", "gpu_8x_h100_sxm5")] = (400, fx.INSUFFICIENT_CAPACITY)
    cloud = account.cloud(image_family="lambda-stack-24-04")
    boot = NodeBootstrap(api_url="http://api:8080", join_token="t")
    south = Location(provider="lambda", region="us-south-2")
    spec = InstanceSpec(
        vm=VM,
        job="train",
        node_index=0,
        attempt=1,
        ssh_public_key=fx.VM_PUBLIC_KEY,
        user_data="#!/bin/sh\ntrue\n",
        labels={"gpuprov-job": "train"},
        bootstrap=boot,
        ports=[8888, 6006, 6007],
    )
    try:
        offers = await cloud.plan(ResourceRequest())
        east, south_offer = [o for o in offers if o.instance_type == "gpu_8x_h100_sxm5"]
        with pytest.raises(ProviderError):  # a stockout answer is part of the contract too
            await cloud.create(east, await cloud.prepare(east, spec), spec)
        prepared = await cloud.prepare(south_offer, spec)
        ruleset = prepared["firewall_ruleset_id"]
        ids = await cloud.create(south_offer, prepared, spec)
        await cloud.observe(south, VM)
        await cloud.observe_region(south)
        await cloud.diagnose(south, VM)
        await cloud.delete(south, VM, [*ids, "0" * 32])  # the second id is gone: a 404
        with pytest.raises(ProviderError) as in_use:  # the ruleset's instance still terminates
            await cloud.cleanup(south, VM)
        assert in_use.value.kind is ErrorKind.TRANSIENT
        while await cloud.observe(south, VM):
            pass  # terminating, then terminated, then gone
        await cloud.cleanup(south, VM)
    finally:
        await cloud.aclose()
    sent = {
        (r.method, re.sub(r"/(ssh-keys|firewall-rulesets)/.+", r"/\1/{id}", r.url.path))
        for r, _ in account.calls()
    }
    assert sent == {
        ("GET", "/api/v1/instance-types"),
        ("GET", "/api/v1/images"),
        ("GET", "/api/v1/ssh-keys"),
        ("POST", "/api/v1/ssh-keys"),
        ("POST", "/api/v1/instance-operations/launch"),
        ("GET", "/api/v1/instances"),
        ("POST", "/api/v1/instance-operations/terminate"),
        ("DELETE", "/api/v1/ssh-keys/{id}"),
        ("GET", "/api/v1/firewall-rulesets"),
        ("POST", "/api/v1/firewall-rulesets"),
        ("DELETE", "/api/v1/firewall-rulesets/{id}"),
    }
    launched = [body for body in account.launches if body["region_name"] == "us-south-2"]
    assert [body["firewall_rulesets"] for body in launched] == [[{"id": ruleset}]] and ruleset
    for sent_request, response in account.calls():
        documented = DocumentedRequest(sent_request)
        openapi().validate_request(documented)
        openapi().validate_response(
            documented, DocumentedResponse(response.status_code, json.loads(response.content))
        )


# (method, path, status, body): every response fixture, on the operation that documents it.
DOCUMENTED_RESPONSES = [
    ("GET", "/instance-types", 200, {"data": fx.INSTANCE_TYPES}),
    ("GET", "/instances", 200, {"data": [fx.instance("i1"), fx.instance("i2", status="booting")]}),
    ("GET", "/instances/i1", 200, {"data": fx.instance("i1", ip=None, status="preempted")}),
    ("GET", "/ssh-keys", 200, {"data": [fx.USER_KEY]}),
    ("GET", "/images", 200, {"data": fx.IMAGES}),
    ("POST", "/instance-operations/launch", 200, {"data": {"instance_ids": ["0" * 32]}}),
    ("POST", "/instance-operations/launch", 400, fx.INSUFFICIENT_CAPACITY),
    ("POST", "/instance-operations/launch", 400, fx.QUOTA_EXCEEDED),
    ("POST", "/instance-operations/launch", 400, fx.INVALID_PARAMETERS),
    ("POST", "/instance-operations/launch", 400, fx.FILE_SYSTEM_WRONG_REGION),
    ("POST", "/instance-operations/launch", 404, fx.LAUNCH_RESOURCE_MISSING),
    ("POST", "/instance-operations/launch", 401, fx.INVALID_API_KEY),
    ("POST", "/instance-operations/launch", 403, fx.ACCOUNT_INACTIVE),
    ("POST", "/instance-operations/launch", 403, fx.INVALID_ADDRESS),
    ("POST", "/instance-operations/terminate", 404, fx.INSTANCE_NOT_FOUND),
    ("POST", "/instance-operations/terminate", 200, {"data": {"terminated_instances": []}}),
    ("GET", "/instances/i1", 404, fx.INSTANCE_NOT_FOUND),
    ("GET", "/instances", 403, fx.FORBIDDEN),
    ("DELETE", "/ssh-keys/k1", 404, fx.NOT_FOUND),
    ("DELETE", "/ssh-keys/k1", 200, {"data": {}}),
    ("POST", "/instance-operations/restart", 409, fx.CONFLICT),
]


@pytest.mark.parametrize(("method", "path", "status", "body"), DOCUMENTED_RESPONSES)
def test_response_fixtures_match_their_documented_schema(method, path, status, body):
    openapi().validate_response(request(method, path), DocumentedResponse(status, body))


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        ("ApiErrorInternal", fx.INTERNAL["error"]),
        ("Instance", fx.instance("i", name="gpuprov-x", tags=[{"key": "a", "value": "b"}])),
    ],
)
def test_fixtures_without_an_operation_match_their_component_schema(schema, body):
    resource = Resource.from_contents(spec_dict(), default_specification=DRAFT202012)
    registry = Registry().with_resource("urn:lambda", resource)
    validator = OAS31Validator(
        {"$ref": f"urn:lambda#/components/schemas/{schema}"}, registry=registry
    )
    validator.validate(body)


def test_a_request_outside_the_document_is_caught():
    """The contract check can fail: a wrong path and a launch without ssh_key_names."""
    with pytest.raises(Exception, match="(?i)path"):
        openapi().validate_request(request("GET", "/instance"))
    launch = httpx.Request(
        "POST",
        f"{fx.API}/instance-operations/launch",
        headers={"Authorization": f"Bearer {fx.API_KEY}"},
        json={"region_name": "us-east-3", "instance_type_name": "gpu_8x_h100_sxm5"},
    )
    with pytest.raises(Exception):  # noqa: B017 - openapi-core's validation error
        openapi().validate_request(DocumentedRequest(launch))

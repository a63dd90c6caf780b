"""Vast's own OpenAPI files as the judge of what the adapter sends and what our fixtures claim.

The per-endpoint files (tests/fixtures/openapi/vast/yaml/) keep the trailing slashes the live
API has; the combined document strips them (tests/fixtures/openapi/SOURCES.md), so these are the
ones to validate against. Requests sent to the tests' host are checked as if sent to the
documented server, https://console.vast.ai.

One contradiction inside a file is settled by the file itself: search_offers.yaml's request
example sends `"type": "on-demand"`, its schema's enum says `ondemand`, and Vast's own client
sends `on-demand`. The judge accepts what the operation's own example sends beside the enum
(`EXAMPLE_ACCEPTED`), and nothing else.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import httpx
import yaml
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse

SPEC_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "openapi" / "vast" / "yaml"
SERVER = "https://console.vast.ai"

# (method, path pattern) -> the vendor file documenting it
OPERATIONS: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/api/v0/bundles/$"), "search_offers.yaml"),
    ("PUT", re.compile(r"^/api/v0/asks/\d+/$"), "create_instance.yaml"),
    ("GET", re.compile(r"^/api/v1/instances/$"), "show_instances.yaml"),
    ("DELETE", re.compile(r"^/api/v0/instances/\d+/$"), "destroy_instance.yaml"),
]


# (file, request body property) whose enum also accepts the value the operation's example has
EXAMPLE_ACCEPTED: list[tuple[str, str]] = [("search_offers.yaml", "type")]


@functools.cache
def vendor_spec(filename: str) -> OpenAPI:
    document = yaml.safe_load((SPEC_DIR / filename).read_text(encoding="utf-8"))
    for accepted_file, name in EXAMPLE_ACCEPTED:
        if accepted_file == filename:
            _accept_the_examples_value(document, name)
    return OpenAPI.from_dict(document, base_uri=(SPEC_DIR / filename).as_uri())


def _accept_the_examples_value(document: dict[str, Any], name: str) -> None:
    for operation in (op for path in document["paths"].values() for op in path.values()):
        media = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        example = media.get("example", {})
        schema = media.get("schema", {}).get("properties", {}).get(name, {})
        if name in example and "enum" in schema and example[name] not in schema["enum"]:
            schema["enum"] = [*schema["enum"], example[name]]


def documented_example(filename: str, name: str) -> Any:
    """The value the operation's own request example in `filename` gives `name`."""
    document = yaml.safe_load((SPEC_DIR / filename).read_text(encoding="utf-8"))
    for path in document["paths"].values():
        for operation in path.values():
            media = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if media and name in media.get("example", {}):
                return media["example"][name]
    raise AssertionError(f"{filename} has no request example with {name}")


def spec_for(method: str, path: str) -> OpenAPI:
    for op_method, pattern, filename in OPERATIONS:
        if op_method == method and pattern.match(path):
            return vendor_spec(filename)
    raise AssertionError(f"{method} {path} is not a Vast call the adapter may make")


def _mock_request(request: httpx.Request) -> MockRequest:
    return MockRequest(
        SERVER,
        request.method,
        request.url.path,
        args=dict(request.url.params),
        headers=dict(request.headers),
        data=request.content or None,
        content_type=request.headers.get("content-type", "application/json"),
    )


def request_violation(request: httpx.Request) -> str | None:
    """Why Vast's documentation refuses this request, or None when it accepts it."""
    try:
        spec = spec_for(request.method, request.url.path)
        spec.validate_request(_mock_request(request))
    except Exception as error:  # the validator's many error types: report, do not raise
        return f"{request.method} {request.url.path}: {type(error).__name__}: {error}"
    return None


def response_violation(
    method: str, path: str, status: int, body: Any, request_body: Any = None
) -> str | None:
    """Why Vast's documentation disagrees with this response fixture, or None."""
    request = MockRequest(
        SERVER,
        method,
        path,
        headers={"Authorization": "Bearer x"},
        data=json.dumps(request_body).encode() if request_body is not None else None,
    )
    response = MockResponse(json.dumps(body).encode(), status_code=status)
    try:
        spec_for(method, path).validate_response(request, response)
    except Exception as error:
        return f"{method} {path} {status}: {type(error).__name__}: {error}"
    return None

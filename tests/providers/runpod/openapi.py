"""RunPod's OpenAPI document (REST v2) as a validator for httpx requests and responses, with
openapi-core. The document is used unmodified: it loads and validates as is (see
tests/fixtures/openapi/SOURCES.md)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from urllib.parse import parse_qsl

import httpx
from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict

SPEC_PATH = (
    Path(__file__).parents[2]
    / "fixtures"
    / "openapi"
    / "runpod"
    / "api-reference-v2"
    / "openapi.json"
)


@cache
def runpod_v2() -> OpenAPI:
    # RunPod's errors are application/problem+json, which openapi-core does not decode itself.
    config = Config(extra_media_type_deserializers={"application/problem+json": json.loads})
    return OpenAPI.from_dict(json.loads(SPEC_PATH.read_text(encoding="utf-8")), config=config)


class OpenAPIRequest:
    """An httpx.Request in the shape openapi-core reads."""

    def __init__(self, request: httpx.Request) -> None:
        self._request = request
        query = parse_qsl(request.url.query.decode(), keep_blank_values=True)
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(query),
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
        return self._request.headers.get("content-type", "").lower()


class OpenAPIResponse:
    """An httpx.Response in the shape openapi-core reads."""

    def __init__(self, response: httpx.Response) -> None:
        self.data = response.content
        self.status_code = response.status_code
        self.content_type = response.headers.get("content-type", "").lower()
        self.headers = Headers(dict(response.headers))


def validate_request(request: httpx.Request) -> None:
    runpod_v2().validate_request(OpenAPIRequest(request))


def validate_response(request: httpx.Request, response: httpx.Response) -> None:
    runpod_v2().validate_response(OpenAPIRequest(request), OpenAPIResponse(response))

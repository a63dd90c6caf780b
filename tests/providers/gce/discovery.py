"""A small validator of HTTP requests and JSON bodies against a Google API Discovery document.

Google publishes no OpenAPI document for Compute Engine; its machine-readable contract is the
Discovery document (tests/fixtures/discovery, see SOURCES.md there). This checks what the gce
adapter sends and what its fixtures answer, against that document:

- the request's method and path are a Discovery method's `httpMethod` + `path` under the
  document's `servicePath`, every path parameter filled and matching its declared `pattern`
  (`{+name}` may span slashes);
- every query parameter is one the method (or the document, like `fields`) declares, with the
  declared type, format, range, enum and repetition; required parameters are present;
- a JSON body is allowed only where the method declares a `request`, and must fit that schema:
  every property name exists (through `$ref`, array `items`, `additionalProperties` maps such as
  labels), leaf types match, enums and patterns hold, no output-only (`readOnly`) property is set,
  and properties the schema marks required for this method id are present;
- a response body fits the method's `response` schema the same way (output-only allowed).

Types follow what Google's JSON mapping (proto3 JSON) accepts: 64-bit integers (`string`
`int64`/`uint64`) as decimal strings or numbers, 32-bit integers as numbers or decimal strings,
floats as numbers, booleans only as JSON booleans. A JSON null is reported: Google reads it as
"unset", so sending one is always a mistake of ours.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx

FIXTURES = Path(__file__).parents[2] / "fixtures" / "discovery"
INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
_DECIMAL = re.compile(r"-?[0-9]+")
_PLACEHOLDER = re.compile(r"\{(\+?)([A-Za-z0-9_.]+)\}")


@dataclass(frozen=True)
class Method:
    """One Discovery method: `id` like `compute.instances.insert`."""

    id: str
    http_method: str
    path: str
    parameters: dict[str, Any]
    request: str | None  # schema name
    response: str | None
    pattern: re.Pattern[str] = field(repr=False)

    @property
    def literal_length(self) -> int:
        """How specific the path is: longer literal text wins over a placeholder."""
        return len(_PLACEHOLDER.sub("", self.path))


@dataclass
class Checked:
    """The method a request matched (None if none did) and every problem found."""

    method: Method | None
    problems: list[str]


class Discovery:
    """One Discovery document, with requests addressed to `root` (the test host standing in
    for the document's `rootUrl`, e.g. `https://compute.test/` for compute.googleapis.com)."""

    def __init__(self, document: dict[str, Any], root: str | None = None) -> None:
        self.document = document
        self.root = (root or document["rootUrl"]).rstrip("/") + "/"
        self.service_path = document["servicePath"]
        self.schemas: dict[str, Any] = document["schemas"]
        self.global_parameters: dict[str, Any] = document.get("parameters", {})
        self.methods = list(_methods(document.get("resources", {})))

    @property
    def base_url(self) -> str:
        """Where the document's methods live, as a test host URL (root + servicePath)."""
        return (self.root + self.service_path).rstrip("/")

    def method(self, method_id: str) -> Method:
        return next(m for m in self.methods if m.id == method_id)

    # ------------------------------------------------------------------ requests

    def match(self, http_method: str, url: str) -> tuple[Method | None, dict[str, str], str]:
        """The most specific method whose method and path fit, its path parameters, and the
        path relative to the service (for messages)."""
        split = urlsplit(url)
        whole = f"{split.scheme}://{split.netloc}{split.path}"
        if not whole.startswith(self.root):
            return None, {}, whole
        relative = whole[len(self.root) :]
        if not relative.startswith(self.service_path):
            return None, {}, relative
        relative = relative[len(self.service_path) :]
        found = [
            (m, match)
            for m in self.methods
            if m.http_method == http_method.upper() and (match := m.pattern.fullmatch(relative))
        ]
        if not found:
            return None, {}, relative
        method, match = max(found, key=lambda pair: pair[0].literal_length)
        values = {name.replace("__", "."): unquote(v) for name, v in match.groupdict().items()}
        return method, values, relative

    def check_request(self, request: httpx.Request) -> Checked:
        method, path_values, relative = self.match(request.method, str(request.url))
        if method is None:
            return Checked(None, [f"no method {request.method} {relative} in the document"])
        problems: list[str] = []
        for name, value in path_values.items():
            problems += self._parameter(method, name, [value], "path")
        query = parse_qs(urlsplit(str(request.url)).query, keep_blank_values=True)
        for name, values in query.items():
            problems += self._parameter(method, name, values, "query")
        for name, spec in method.parameters.items():
            if spec.get("required") and name not in path_values and name not in query:
                problems.append(f"{method.id}: required parameter {name} is missing")
        problems += self._request_body(method, request)
        return Checked(method, problems)

    def _parameter(self, method: Method, name: str, values: list[str], location: str) -> list[str]:
        spec = method.parameters.get(name)
        if spec is None and location == "query":
            spec = self.global_parameters.get(name)
        where = f"{method.id}: {location} parameter {name}"
        if spec is None:
            return [f"{where} is not declared by the method"]
        if spec.get("location") != location:
            return [f"{where} is declared in the {spec.get('location')}, not the {location}"]
        if len(values) > 1 and not spec.get("repeated"):
            return [f"{where} is repeated but not declared repeated"]
        problems = []
        for value in values:
            problems += _parameter_value(spec, value, where)
        return problems

    def _request_body(self, method: Method, request: httpx.Request) -> list[str]:
        if not request.content:
            if method.request is not None:
                return [f"{method.id}: no request body, the method takes a {method.request}"]
            return []
        if method.request is None:
            return [f"{method.id}: a body was sent, the method declares none"]
        try:
            body = json.loads(request.content)
        except ValueError:
            return [f"{method.id}: the request body is not JSON"]
        return self.check_body(method, body, request=True)

    # ------------------------------------------------------------------ bodies

    def check_body(self, method: Method, body: Any, *, request: bool) -> list[str]:
        """`body` against the method's request (or response) schema."""
        schema_name = method.request if request else method.response
        if schema_name is None:
            return [f"{method.id} declares no {'request' if request else 'response'} body"]
        problems: list[str] = []
        self._value({"$ref": schema_name}, body, schema_name, problems, request, method.id)
        return problems

    def check_schema(self, schema_name: str, body: Any, *, request: bool = False) -> list[str]:
        """`body` against a named schema (e.g. a fixture that is one `Operation`)."""
        problems: list[str] = []
        self._value({"$ref": schema_name}, body, schema_name, problems, request, None)
        return problems

    def _value(
        self,
        schema: dict[str, Any],
        value: Any,
        where: str,
        problems: list[str],
        request: bool,
        method_id: str | None,
    ) -> None:
        if "$ref" in schema:
            schema = self.schemas[schema["$ref"]]
        kind = schema.get("type")
        if value is None:
            problems.append(f"{where}: null")
        elif kind == "object":
            self._object(schema, value, where, problems, request, method_id)
        elif kind == "array":
            if not isinstance(value, list):
                problems.append(f"{where}: {type(value).__name__}, expected an array")
                return
            items = dict(schema.get("items", {}))
            if "pattern" in schema:  # Discovery puts a list's item pattern on the list
                items.setdefault("pattern", schema["pattern"])
            for index, item in enumerate(value):
                self._value(items, item, f"{where}[{index}]", problems, request, method_id)
        elif kind != "any":
            problems.extend(_leaf(schema, value, where))

    def _object(
        self,
        schema: dict[str, Any],
        value: Any,
        where: str,
        problems: list[str],
        request: bool,
        method_id: str | None,
    ) -> None:
        if not isinstance(value, dict):
            problems.append(f"{where}: {type(value).__name__}, expected an object")
            return
        properties: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            spec = properties.get(key)
            if spec is None and extra is None:
                problems.append(f"{where}.{key}: no such property")
                continue
            if spec is not None and request and spec.get("readOnly"):
                problems.append(f"{where}.{key}: output only, not accepted in a request")
            self._value(spec or extra, item, f"{where}.{key}", problems, request, method_id)
        if request and method_id:
            for key, spec in properties.items():
                needed = spec.get("annotations", {}).get("required", [])
                if method_id in needed and key not in value:
                    problems.append(f"{where}.{key}: required by {method_id}, missing")


def _methods(resources: dict[str, Any]):
    for resource in resources.values():
        for spec in resource.get("methods", {}).values():
            request, response = spec.get("request"), spec.get("response")
            yield Method(
                id=spec["id"],
                http_method=spec["httpMethod"],
                path=spec["path"],
                parameters=spec.get("parameters", {}),
                request=request["$ref"] if request else None,
                response=response["$ref"] if response else None,
                pattern=_path_pattern(spec["path"]),
            )
        yield from _methods(resource.get("resources", {}))


def _path_pattern(path: str) -> re.Pattern[str]:
    """`projects/{project}/zones/{zone}` -> a regex; `{+name}` may hold slashes."""
    parts, last = [], 0
    for match in _PLACEHOLDER.finditer(path):
        parts.append(re.escape(path[last : match.start()]))
        group = match.group(2).replace(".", "__")
        parts.append(f"(?P<{group}>.+?)" if match.group(1) else f"(?P<{group}>[^/]+)")
        last = match.end()
    parts.append(re.escape(path[last:]))
    return re.compile("".join(parts))


def _parameter_value(spec: dict[str, Any], value: str, where: str) -> list[str]:
    """A query or path value (always text on the wire) against its declaration."""
    kind, problems = spec.get("type"), []
    if value == "":
        return [f"{where}: empty"]
    if kind == "integer" or spec.get("format") in INT_RANGES:
        problems += _integer(value, spec, where)
    elif kind == "number":
        try:
            float(value)
        except ValueError:
            problems.append(f"{where}: {value!r} is not a number")
    elif kind == "boolean" and value not in ("true", "false"):
        problems.append(f"{where}: {value!r} is not true or false")
    if "enum" in spec and value not in spec["enum"]:
        problems.append(f"{where}: {value!r} is not one of the declared values")
    if "pattern" in spec and not re.fullmatch(spec["pattern"], value):
        problems.append(f"{where}: {value!r} does not match {spec['pattern']}")
    return problems


def _integer(value: Any, spec: dict[str, Any], where: str) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return [f"{where}: {type(value).__name__}, expected an integer"]
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        return [f"{where}: {value!r} is not a decimal integer"]
    number = int(value)
    low, high = INT_RANGES.get(spec.get("format", "int32"), INT_RANGES["int32"])
    if "minimum" in spec:
        low = max(low, int(spec["minimum"]))
    if "maximum" in spec:
        high = min(high, int(spec["maximum"]))
    if not low <= number <= high:
        return [f"{where}: {number} is outside {low}..{high}"]
    return []


def _leaf(schema: dict[str, Any], value: Any, where: str) -> list[str]:
    """A JSON leaf against a Discovery leaf schema, as proto3 JSON accepts it."""
    kind, fmt = schema.get("type"), schema.get("format")
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{where}: {value!r} is not a boolean"]
    if kind == "integer" or (kind == "string" and fmt in INT_RANGES):
        return _integer(value, schema, where)
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return [f"{where}: {type(value).__name__}, expected a number"]
        try:
            float(value)
        except ValueError:
            return [f"{where}: {value!r} is not a number"]
        return []
    if kind != "string":
        return [f"{where}: the document's type {kind!r} is not understood here"]
    if not isinstance(value, str):
        return [f"{where}: {type(value).__name__}, expected a string"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} is not one of the declared values"]
    if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
        return [f"{where}: {value!r} does not match {schema['pattern']}"]
    return []


@functools.cache
def document(name: str) -> dict[str, Any]:
    """A Discovery document under tests/fixtures/discovery, e.g. `compute.v1`."""
    return json.loads((FIXTURES / f"{name}.json").read_text())

"""Prime Intellect failures -> ErrorKind: one table, read top to bottom.

What the API sends back (vendor OpenAPI `ErrorResponse`, and FastAPI's own shapes that the Prime
CLI reads): `{"errors": [{"param", "details"}]}`, `{"detail": "<text>"}` or, for FastAPI's
validation errors, `{"detail": [{"loc", "msg", "type"}]}`. Prime publishes no error codes, so its
`detail` text is the code: `DETAIL_TABLE` maps known phrases (matched case-insensitively inside
the detail) to a kind. Stockout texts are not documented by Prime ([U] in clouds.md): the
Capacity phrases are common stockout wordings plus the upstream texts Prime may pass through
(RunPod's "There are no longer any instances available with the requested specifications",
runpod/runpodctl#189, and "not enough free GPUs on the host machine"), and an unknown text on
create still fails over (Failed), never aborts.

Order of decision (`classify_status`):
1. 429 -> Transient, honouring Retry-After;
2. 401 / 403 -> Credentials (key invalid, or missing the Instances/Availability permission);
3. the first `DETAIL_TABLE` phrase found in the detail text;
4. `STATUS_TABLE` (402 payment required -> Quota for the whole provider: the wallet is the
   account's; 422 "Invalid request data" -> InvalidRequest);
5. 5xx -> Failed on create (the pod may exist; the core tears down by name), else Transient;
6. anything else -> Failed (resources may exist, so the core tears down and fails over).
InvalidRequest (from 3 or 4) stands only on create, whose body carries the job's ask (its
image). Every other call is made of our own parameters: the availability filters, the paging
offsets, a pod id we were given, the deployment's key. Prime documents a 422 on each of them,
and there it says nothing about the job, so it is Failed: a plan blocks Prime and the job fails
over, a teardown tries again (and records a possible orphan), never an abort.
A network error or timeout is Transient everywhere: on create the core observes first and
adopts a pod whose response was lost.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any

import httpx

from providers.errors import BlockScope, ErrorKind, ProviderError

# A "gone" answer to a delete: the pod is already gone, which delete treats as success.
GONE = "gone"

# (phrase inside the lower-cased detail, kind or GONE, block scope override). First match wins,
# so the more specific phrases come first.
DETAIL_TABLE: tuple[tuple[str, ErrorKind | str, BlockScope | None], ...] = (
    # already gone (delete / get of a pod that no longer exists)
    ("pod not found", GONE, None),
    ("already terminated", GONE, None),
    ("already deleted", GONE, None),
    # account limits: the wallet and the team's limits are account-wide
    ("insufficient balance", ErrorKind.QUOTA, BlockScope.PROVIDER),
    ("insufficient funds", ErrorKind.QUOTA, BlockScope.PROVIDER),
    ("not enough balance", ErrorKind.QUOTA, BlockScope.PROVIDER),
    ("payment required", ErrorKind.QUOTA, BlockScope.PROVIDER),
    ("quota", ErrorKind.QUOTA, BlockScope.PROVIDER),
    ("limit exceeded", ErrorKind.QUOTA, BlockScope.PROVIDER),
    ("maximum number of pods", ErrorKind.QUOTA, BlockScope.PROVIDER),
    # stockouts: this offer has no machine left right now
    ("out of stock", ErrorKind.CAPACITY, None),
    ("no capacity", ErrorKind.CAPACITY, None),
    ("insufficient capacity", ErrorKind.CAPACITY, None),
    ("not enough capacity", ErrorKind.CAPACITY, None),
    ("no longer available", ErrorKind.CAPACITY, None),
    ("no longer any instances available", ErrorKind.CAPACITY, None),
    ("not enough free gpus", ErrorKind.CAPACITY, None),
    ("no instances available", ErrorKind.CAPACITY, None),
    ("no gpus available", ErrorKind.CAPACITY, None),
    ("no available gpu", ErrorKind.CAPACITY, None),
    ("not enough gpus", ErrorKind.CAPACITY, None),
    ("sold out", ErrorKind.CAPACITY, None),
    ("currently unavailable", ErrorKind.CAPACITY, None),
    # this offer cannot take this pod, nothing was created
    ("image not available", ErrorKind.UNAVAILABLE, None),
    ("not supported by this provider", ErrorKind.UNAVAILABLE, None),
    # authentication in words (some proxies answer 400 with these)
    ("invalid api key", ErrorKind.CREDENTIALS, None),
    ("api key unauthorized", ErrorKind.CREDENTIALS, None),
    # our request is wrong: no offer can fix it
    ("missing field", ErrorKind.INVALID_REQUEST, None),
    ("validation error", ErrorKind.INVALID_REQUEST, None),
)

# The operations whose request carries the job's own ask; elsewhere InvalidRequest is Failed.
JOB_ASKS = frozenset({"create"})

# HTTP status -> (kind or GONE, block scope), consulted when no phrase matched.
STATUS_TABLE: dict[int, tuple[ErrorKind | str, BlockScope | None]] = {
    402: (ErrorKind.QUOTA, BlockScope.PROVIDER),  # Prime CLI: "Payment required ... billing status"
    404: (GONE, None),
    410: (GONE, None),
    422: (ErrorKind.INVALID_REQUEST, None),  # vendor document: "Invalid request data"
}


class PodGone(Exception):
    """The pod a delete named does not exist any more: delete treats this as done."""


def detail_text(body: Any) -> str:
    """The cloud's own words from any of Prime's error shapes, or the raw text, whole (the core
    scrubs secrets out, then shortens)."""
    if isinstance(body, Mapping):
        detail = body.get("detail")
        errors = body.get("errors")
        if isinstance(detail, str):
            return _one_line(detail)
        if isinstance(detail, list):
            return _one_line("; ".join(_validation_item(item) for item in detail))
        if isinstance(errors, list):
            return _one_line("; ".join(_error_item(item) for item in errors))
        for key in ("message", "error"):
            if isinstance(body.get(key), str):
                return _one_line(body[key])
    if isinstance(body, str):
        return _one_line(body)
    return _one_line(json.dumps(body, default=str)) if body is not None else ""


def _validation_item(item: Any) -> str:
    if isinstance(item, Mapping):
        loc = item.get("loc")
        where = ".".join(str(part) for part in loc) if isinstance(loc, list) else ""
        return f"{where}: {item.get('msg', '')}".strip(": ")
    return str(item)


def _error_item(item: Any) -> str:
    if isinstance(item, Mapping):
        return f"{item.get('param', '')}: {item.get('details', '')}".strip(": ")
    return str(item)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def response_body(response: httpx.Response) -> Any:
    """The response's JSON, or its text when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        return response.text


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), 3600.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None or when.tzinfo is None:
        return None
    delta = when.timestamp() - (time.time() if now is None else now)
    return min(max(delta, 0.0), 3600.0)


def lookup(status: int, detail: str) -> tuple[ErrorKind | str, BlockScope | None] | None:
    """The table's verdict for this status and detail, before the operation's defaults."""
    if status == 429:
        return ErrorKind.TRANSIENT, None
    if status in (401, 403):
        return ErrorKind.CREDENTIALS, None
    lowered = detail.lower()
    for phrase, kind, scope in DETAIL_TABLE:
        if phrase in lowered:
            return kind, scope
    return STATUS_TABLE.get(status)


def classify_status(operation: str, response: httpx.Response) -> ProviderError | PodGone:
    """The ProviderError (or PodGone) for a non-2xx answer to `operation` ("create", ...)."""
    detail = detail_text(response_body(response))
    where = f"{response.request.method} {response.request.url.path}"
    message = f"{where} -> HTTP {response.status_code}: {detail or '(no detail)'}"
    verdict = lookup(response.status_code, detail)
    if verdict is not None and verdict[0] == GONE:
        if operation == "delete":
            return PodGone(message)
        verdict = None  # a "not found" anywhere else is not a success: fall through
    if verdict is not None:
        kind, scope = verdict
        assert isinstance(kind, ErrorKind)
        if kind is ErrorKind.INVALID_REQUEST and operation not in JOB_ASKS:
            kind = ErrorKind.FAILED
        retry_after = retry_after_seconds(response.headers) if kind is ErrorKind.TRANSIENT else None
        return ProviderError(kind, message, retry_after=retry_after, block_scope=scope)
    if response.status_code >= 500:
        kind = ErrorKind.FAILED if operation == "create" else ErrorKind.TRANSIENT
        return ProviderError(kind, message)
    return ProviderError(ErrorKind.FAILED, message)


def classify_transport(operation: str, method: str, path: str, error: Exception) -> ProviderError:
    """A request that got no HTTP answer (connect error, timeout, broken stream): Transient."""
    reason = type(error).__name__
    return ProviderError(ErrorKind.TRANSIENT, f"{method} {path} ({operation}): {reason}: {error}")


def malformed(operation: str, what: str) -> ProviderError:
    """A 2xx answer we cannot read. On create a pod may exist (Failed: the core tears down by
    name); on reads it is a missed answer (Transient: the next poll tries again)."""
    kind = ErrorKind.FAILED if operation == "create" else ErrorKind.TRANSIENT
    return ProviderError(kind, f"{operation}: unreadable answer from Prime Intellect: {what}")

"""Compute Engine failures -> ErrorKind, by the error's reason or code, never HTTP status alone.

Two shapes reach us:
- an HTTP error: `{"error": {"code": 403, "message", "status", "errors": [{"reason", "domain",
  "message"}], "details": [...]}}`; the `reason` of `errors[]` decides (a 403 may be quota,
  rate limit or permission);
- a failed Operation (inserts fail here, after a 200): `{"status": "DONE", "error": {"errors":
  [{"code", "message", "errorDetails": [{"quotaInfo": {...}}, ...]}]}, "httpErrorStatusCode"}`;
  the `code` decides. Stockouts (ZONE_RESOURCE_POOL_EXHAUSTED...) only ever arrive this way.

Only where no reason or code is known does the HTTP status choose, and then by what the call
was: an unknown failure of an insert may have made something (Failed), of a read is Transient.
InvalidRequest stands only where the job's ask went in (an insert, plan's catalogue reads): on
a delete or an instance list every parameter is ours, and `of_our_own` makes it Failed.
A quota that is project-wide (`GPUS_ALL_REGIONS`, `CPUS_ALL_REGIONS`, `FIREWALLS`) blocks the
whole provider, not just the region.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from providers.errors import BlockScope, ErrorKind, ProviderError

# errors[].reason of an HTTP error response.
HTTP_REASONS: dict[str, ErrorKind] = {
    "quotaExceeded": ErrorKind.QUOTA,
    "QUOTA_EXCEEDED": ErrorKind.QUOTA,
    "insufficientCapacity": ErrorKind.CAPACITY,
    "ZONE_RESOURCE_POOL_EXHAUSTED": ErrorKind.CAPACITY,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": ErrorKind.CAPACITY,
    "rateLimitExceeded": ErrorKind.TRANSIENT,
    "userRateLimitExceeded": ErrorKind.TRANSIENT,
    "backendError": ErrorKind.TRANSIENT,
    "internalError": ErrorKind.TRANSIENT,
    "resourceNotReady": ErrorKind.TRANSIENT,
    "RESOURCE_NOT_READY": ErrorKind.TRANSIENT,
    "RESOURCE_OPERATION_RATE_EXCEEDED": ErrorKind.TRANSIENT,
    "invalid": ErrorKind.INVALID_REQUEST,
    "invalidParameter": ErrorKind.INVALID_REQUEST,
    "badRequest": ErrorKind.INVALID_REQUEST,
    "required": ErrorKind.INVALID_REQUEST,
    "INVALID_FIELD_VALUE": ErrorKind.INVALID_REQUEST,
    "notFound": ErrorKind.INVALID_REQUEST,  # on insert: machine type, accelerator, image, zone
    "authError": ErrorKind.CREDENTIALS,
    "unauthorized": ErrorKind.CREDENTIALS,
    "forbidden": ErrorKind.CREDENTIALS,
    "insufficientPermissions": ErrorKind.CREDENTIALS,
    "accessNotConfigured": ErrorKind.CREDENTIALS,  # the Compute Engine API is not enabled
    "IAM_PERMISSION_DENIED": ErrorKind.CREDENTIALS,
    "SERVICE_DISABLED": ErrorKind.CREDENTIALS,
    "accountDisabled": ErrorKind.CREDENTIALS,
    "alreadyExists": ErrorKind.FAILED,  # callers that expect it (firewall, insert) catch it
    "conflict": ErrorKind.FAILED,
    "resourceInUseByAnotherResource": ErrorKind.TRANSIENT,
}

# error.errors[].code of a failed Operation.
OPERATION_CODES: dict[str, ErrorKind] = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": ErrorKind.CAPACITY,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": ErrorKind.CAPACITY,
    "UNSUPPORTED_OPERATION": ErrorKind.CAPACITY,  # e.g. a Spot VM preempted while created
    "QUOTA_EXCEEDED": ErrorKind.QUOTA,
    "RESOURCE_OPERATION_RATE_EXCEEDED": ErrorKind.TRANSIENT,
    "RESOURCE_NOT_READY": ErrorKind.TRANSIENT,
    "INTERNAL_ERROR": ErrorKind.TRANSIENT,
    "INVALID_FIELD_VALUE": ErrorKind.INVALID_REQUEST,
    "RESOURCE_NOT_FOUND": ErrorKind.INVALID_REQUEST,  # image, network, machine type ...
    "REQUIRED_FIELD_MISSING": ErrorKind.INVALID_REQUEST,
    "IAM_PERMISSION_DENIED": ErrorKind.CREDENTIALS,
    "PERMISSIONS_ERROR": ErrorKind.CREDENTIALS,
    "RESOURCE_ALREADY_EXISTS": ErrorKind.FAILED,  # the insert caller adopts it
    "CONDITION_NOT_MET": ErrorKind.FAILED,
}

# When several errors come together, the most telling decides.
_PRECEDENCE = [
    ErrorKind.CREDENTIALS,
    ErrorKind.QUOTA,
    ErrorKind.CAPACITY,
    ErrorKind.INVALID_REQUEST,
    ErrorKind.FAILED,
    ErrorKind.UNAVAILABLE,
    ErrorKind.TRANSIENT,
]
GONE_REASONS = frozenset({"notFound", "RESOURCE_NOT_FOUND"})
EXISTS_REASONS = frozenset({"alreadyExists", "RESOURCE_ALREADY_EXISTS"})
# Project-wide quotas: no other region of this project can do better, so they block the provider.
GLOBAL_QUOTAS = frozenset({"GPUS_ALL_REGIONS", "CPUS_ALL_REGIONS", "FIREWALLS"})
_QUOTA_NAME = re.compile(r"Quota '([A-Z0-9_]+)'")  # "Quota 'GPUS_ALL_REGIONS' exceeded."


class GceApiError(ProviderError):
    """A classified Compute Engine error that keeps its reasons, so a caller can treat
    `notFound` on delete as success or `alreadyExists` on insert as adoption."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        reasons: frozenset[str] = frozenset(),
        status: int | None = None,
        retry_after: float | None = None,
        block_scope: BlockScope | None = None,
    ) -> None:
        super().__init__(kind, message, retry_after=retry_after, block_scope=block_scope)
        self.reasons = reasons
        self.status = status

    def __reduce__(self) -> tuple[object, ...]:  # cross a process boundary as a ProviderError
        return (ProviderError, (self.kind, self.message, self.retry_after, self.block_scope))

    @property
    def gone(self) -> bool:
        return bool(self.reasons & GONE_REASONS) or (not self.reasons and self.status == 404)

    @property
    def exists(self) -> bool:
        return bool(self.reasons & EXISTS_REASONS) or (not self.reasons and self.status == 409)


def of_our_own(error: GceApiError) -> GceApiError:
    """`error` as the answer to a call made only of our own parameters: a delete or list of an
    instance or rule this adapter named, in a zone it planned. `invalid`, `notFound` and the
    like there say nothing about the job (its ask is only in an insert), so they are Failed:
    a teardown tries again and fails over rather than aborting, a wait tears down. A caller
    that treats `notFound` as gone checks `gone` first."""
    if error.kind is not ErrorKind.INVALID_REQUEST:
        return error
    return GceApiError(
        ErrorKind.FAILED,
        error.message,
        reasons=error.reasons,
        status=error.status,
        block_scope=error.block_scope,
    )


def words(text: object) -> str:
    """The cloud's words, whole, on one line (the core scrubs secrets out, then shortens)."""
    return " ".join(str(text).split())


def _strongest(kinds: list[ErrorKind]) -> ErrorKind | None:
    for kind in _PRECEDENCE:
        if kind in kinds:
            return kind
    return None


def _fallback(status: int, writes: bool) -> ErrorKind:
    """No known reason: the status decides, by what kind of call it was."""
    if status == 401:
        return ErrorKind.CREDENTIALS
    if status == 429 or status >= 500:
        return ErrorKind.TRANSIENT
    if status == 403:
        return ErrorKind.CREDENTIALS if not writes else ErrorKind.FAILED
    if status in (400, 404, 422):
        return ErrorKind.INVALID_REQUEST if not writes else ErrorKind.FAILED
    return ErrorKind.FAILED if writes else ErrorKind.TRANSIENT


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Retry-After as seconds (delta or HTTP date); None when absent or unreadable."""
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(raw) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if seconds != seconds or seconds < 0:  # NaN or in the past
        return 0.0 if seconds == seconds else None
    return min(seconds, 300.0)


def _quota_names(entries: list[Mapping[str, Any]]) -> set[str]:
    """Quota metric names an error names: errorDetails[].quotaInfo (metricName, limitName)
    where the cloud sends them, else the quota named in the message ("Quota 'X' exceeded")."""
    names: set[str] = set()
    for entry in entries:
        for detail in _list(entry.get("errorDetails")):
            info = detail.get("quotaInfo") if isinstance(detail, Mapping) else None
            if isinstance(info, Mapping):
                for field in ("metricName", "limitName"):
                    value = info.get(field)
                    if isinstance(value, str):
                        # compute.googleapis.com/gpus_all_regions, GPUS-ALL-REGIONS-per-project
                        tail = value.rsplit("/", 1)[-1].upper().replace("-", "_")
                        names.add(tail.removesuffix("_PER_PROJECT"))
        message = entry.get("message")
        if isinstance(message, str):
            names.update(_QUOTA_NAME.findall(message))
    return names


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _scope(kind: ErrorKind, entries: list[Mapping[str, Any]]) -> BlockScope | None:
    if kind is ErrorKind.QUOTA and GLOBAL_QUOTAS & _quota_names(entries):
        return BlockScope.PROVIDER
    return None


def http_error(
    status: int, body: object, headers: Mapping[str, str], action: str, writes: bool
) -> GceApiError:
    """Classify an HTTP error response of `action` (e.g. "insert gpuprov-x in us-central1-a")."""
    error = body.get("error") if isinstance(body, Mapping) else None
    error = error if isinstance(error, Mapping) else {}
    entries = [e for e in _list(error.get("errors")) if isinstance(e, Mapping)]
    reasons = frozenset(str(e["reason"]) for e in entries if isinstance(e.get("reason"), str))
    for detail in _list(error.get("details")):  # google.rpc.ErrorInfo reasons
        if isinstance(detail, Mapping) and isinstance(detail.get("reason"), str):
            reasons |= {detail["reason"]}
    known = [HTTP_REASONS[r] for r in reasons if r in HTTP_REASONS]
    kind = _strongest(known) or _fallback(status, writes)
    if status == 429:  # whatever the reason says, 429 is throttling
        kind = ErrorKind.TRANSIENT
    message = error.get("message") if isinstance(error.get("message"), str) else ""
    listed = ",".join(sorted(reasons)) or str(error.get("status") or "no reason")
    text = words(f"{action}: HTTP {status} {listed}: {message or 'no message'}")
    return GceApiError(
        kind,
        text,
        reasons=reasons,
        status=status,
        retry_after=retry_after_seconds(headers) if kind is ErrorKind.TRANSIENT else None,
        block_scope=_scope(kind, [*entries, {"message": message}]),
    )


def operation_error(error: object, http_status: object, action: str) -> GceApiError | None:
    """The classified `error` of a DONE operation (None: it succeeded)."""
    if error is None:
        return None
    if not isinstance(error, Mapping):  # unreadable, but it says "error": assume the worst
        error = {"errors": [{"code": "?", "message": words(error)}]}
    entries = [e for e in _list(error.get("errors")) if isinstance(e, Mapping)]
    codes = frozenset(str(e["code"]) for e in entries if isinstance(e.get("code"), str))
    known = [OPERATION_CODES[c] for c in codes if c in OPERATION_CODES]
    kind = _strongest(known) or ErrorKind.FAILED  # something may exist: tear it down
    messages = (
        "; ".join(f"{e.get('code', '?')}: {e.get('message', '')}" for e in entries[:3])
        or "operation failed without details"
    )
    prefix = f"{action}: operation failed"
    if isinstance(http_status, int):
        prefix += f" (HTTP {http_status})"
    return GceApiError(
        kind,
        words(f"{prefix}: {messages}"),
        reasons=codes,
        block_scope=_scope(kind, entries),
    )


def malformed(action: str, detail: object) -> ProviderError:
    """A response we cannot read: retry (create is safe: requestId, then observe-and-adopt)."""
    return ProviderError(ErrorKind.TRANSIENT, words(f"{action}: unreadable response: {detail}"))

"""Lambda Cloud's error codes -> ErrorKind: one table, keyed by the error's `code`.

Lambda answers `{"error": {"code", "message", "suggestion"?}}` and asks clients to branch on
`code` only (messages change). The HTTP status is used only when the body carries no code we
know. `global/object-does-not-exist` means different things per call: on launch a missing key,
image or filesystem (InvalidRequest); on get/terminate/delete-key the object is gone, which a
delete counts as success (`Gone`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

from providers.errors import ErrorKind, ProviderError

MAX_RETRY_AFTER = 3600.0  # seconds; a larger or nonsensical Retry-After is ignored


class Op(StrEnum):
    """The calls the adapter makes, as far as classification cares."""

    INSTANCE_TYPES = "GET /instance-types"
    LAUNCH = "POST /instance-operations/launch"
    LIST_INSTANCES = "GET /instances"
    GET_INSTANCE = "GET /instances/{id}"
    TERMINATE = "POST /instance-operations/terminate"
    LIST_KEYS = "GET /ssh-keys"
    ADD_KEY = "POST /ssh-keys"
    DELETE_KEY = "DELETE /ssh-keys/{id}"
    IMAGES = "GET /images"
    LIST_RULESETS = "GET /firewall-rulesets"
    ADD_RULESET = "POST /firewall-rulesets"
    DELETE_RULESET = "DELETE /firewall-rulesets/{id}"


# Every documented code (vendor OpenAPI 1.10.0, ApiError* schemas; reference/clouds.md §1).
CODE_KINDS: dict[str, ErrorKind] = {
    "instance-operations/launch/insufficient-capacity": ErrorKind.CAPACITY,
    "global/quota-exceeded": ErrorKind.QUOTA,
    "global/invalid-parameters": ErrorKind.INVALID_REQUEST,
    "instance-operations/launch/file-system-in-wrong-region": ErrorKind.INVALID_REQUEST,
    "global/object-does-not-exist": ErrorKind.INVALID_REQUEST,  # on launch; see GONE_CODES
    "global/not-found": ErrorKind.FAILED,  # an endpoint that is not there (wrong base_url)
    "global/invalid-api-key": ErrorKind.CREDENTIALS,
    "global/forbidden": ErrorKind.CREDENTIALS,
    "global/account-inactive": ErrorKind.CREDENTIALS,
    "global/invalid-address": ErrorKind.CREDENTIALS,
    "global/conflict": ErrorKind.FAILED,
    "global/duplicate": ErrorKind.FAILED,
    "filesystems/filesystem-in-use": ErrorKind.FAILED,
    "firewall-rulesets/firewall-ruleset-in-use": ErrorKind.FAILED,
    "global/internal-error": ErrorKind.TRANSIENT,
}
# Per call: what differs from CODE_KINDS. Only a launch and a key upload carry the user's ask;
# on every other call the parameters are this adapter's own (instance ids, none at all), so a
# refusal of them is Failed: a teardown (terminate, the instance list it watches) then gets its
# retry rounds and, failing those, a possible orphan for the reconciler, and a plan blocks the
# provider, instead of InvalidRequest aborting the job or stopping its teardown.
OUR_PARAMETERS = {"global/invalid-parameters": ErrorKind.FAILED}
OP_CODE_KINDS: dict[Op, dict[str, ErrorKind]] = {
    op: OUR_PARAMETERS for op in Op if op not in (Op.LAUNCH, Op.ADD_KEY)
}
# Cleanup deletes the VM's ruleset once its instance is gone; Lambda may still count it as in
# use for a moment while the instance terminates: try again.
OP_CODE_KINDS[Op.DELETE_RULESET] = {
    **OUR_PARAMETERS,
    "firewall-rulesets/firewall-ruleset-in-use": ErrorKind.TRANSIENT,
}
# Codes from upstream providers: outages, unavailability (Lambda's own example is
# `provider/internal-unavailable`, "Try again shortly").
PREFIX_KINDS: dict[str, ErrorKind] = {"provider/": ErrorKind.TRANSIENT}
# On these calls a not-found code means the object is already gone.
GONE_CODES = frozenset({"global/object-does-not-exist", "global/not-found"})
GONE_OPS = frozenset({Op.GET_INSTANCE, Op.TERMINATE, Op.DELETE_KEY, Op.DELETE_RULESET})


class Gone(ProviderError):
    """The instance or key no longer exists. Deletes treat it as success; anyone else who lets
    it escape reports Failed."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.FAILED, message)


def kind_for(op: Op, status: int, code: str | None) -> ErrorKind:
    """The ErrorKind of a failed call: by code first, then (unknown code) by HTTP status."""
    if code is not None:
        if code in (table := {**CODE_KINDS, **OP_CODE_KINDS.get(op, {})}):
            return table[code]
        for prefix, kind in PREFIX_KINDS.items():
            if code.startswith(prefix):
                return kind
    if status == 429 or status >= 500:
        return ErrorKind.TRANSIENT
    if status in (401, 403):
        return ErrorKind.CREDENTIALS
    # Anything else unknown: after a launch something may exist (the core tears it down), and
    # elsewhere retrying an unexplained refusal would not help.
    return ErrorKind.FAILED


def classify(
    op: Op,
    status: int,
    code: str | None,
    message: str | None,
    suggestion: str | None = None,
    retry_after: float | None = None,
) -> ProviderError:
    """The ProviderError (or Gone) for an error answer, carrying Lambda's own words."""
    words = _words(op, status, code, message, suggestion)
    if op in GONE_OPS and code in GONE_CODES:
        return Gone(words)
    kind = kind_for(op, status, code)
    return ProviderError(
        kind, words, retry_after=retry_after if kind is ErrorKind.TRANSIENT else None
    )


def malformed(op: Op, detail: str) -> ProviderError:
    """A success answer we cannot read. After a launch an instance may exist: Failed (the core
    tears down by identity); a read is retried (a truncated body, a proxy's page)."""
    kind = ErrorKind.FAILED if op is Op.LAUNCH else ErrorKind.TRANSIENT
    return ProviderError(kind, f"Lambda {op.value}: unreadable answer: {_one_line(detail)}")


def transport_failure(op: Op, error: Exception) -> ProviderError:
    """No answer at all (timeout, reset, DNS). Transient even on launch: the core's retried
    create observes by identity first and adopts an instance that did land."""
    return ProviderError(
        ErrorKind.TRANSIENT, f"Lambda {op.value}: {type(error).__name__}: {_one_line(str(error))}"
    )


def retry_after_seconds(header: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date); None when absent or absurd."""
    if header is None:
        return None
    text = header.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
        seconds = max(seconds, 0.0)
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_RETRY_AFTER:
        return None
    return seconds


def _words(
    op: Op, status: int, code: str | None, message: str | None, suggestion: str | None
) -> str:
    parts = [f"Lambda {op.value} -> HTTP {status}"]
    if code:
        parts.append(_one_line(code))
    if message:
        parts.append(_one_line(message))
    text = ": ".join(parts)
    if suggestion:
        text += f" ({_one_line(suggestion)})"
    return text


def _one_line(text: str) -> str:
    """The cloud's words whole, on one line: the core scrubs secrets out, then shortens."""
    return " ".join(text.split())

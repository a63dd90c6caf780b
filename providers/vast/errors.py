"""Vast.ai error classification: the cloud's error code -> ErrorKind, one table.

Vast answers errors as `{"success": false, "error": "<code>", "msg": "<text>"}`; some endpoints
omit `success` or `error` and send only `msg` or `message`, and a 429 is often plain text
(docs.vast.ai/api-reference/rate-limits-and-errors). The message may carry a more specific code
than `error` does: a vanished listing is `error: invalid_args` with
`msg: "error 404/3603: no_such_ask ..."` (create_instance.yaml). So the codes are read from both,
the message's first, and the first one in the table decides. Only when no code is known does the
HTTP status decide: a status a call documents a meaning for (the search's 404 is an invalid or
missing key), else its class (429 and 5xx retry, 401/403 are credentials); anything else is
Failed.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from providers.errors import BlockScope, ErrorKind, ProviderError

MAX_RETRY_AFTER = 300.0


class Op(StrEnum):
    """The API calls the adapter makes; some codes mean different things per call."""

    SEARCH = "search offers"  # POST /api/v0/bundles/
    CREATE = "create instance"  # PUT /api/v0/asks/{id}/
    LIST = "show instances"  # GET /api/v1/instances/
    DESTROY = "destroy instance"  # DELETE /api/v0/instances/{id}/


# Every code Vast documents for the calls we make (OpenAPI yaml files, rate-limits page).
CODES: dict[str, ErrorKind] = {
    # The listing was taken or withdrawn (404 error 3603, 410 error 3907): a stockout.
    "no_such_ask": ErrorKind.CAPACITY,
    # The request itself is wrong (400 invalid_args / invalid_price / no_ssh_key_for_vm,
    # 403 "Offer ... is not your own. Hosts can only rent their own machines.").
    "invalid_args": ErrorKind.INVALID_REQUEST,
    "invalid_price": ErrorKind.INVALID_REQUEST,
    "no_ssh_key_for_vm": ErrorKind.INVALID_REQUEST,
    "invalid_request": ErrorKind.INVALID_REQUEST,
    # 401 "Invalid user key".
    "auth_error": ErrorKind.CREDENTIALS,
    # 429 as JSON (destroy_instance.yaml).
    "rate_limit_exceeded": ErrorKind.TRANSIENT,
    # The account's credit (transfer_credit.yaml): account-wide, so the whole provider.
    "insufficient_balance": ErrorKind.QUOTA,
    # 400 from the instance list: a pagination cursor that no longer holds (it came from Vast
    # itself a moment ago), so list again.
    "invalid_token": ErrorKind.TRANSIENT,
}
# Per call: what differs from CODES. Only a create's refused arguments are the user's ask; on
# the other calls they are this adapter's own filter or id, so Failed (plan: the provider is
# blocked; teardown: retried, then a possible orphan) rather than aborting the job.
_OURS = ("invalid_args", "invalid_request", "invalid_price", "no_ssh_key_for_vm")
OP_CODES: dict[Op, dict[str, ErrorKind]] = {
    op: dict.fromkeys(_OURS, ErrorKind.FAILED) for op in (Op.SEARCH, Op.LIST, Op.DESTROY)
}
# Per call: statuses that mean something of their own when no known code came with them.
# search_offers.yaml documents its 404 as "Unauthorized - invalid or missing API key".
OP_STATUSES: dict[Op, dict[int, ErrorKind]] = {Op.SEARCH: {404: ErrorKind.CREDENTIALS}}
# Codes with a wider block than the policy's default for their kind.
BLOCK_SCOPES: dict[str, BlockScope] = {"insufficient_balance": BlockScope.PROVIDER}
# Destroying an instance that is already gone is success (destroy_instance.yaml 404 not_found;
# no_such_instance from the instance endpoints).
GONE_CODES: frozenset[str] = frozenset({"not_found", "no_such_instance"})

# "error 404/3603: no_such_ask Instance type by id 1234567 is not available."
_MESSAGE_CODE = re.compile(r"^\s*error\s+\d+/\d+:\s*([a-z][a-z0-9_]*)\b")


def error_codes(payload: Mapping[str, Any] | None) -> list[str]:
    """The codes in an error body, the message's embedded code first."""
    if payload is None:
        return []
    codes: list[str] = []
    if match := _MESSAGE_CODE.match(error_text(payload)):
        codes.append(match.group(1))
    code = payload.get("error")
    if isinstance(code, str) and code.strip():
        codes.append(code.strip())
    return codes


def error_text(payload: Mapping[str, Any]) -> str:
    for key in ("msg", "message", "detail"):
        value = payload.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def is_gone(payload: Mapping[str, Any] | None) -> bool:
    return any(code in GONE_CODES for code in error_codes(payload))


def classify(
    op: Op,
    status: int,
    payload: Mapping[str, Any] | None,
    text: str,
    headers: Mapping[str, str] | None = None,
) -> ProviderError:
    """The ProviderError for one failed call, with Vast's own words in the message."""
    codes = error_codes(payload)
    table = {**CODES, **OP_CODES.get(op, {})}
    code = next((c for c in codes if c in table), None)
    if code is not None:
        kind = table[code]
    else:
        kind = OP_STATUSES.get(op, {}).get(status) or _by_status(status)
    words = (error_text(payload) if payload is not None else "") or text.strip()
    label = code or (codes[0] if codes else None)
    message = f"{op.value}: HTTP {status}" + (f" {label}" if label else "")
    if words:
        message += f": {words}"
    return ProviderError(
        kind,
        message,
        retry_after=retry_after(headers) if kind is ErrorKind.TRANSIENT else None,
        block_scope=BLOCK_SCOPES.get(code or ""),
    )


def _by_status(status: int) -> ErrorKind:
    """Only for an error without any code we know."""
    if status == 429 or status >= 500:
        return ErrorKind.TRANSIENT
    if status in (401, 403):
        return ErrorKind.CREDENTIALS
    # Anything else, after a create in particular, may have made something: tear down, move on.
    return ErrorKind.FAILED


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date); Vast rarely sends one."""
    if not headers:
        return None
    raw = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if raw is None:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)

"""RunPod's errors -> ErrorKind: one table of documented detail phrases, then one of statuses.

REST v2 answers errors as RFC 9457 `application/problem+json`: `{title, status, detail,
errors?[]}`. It has no machine-readable error codes: its createPod documentation says a 400
covers both "the request breaks a rule" and "no capacity", told apart only by the human-readable
`detail`. So the table is two-level, and nothing else in the adapter looks at a message:

1. `CAPACITY_PHRASES`: the stockout texts RunPod is documented (and seen, runpodctl#189,
   runpod-python#297, dstack#1740) to send when a create cannot be placed. Matched
   case-insensitively as substrings of `detail`/`title`/`errors`, on create only.
2. `STATUS_KINDS`: the HTTP status, per operation ("create", "read", "delete").

| condition | create | read | delete |
| --- | --- | --- | --- |
| a capacity phrase (usually a 400) | Capacity | - | - |
| 400 without one | Unavailable | Failed | Failed |
| 401 | Credentials | Credentials | Credentials |
| 403 | Unavailable | Credentials | Credentials |
| 402 insufficient balance | Quota, block scope `provider` | same | same |
| 408, 429 (Retry-After honoured) | Transient | Transient | Transient |
| 5xx (Retry-After honoured) | Transient | Transient | Transient |
| 404 | InvalidRequest | Failed | success (gone; see cloud.py) |
| 409 (pod belongs to a cluster) | InvalidRequest | Failed | Failed |
| 422, any other 4xx | InvalidRequest | Failed | Failed |
| network error, timeout | Transient (the core observes and adopts) | Transient | Transient |
| 2xx whose body cannot be read | Failed | Transient | - |

createPod's own table of "which failures are worth retrying" decides the create rows that are
not stops (api-reference-v2 openapi.json, POST /v2/pods):
- 400, "The body matches the contract but was rejected — either it breaks a cross-field rule,
  or this GPU and data center combination could not be placed", is "Try your next candidate":
  Unavailable (nothing was created; the offer is blocked, the job fails over). A rule broken
  on every candidate fails every offer, and the job's failure lists each one's `detail`, as the
  document advises ("if *every* candidate returns `400`, read the last `detail` as a problem
  with the request").
- 403, "Your account cannot access the requested pool", is "Skip this candidate, keep going":
  Unavailable too. A key without any access answers 401, which stays Credentials.
- 5xx, "Transient upstream failure", is "Retry the same candidate with backoff": Transient,
  after a Retry-After when RunPod sends one. A pod the failed call did make is not duplicated:
  the core's retry of create observes by name first and adopts it.
"""

from __future__ import annotations

import json
from typing import Literal

from providers.errors import BlockScope, ErrorKind, ProviderError

Operation = Literal["create", "read", "delete"]

# Documented stockout texts (lower case). "...with the requested specifications. Please refresh
# and try again." and "...with enough disk space." share the first phrase; dstack has seen
# "...with the request specifications. Please try again later." as well.
CAPACITY_PHRASES: tuple[str, ...] = (
    "there are no longer any instances available",
    "not enough free gpus on the host machine",
)

# status -> kind per operation; statuses not listed fall back to `_fallback`. createPod's 400
# ("Try your next candidate") and 403 ("Skip this candidate, keep going") fail over.
STATUS_KINDS: dict[int, dict[Operation, ErrorKind]] = {
    400: {"create": ErrorKind.UNAVAILABLE, "read": ErrorKind.FAILED, "delete": ErrorKind.FAILED},
    401: dict.fromkeys(("create", "read", "delete"), ErrorKind.CREDENTIALS),
    403: {
        "create": ErrorKind.UNAVAILABLE,
        "read": ErrorKind.CREDENTIALS,
        "delete": ErrorKind.CREDENTIALS,
    },
    402: dict.fromkeys(("create", "read", "delete"), ErrorKind.QUOTA),
    408: dict.fromkeys(("create", "read", "delete"), ErrorKind.TRANSIENT),
    429: dict.fromkeys(("create", "read", "delete"), ErrorKind.TRANSIENT),
}
# A 402 means the account has no balance: no RunPod offer can succeed, other clouds still can.
BLOCK_SCOPES: dict[int, BlockScope] = {402: BlockScope.PROVIDER}

MAX_LISTED_ERRORS = 5


def _fallback(operation: Operation, status: int) -> ErrorKind:
    if status >= 500:
        return ErrorKind.TRANSIENT
    return ErrorKind.INVALID_REQUEST if operation == "create" else ErrorKind.FAILED


def problem_text(body: bytes) -> str:
    """The cloud's own words from an error body: `title: detail [errors]` of a problem+json
    document, else whatever text came back."""
    try:
        problem = json.loads(body)
    except (ValueError, RecursionError):
        problem = None
    if isinstance(problem, dict):
        parts = [str(problem[key]) for key in ("title", "detail") if problem.get(key)]
        errors = problem.get("errors")
        if isinstance(errors, list) and errors:
            listed = "; ".join(str(item) for item in errors[:MAX_LISTED_ERRORS])
            parts.append(f"[{listed}]")
        if parts:
            return ": ".join(parts)
    return body.decode("utf-8", errors="replace").strip() or "(empty body)"


def classify(
    operation: Operation,
    status: int,
    body: bytes,
    what: str,
    retry_after: float | None = None,
) -> ProviderError:
    """The ProviderError for a non-2xx answer to `what` (e.g. "POST /v2/pods")."""
    text = problem_text(body)
    message = f"RunPod {status} on {what}: {text}"
    if operation == "create" and is_capacity(text):
        return ProviderError(ErrorKind.CAPACITY, message)
    kind = STATUS_KINDS.get(status, {}).get(operation) or _fallback(operation, status)
    return ProviderError(
        kind,
        message,
        retry_after=retry_after if kind is ErrorKind.TRANSIENT else None,
        block_scope=BLOCK_SCOPES.get(status),
    )


def is_capacity(text: str) -> bool:
    folded = " ".join(text.lower().split())
    return any(phrase in folded for phrase in CAPACITY_PHRASES)


def network_error(what: str, error: Exception) -> ProviderError:
    """No answer at all (refused, reset, timed out): Transient on every operation. On create
    the core then observes before trying again, so a request that landed is adopted."""
    return ProviderError(ErrorKind.TRANSIENT, f"RunPod unreachable on {what}: {_describe(error)}")


def unreadable(operation: Operation, what: str, reason: str) -> ProviderError:
    """A 2xx whose body is not what the API documents. After create a pod may exist, so that
    is Failed (the core tears down by name); a read is simply tried again."""
    kind = ErrorKind.FAILED if operation == "create" else ErrorKind.TRANSIENT
    return ProviderError(kind, f"RunPod answered {what} with an unreadable body: {reason}")


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (RunPod sends integer seconds); None when absent or odd."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not 0 <= seconds <= 3600:  # NaN and absurd waits fail this test
        return None
    return seconds


def _describe(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__

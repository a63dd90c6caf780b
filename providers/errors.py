"""The error vocabulary of the cloud boundary.

Adapters classify every failure into one `ErrorKind` (a table of codes per cloud, never string
matching on messages) and raise `ProviderError`. What each kind *does* is decided in exactly one
place, `gpuprov/policy.py`.

A message carries the cloud's words whole: adapters neither cut nor scrub it. The core scrubs
every secret in play out of it (`redact`, in activities/redaction.py) and only then shortens it,
so a secret can never survive in part at a cut.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

REDACTED = "[redacted]"
# Shorter values are no credential a cloud issues, and replacing them would garble the words;
# any run this long that a secret contains counts as the secret (a prefix, any slice).
MIN_SECRET_CHARS = 8


class ErrorKind(StrEnum):
    """Why a provider call failed, in the terms the failover policy understands."""

    TRANSIENT = "Transient"  # throttling, 5xx, timeouts: retry the same step
    CAPACITY = "Capacity"  # stockout for this offer
    QUOTA = "Quota"  # account limit, usually region-wide
    UNAVAILABLE = "Unavailable"  # not viable here and nothing was created
    FAILED = "Failed"  # anything else after resources may exist
    INVALID_REQUEST = "InvalidRequest"  # the ask cannot be satisfied anywhere
    CREDENTIALS = "Credentials"  # authentication or authorisation failure


class BlockScope(StrEnum):
    """What a failure blocks for later attempts (this job's and, with an expiry, every job's).

    NONE fails over without blocking anything: the failure says nothing about the offer (a
    timeout on our side, the control plane down while nodes tried to register).
    """

    NONE = "none"
    OFFER = "offer"
    REGION = "region"
    PROVIDER = "provider"


class ProviderError(Exception):
    """A classified provider failure.

    `message` should carry the cloud's own words (code and text) so a user reading the job's
    failure sees what the cloud said. `retry_after` (seconds) honours a cloud's Retry-After.
    `block_scope` lets an adapter widen (or narrow, down to BlockScope.NONE) the block for this
    error; None leaves it to the policy.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        retry_after: float | None = None,
        block_scope: BlockScope | None = None,
    ) -> None:
        super().__init__(f"{kind.value}: {message}")
        self.kind = ErrorKind(kind)
        self.message = message
        self.retry_after = retry_after
        # Overrides the policy's block scope for this one error, e.g. a quota that names every
        # region of the account.
        self.block_scope = block_scope

    def __reduce__(self) -> tuple[object, ...]:
        return (ProviderError, (self.kind, self.message, self.retry_after, self.block_scope))


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every part of a secret in it replaced by [redacted].

    A part is any run of MIN_SECRET_CHARS or more characters found in a secret, not only the
    whole of it: a cloud that echoes the first 20 characters of a key (or any slice of it) has
    given most of it away. Every window of MIN_SECRET_CHARS characters that occurs in a secret
    is covered, and each run of covered characters becomes one [redacted].
    """
    size = MIN_SECRET_CHARS
    wanted = {secret for secret in secrets if len(secret) >= size}
    if not wanted or len(text) < size:
        return text
    windows = {secret[i : i + size] for secret in wanted for i in range(len(secret) - size + 1)}
    spans: list[list[int]] = []  # [start, end) of covered runs, in order
    for start in range(len(text) - size + 1):
        if text[start : start + size] not in windows:
            continue
        if spans and start <= spans[-1][1]:
            spans[-1][1] = start + size
        else:
            spans.append([start, start + size])
    if not spans:
        return text
    parts, last = [], 0
    for start, end in spans:
        parts += [text[last:start], REDACTED]
        last = end
    return "".join([*parts, text[last:]])


# Longest cloud message kept in a failure, a block or a status line.
MAX_MESSAGE_CHARS = 2000


def truncate(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message`, cut to `limit` characters with a marker saying so."""
    return message if len(message) <= limit else message[: limit - 15] + "...(truncated)"

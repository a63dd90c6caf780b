"""The agent's one error type, AgentError: a refusal (its HTTP status) or a failure that
retrying may fix (`transient`, with the Retry-After the API asked for).
"""

from __future__ import annotations


class AgentError(Exception):
    """Registration failed. `status`: the HTTP status of a refusal; `transient`: we gave up
    retrying something that might work later (API down, 5xx, 429); `retry_after`: the seconds
    the API asked us to wait before the next try (a 429's or 503's Retry-After)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        transient: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.retry_after = retry_after

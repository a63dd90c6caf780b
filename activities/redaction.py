"""The one path from what a cloud says to what a job, its history, its status, the logs and
`gpuprov offers` carry: every secret in play is scrubbed out first (the whole secret, and any
run of 8 or more of its characters: a prefix a vendor echoed, any slice), then a message is
shortened. Failures and successful answers alike: a vendor may put a key into an instance
type's description as readily as into a 401.

Every provider primitive an activity calls runs inside `scrubbed(provider, step, spec)`. A
ProviderError keeps its kind, retry delay and block scope, and its message loses:
- the provider's credentials (`CloudProvider.secrets()`: its section's SecretStr values, the key
  it resolved, tokens it derived);
- the node's join token and any private key in the spec's user data (a cloud may echo user
  data back in an error).
Only then does `to_application_error` cut it to its length, so no part of a secret survives at
the cut. What a primitive returns (plan's offers, observe's instances, diagnose's findings, a
health report) passes `clean(value, secrets)` before it leaves the activity: every string in
it, however deep, scrubbed the same way.

Any other exception (an adapter's bug, a library's error) becomes an ApplicationError of its
class name, scrubbed and shortened the same way and retryable as before, instead of
reaching history with its own text. Neither keeps the original exception as its cause: Temporal
would record the cause's unscrubbed text too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio.exceptions import ApplicationError, FailureError

from activities.errors import to_application_error
from providers.base import CloudProvider, InstanceSpec
from providers.errors import ProviderError, redact, truncate

# A PEM private key's body, its lines split by newlines or, inside JSON, by escaped ones.
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(.*?)-----END", re.DOTALL)
_PEM_LINE = re.compile(r"[A-Za-z0-9+/=]{16,}")

Value = TypeVar("Value")


def secrets_in_play(provider: CloudProvider, spec: InstanceSpec | None = None) -> list[str]:
    """What no message about a call to `provider` (for `spec`) may contain."""
    found = list(provider.secrets())
    if spec is not None:
        if spec.bootstrap is not None:
            found.append(spec.bootstrap.join_token)
        for body in _PRIVATE_KEY.findall(spec.user_data or ""):
            found.extend(_PEM_LINE.findall(body.replace("\\n", "\n")))
    return found


@contextmanager
def scrubbed(
    provider: CloudProvider, step: str | None = None, spec: InstanceSpec | None = None
) -> Iterator[None]:
    """Around a provider call inside an activity: every failure leaves as an ApplicationError
    whose message holds no secret in play (`step` names the primitive where an activity runs
    several)."""
    try:
        yield
    except FailureError:
        raise  # already an activity failure of ours (e.g. a provider this worker lacks)
    except ProviderError as error:
        clean = ProviderError(
            error.kind,
            redact(error.message, secrets_in_play(provider, spec)),
            retry_after=error.retry_after,
            block_scope=error.block_scope,
        )
        raise to_application_error(clean, step) from None
    except Exception as error:
        text = redact(str(error), secrets_in_play(provider, spec))
        failure = ApplicationError(truncate(text), type=type(error).__name__)
        # Its frames stay for whoever debugs it: code lines only, never a value.
        raise failure.with_traceback(error.__traceback__) from None


def clean(value: Value, secrets: Iterable[str]) -> Value:
    """`value` (a model, a list or dict of them, a string) with every string in it, keys and
    nested models included, scrubbed of `secrets`; a model is validated again as its type."""
    wanted = list(secrets)
    return _clean(value, wanted) if wanted else value


def _clean(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, BaseModel):
        fields = {name: getattr(value, name) for name in type(value).model_fields}
        return type(value).model_validate(_clean(fields, secrets))
    if isinstance(value, dict):
        return {_clean(key, secrets): _clean(item, secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clean(item, secrets) for item in value)
    return value

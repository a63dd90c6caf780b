"""What every `[providers.<id>]` section shares, and how an adapter finds its credentials.

Each cloud's own section model lives beside its adapter (`providers/<id>/config.py`) and
derives from `ProviderSettings`; the registry (providers/__init__.py) names it, and
gpuprov/config.py derives `[providers]` from the registry. Credentials come from the setting
itself, a file it names, or the cloud's conventional environment variable, in that order; a
cloud without any is skipped (`MissingCredentials`), never half-built.

Every section also declares the cloud's timing hints (`TimingHints`: boot_timeout,
delete_timeout, poll_interval, each with that cloud's own default); `capabilities_from` hands
them to the core in an adapter's `capabilities()`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, SecretStr

from providers.base import Billing, Capabilities, Model


class MissingCredentials(Exception):
    """A configured cloud has no usable credentials; the message says how to supply them."""


class ProviderSettings(Model):
    """Fields every provider section has."""

    enabled: bool = True
    # Start the node agent over SSH once a machine runs (activities/bootstrap.py), then place
    # the job only after the node registered and reported compatible capabilities. Needs an
    # image with python3 and sshd, and the deployment's SSH key on the node.
    ssh_bootstrap: bool = False

    def secret_values(self) -> list[str]:
        """Every `SecretStr` value of this section, nested models, lists and tables included:
        what an adapter's `secrets()` hands the core to scrub out of messages."""
        return [value for value in _secrets_in(self) if value]


def agent_only_over_ssh(ssh_bootstrap: bool, why: str) -> bool:
    """For a cloud whose machines take no user data the core can use: the node agent reaches
    them only over SSH, so `ssh_bootstrap` stays on (off, no node could ever register)."""
    if not ssh_bootstrap:
        raise ValueError(
            f"ssh_bootstrap cannot be false here: {why}, so the node agent reaches them only "
            "over SSH, and a job is ready only once every node's agent has registered"
        )
    return ssh_bootstrap


def _secrets_in(value: object) -> Iterator[str]:
    if isinstance(value, SecretStr):
        yield value.get_secret_value().strip()
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _secrets_in(getattr(value, name))
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _secrets_in(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _secrets_in(item)


class ApiKeySettings(ProviderSettings):
    """A cloud reached with one API key: `api_key`, or `api_key_file`, or the environment."""

    api_key: SecretStr | None = None
    api_key_file: str | None = None

    def resolve_api_key(self, env_var: str, environ: Mapping[str, str] | None = None) -> str:
        """The key, or MissingCredentials naming the three places it may come from."""
        key = resolve_secret(self.api_key, self.api_key_file, env_var, environ)
        if key is None:
            raise MissingCredentials(f"no API key: set {env_var}, or api_key_file or api_key")
        return key


class TimingHints(Protocol):
    """The timing hints every provider section declares, in seconds, with its own defaults."""

    boot_timeout: float  # until Running
    delete_timeout: float  # until gone
    poll_interval: float  # between observe calls


def capabilities_from(
    config: TimingHints,
    *,
    unsupported: Iterable[str] = (),
    node_agent: bool = False,
    cloud_init: bool = False,
    billing: Billing | None = None,
) -> Capabilities:
    """An adapter's Capabilities: what it cannot do, and its section's timing hints (the core's
    wait bounds)."""
    return Capabilities(
        unsupported=list(unsupported),
        node_agent=node_agent,
        cloud_init=cloud_init,
        boot_timeout=config.boot_timeout,
        delete_timeout=config.delete_timeout,
        poll_interval=config.poll_interval,
        billing=billing or Billing(),
    )


def resolve_secret(
    value: SecretStr | None,
    file: str | None,
    env_var: str | None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The first non-empty of: the setting, the file it names, the environment variable."""
    if value is not None and value.get_secret_value().strip():
        return value.get_secret_value().strip()
    if file:
        try:
            text = Path(file).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise MissingCredentials(f"cannot read credentials file {file}: {error}") from None
        if not text:
            raise MissingCredentials(f"credentials file {file} is empty")
        return text
    environ = os.environ if environ is None else environ
    if env_var and (found := environ.get(env_var, "").strip()):
        return found
    return None

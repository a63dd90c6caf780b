"""The cloud registry: `PROVIDER_IDS` and `build(settings)`, one line per cloud.

Adapters are imported only when built, so naming a cloud in a job spec costs nothing and a
workflow module can import this file without pulling in HTTP clients. A configured cloud whose
credentials are missing is skipped, and `build` says so (`Built.skipped`), so `gpuprov offers`
and the worker's start-up line can tell an operator why a cloud offers nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from providers.settings import MissingCredentials

if TYPE_CHECKING:
    from gpuprov.config import ProvidersSettings
    from providers.base import CloudProvider

# provider id -> "module:factory"; the factory takes that provider's config section and raises
# MissingCredentials when it has none.
_FACTORIES: dict[str, str] = {
    "fake": "providers.fake:FakeCloud",
    "lambda": "providers.lambda.cloud:LambdaCloud",
    "runpod": "providers.runpod.cloud:RunPodCloud",
    "vast": "providers.vast.cloud:VastCloud",
    "prime": "providers.prime.cloud:PrimeCloud",
    "aws": "providers.aws.cloud:AwsCloud",
    "gce": "providers.gce.cloud:GceCloud",
    "ssh": "providers.ssh.cloud:SshMachines",
}
PROVIDER_IDS: tuple[str, ...] = tuple(_FACTORIES)


@dataclass
class Built:
    """The providers built from the settings, and why each configured one was skipped."""

    providers: dict[str, CloudProvider] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def build_all(settings: ProvidersSettings) -> Built:
    """Instantiate every provider whose config section is present and enabled; one without
    credentials is recorded in `skipped` with the reason instead."""
    built = Built()
    for provider_id, target in _FACTORIES.items():
        section = settings.section(provider_id)
        if section is None or not section.enabled:
            continue
        module_name, factory_name = target.split(":")
        factory = getattr(importlib.import_module(module_name), factory_name)
        try:
            built.providers[provider_id] = factory(section)
        except MissingCredentials as missing:
            built.skipped[provider_id] = str(missing)
    return built


def build(settings: ProvidersSettings) -> dict[str, CloudProvider]:
    """The providers `build_all` could build."""
    return build_all(settings).providers

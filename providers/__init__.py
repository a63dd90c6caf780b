"""The cloud registry: `CLOUDS`, one line per cloud, and `build_all(sections)`.

Each line names where the cloud's adapter factory and its `[providers.<id>]` section model live
("module:name"), so adding a cloud is its folder plus one line here: gpuprov/config.py derives
the `[providers]` sections from `CLOUDS`, and nothing else lists the clouds.

This module imports no adapter and no section model (`config_models()` imports the models when
asked), so naming a cloud in a job spec costs nothing and a workflow module can import it
without pulling in HTTP clients. It imports nothing from gpuprov either: the settings come in
as any object with a `section(provider_id)` method. A configured cloud whose credentials are
missing is skipped, and `build_all` says so (`Built.skipped`), so `gpuprov offers` and the
worker's start-up line can tell an operator why a cloud offers nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from providers.base import CloudProvider
from providers.settings import MissingCredentials, ProviderSettings


@dataclass(frozen=True)
class Cloud:
    """Where one cloud lives, each as "module:name"."""

    adapter: str  # a factory taking the section; raises MissingCredentials without credentials
    config: str  # the section's model, a ProviderSettings


CLOUDS: dict[str, Cloud] = {
    "fake": Cloud("providers.fake.cloud:FakeCloud", "providers.fake.config:FakeProviderConfig"),
    "lambda": Cloud(
        "providers.lambdalabs.cloud:LambdaCloud", "providers.lambdalabs.config:LambdaConfig"
    ),
    "runpod": Cloud("providers.runpod.cloud:RunPodCloud", "providers.runpod.config:RunPodConfig"),
    "vast": Cloud("providers.vast.cloud:VastCloud", "providers.vast.config:VastConfig"),
    "prime": Cloud("providers.prime.cloud:PrimeCloud", "providers.prime.config:PrimeConfig"),
    "aws": Cloud("providers.aws.cloud:AwsCloud", "providers.aws.config:AwsConfig"),
    "gce": Cloud("providers.gce.cloud:GceCloud", "providers.gce.config:GceConfig"),
    "ssh": Cloud("providers.ssh.cloud:SshMachines", "providers.ssh.config:SshConfig"),
}
PROVIDER_IDS: tuple[str, ...] = tuple(CLOUDS)


class Sections(Protocol):
    """The configured sections, by provider id (gpuprov.config.ProvidersSettings)."""

    def section(self, provider_id: str) -> ProviderSettings | None: ...


@dataclass
class Built:
    """The providers built from the settings, and why each configured one was skipped."""

    providers: dict[str, CloudProvider] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def config_models() -> dict[str, type[ProviderSettings]]:
    """Each cloud's section model, by provider id, in registry order."""
    return {provider_id: _load(cloud.config) for provider_id, cloud in CLOUDS.items()}


def build_all(settings: Sections) -> Built:
    """Instantiate every provider whose config section is present and enabled; one without
    credentials is recorded in `skipped` with the reason instead."""
    built = Built()
    for provider_id, cloud in CLOUDS.items():
        section = settings.section(provider_id)
        if section is None or not section.enabled:
            continue
        factory = _load(cloud.adapter)
        try:
            built.providers[provider_id] = factory(section)
        except MissingCredentials as missing:
            built.skipped[provider_id] = str(missing)
    return built


def _load(target: str) -> Any:
    # By name: an adapter loads only when it is built, so the registry itself stays cheap.
    module_name, name = target.split(":")
    return getattr(importlib.import_module(module_name), name)

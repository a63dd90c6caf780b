"""The cloud registry: `PROVIDER_IDS` and `build(settings)`, one line per cloud.

Adapters are imported only when built, so naming a cloud in a job spec costs nothing and a
workflow module can import this file without pulling in HTTP clients.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuprov.config import ProvidersSettings
    from providers.base import CloudProvider

# provider id -> "module:factory"; the factory takes that provider's config section.
_FACTORIES: dict[str, str] = {
    "fake": "providers.fake:FakeCloud",
}
PROVIDER_IDS: tuple[str, ...] = tuple(_FACTORIES)


def build(settings: ProvidersSettings) -> dict[str, CloudProvider]:
    """Instantiate every provider whose config section is present and enabled."""
    providers: dict[str, CloudProvider] = {}
    for provider_id, target in _FACTORIES.items():
        section = getattr(settings, provider_id, None)
        if section is None or not section.enabled:
            continue
        module_name, factory_name = target.split(":")
        factory = getattr(importlib.import_module(module_name), factory_name)
        providers[provider_id] = factory(section)
    return providers

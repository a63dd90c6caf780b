"""The typed search attributes every job carries (public names: keep them stable)."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

STATE = SearchAttributeKey.for_keyword("GpuprovState")
PROVIDER = SearchAttributeKey.for_keyword("GpuprovProvider")
REGION = SearchAttributeKey.for_keyword("GpuprovRegion")
GPU = SearchAttributeKey.for_keyword("GpuprovGpu")

ALL: tuple[SearchAttributeKey[str], ...] = (STATE, PROVIDER, REGION, GPU)


def dev_server_args() -> list[str]:
    """`temporal server start-dev` flags that register them."""
    args: list[str] = []
    for key in ALL:
        args += ["--search-attribute", f"{key.name}=Keyword"]
    return args

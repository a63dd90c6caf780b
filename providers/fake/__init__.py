"""The fake cloud: deterministic, in memory or in a SQLite file, with failure injection."""

from providers.fake.cloud import PROVIDER_ID, FakeCloud
from providers.fake.state import FakeCloudState

__all__ = ["PROVIDER_ID", "FakeCloud", "FakeCloudState"]

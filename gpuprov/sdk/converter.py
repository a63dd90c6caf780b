"""gpuprov's payload converter: temporalio's pydantic JSON converter with one shared cache of
pydantic TypeAdapters.

`temporalio.contrib.pydantic.PydanticPayloadConverter` caches a TypeAdapter per type hint, but
the cache lives in the converter instance, and the SDK builds a new payload converter for every
serialization context: every workflow activation and every activity. So each typed payload
decode built its TypeAdapter (a pydantic schema) again, about eight per job. Here every
instance composes the same converters, built once, and so shares one LRU cache. The wire
format is unchanged (`json/plain`, as pydantic_data_converter writes): histories recorded with
either read with the other.
"""

from __future__ import annotations

from functools import cache

from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, EncodingPayloadConverter


@cache
def _shared_converters() -> tuple[EncodingPayloadConverter, ...]:
    """The encoding converters of one PydanticPayloadConverter, made once per process. They
    hold no per-context state (the JSON one holds only the TypeAdapter cache, which is
    thread-safe), so every converter instance can use them."""
    return tuple(PydanticPayloadConverter().converters.values())


class SharedCachePydanticPayloadConverter(PydanticPayloadConverter):
    def __init__(self) -> None:
        CompositePayloadConverter.__init__(self, *_shared_converters())


PYDANTIC_DATA_CONVERTER = DataConverter(payload_converter_class=SharedCachePydanticPayloadConverter)

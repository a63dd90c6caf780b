"""Payload encryption: an AES-GCM PayloadCodec and the data converter every process shares.

With `[codec] active_key` set, every payload gpuprov hands to Temporal (workflow and activity
inputs and results, Updates, query answers, memos, summaries and failure messages) is stored
as `binary/encrypted`: the whole serialized Payload, encrypted under the active key with a
random 12-byte nonce, the key id in the metadata. Decoding picks the key the metadata names,
so an old key kept in `[codec] keys` still reads what it wrote (rotation), and a payload that
is not encrypted passes through unchanged (histories from before encryption still read).
Search attributes and workflow ids are never encrypted.

Workers, the API, the CLI and SDK clients must all use the same keys: build every Temporal
client's converter with `data_converter(settings.codec)`.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)

from gpuprov.config import CodecSettings
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


class PayloadDecryptionError(ValueError):
    """An encrypted payload that cannot be read: unknown key id, tampered or truncated."""


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM over the serialized Payload; `keys` maps key id -> 32-byte key.

    `active_key` encrypts new payloads; None makes a decode-only codec (encryption switched
    off while histories written with it must still read). The key id is also the associated
    data, so a payload cannot be relabelled to another key id.
    """

    def __init__(self, keys: Mapping[str, bytes], active_key: str | None) -> None:
        if not keys:
            raise ValueError("an encryption codec needs at least one key")
        for key_id, key in keys.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"key {key_id!r} is {len(key)} bytes, AES-256 needs {KEY_BYTES}")
        if active_key is not None and active_key not in keys:
            raise ValueError(f"active key {active_key!r} is not one of the keys")
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self.active_key = active_key

    def __repr__(self) -> str:  # never the keys themselves
        return f"EncryptionCodec(key_ids={sorted(self._ciphers)}, active_key={self.active_key!r})"

    @classmethod
    def from_settings(cls, settings: CodecSettings) -> EncryptionCodec:
        return cls(settings.key_bytes(), settings.active_key)

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._ciphers)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(payload) for payload in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(payload) for payload in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        if self.active_key is None:
            return payload
        nonce = os.urandom(NONCE_BYTES)
        key_id = self.active_key.encode()
        sealed = self._ciphers[self.active_key].encrypt(nonce, payload.SerializeToString(), key_id)
        return Payload(metadata={"encoding": ENCODING, KEY_ID: key_id}, data=nonce + sealed)

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        raw_id = payload.metadata.get(KEY_ID)
        if raw_id is None:
            raise PayloadDecryptionError(f"encrypted payload without the {KEY_ID} metadata")
        key_id = raw_id.decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            known = ", ".join(self.key_ids)
            raise PayloadDecryptionError(
                f"payload encrypted with key id {key_id!r}, which is not in [codec] keys "
                f"(configured: {known}); add that key to read it"
            )
        if len(payload.data) < NONCE_BYTES + TAG_BYTES:
            raise PayloadDecryptionError(f"encrypted payload (key id {key_id!r}) is truncated")
        nonce, sealed = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
        try:
            plain = cipher.decrypt(nonce, sealed, raw_id)
        except InvalidTag:
            raise PayloadDecryptionError(
                f"encrypted payload (key id {key_id!r}) failed authentication: "
                "tampered, truncated, or encrypted with another key under that id"
            ) from None
        try:
            return Payload.FromString(plain)
        except DecodeError:
            raise PayloadDecryptionError(
                f"encrypted payload (key id {key_id!r}) does not hold a Payload"
            ) from None


def codec_for(settings: CodecSettings | None) -> EncryptionCodec | None:
    """The codec `settings` describe; None when no key is configured."""
    if settings is None or not settings.keys:
        return None
    return EncryptionCodec.from_settings(settings)


def data_converter(settings: CodecSettings | None) -> DataConverter:
    """The converter for every Temporal client and worker of gpuprov.

    No keys: the pydantic JSON converter itself (gpuprov/sdk/converter.py). Keys: the same
    converter with the encryption codec, and failure messages and stack traces moved into the
    (encrypted) encoded attributes while new payloads are encrypted.
    """
    codec = codec_for(settings)
    if codec is None:
        return PYDANTIC_DATA_CONVERTER
    if codec.active_key is None:  # decode-only: nothing new is encrypted
        return dataclasses.replace(PYDANTIC_DATA_CONVERTER, payload_codec=codec)
    return dataclasses.replace(
        PYDANTIC_DATA_CONVERTER,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


def generate_key() -> str:
    """A new key in the form `[codec] keys` takes: base64 of 32 random bytes."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()

"""PEM files a setting names (TLS certificates, keys, CAs), read and checked before use, so a
wrong one fails at start-up with one line that names the setting: unreadable, not PEM, an
encrypted key, a key of another pair, a certificate out of its validity."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from gpuprov.config import ConfigError

_SPKI = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo


class SettingError(ConfigError):
    """A setting whose value cannot work; the message names the setting, never a secret."""


def read(setting: str, path: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as error:
        raise SettingError(f"{setting}: cannot read it: {error.strerror}") from None


def certificates(setting: str, pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise SettingError(
            f"{setting}: not a PEM certificate (-----BEGIN CERTIFICATE-----)"
        ) from None


def private_key(setting: str, pem: bytes) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # cryptography's word for "encrypted, and no password given"
        raise SettingError(
            f"{setting}: the key is encrypted; give an unencrypted PEM key"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise SettingError(f"{setting}: not a PEM private key") from None


def check_pair(cert_setting: str, cert_pem: bytes, key_setting: str, key_pem: bytes) -> None:
    """The certificate parses and is valid now; the key parses and is the certificate's own."""
    certificate = certificates(cert_setting, cert_pem)[0]
    key = private_key(key_setting, key_pem)
    if key.public_key().public_bytes(*_SPKI) != certificate.public_key().public_bytes(*_SPKI):
        raise SettingError(
            f"{key_setting}: not the private key of {cert_setting} (a key from another pair?)"
        )
    now = datetime.now(UTC)
    if certificate.not_valid_after_utc <= now:
        expired = certificate.not_valid_after_utc.isoformat(timespec="seconds")
        raise SettingError(f"{cert_setting}: expired at {expired}")
    if certificate.not_valid_before_utc > now:
        starts = certificate.not_valid_before_utc.isoformat(timespec="seconds")
        raise SettingError(f"{cert_setting}: not valid before {starts}")


def check_files(cert_setting: str, cert_path: str, key_setting: str, key_path: str) -> None:
    """check_pair on two files; names the setting of whichever is wrong."""
    check_pair(
        f"{cert_setting} ({cert_path})",
        read(f"{cert_setting} ({cert_path})", cert_path),
        f"{key_setting} ({key_path})",
        read(f"{key_setting} ({key_path})", key_path),
    )

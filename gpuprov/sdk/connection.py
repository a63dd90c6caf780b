"""One way to reach Temporal, for every gpuprov process: the worker, the CLI, the SDK
(`GpuprovClient.connect`), `gpuprov setup`, the API and the reconciler's Schedule.

`[temporal]` gives the address and namespace, and optionally
- mTLS (`[temporal.tls]`): a client certificate and key, the CA the server's certificate must
  chain to, the name to check it against (a self-hosted cluster, or Temporal Cloud's
  certificate authentication);
- an API key (`api_key` / `api_key_file`; Temporal Cloud), sent as `Authorization: Bearer`.

The material is checked before anything is dialled: each file readable, each PEM parsable, the
key the certificate's own, the certificate within its validity. The first call of
`Client.connect` then proves the handshake and the credentials. A failure a setting causes is a
`pem.SettingError` (a ConfigError: never worth retrying) whose one-line message names that
setting; a server that cannot be reached raises temporalio's own RuntimeError, which the worker
and `gpuprov setup` retry. No message ever holds a key.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import SecretStr
from temporalio.client import Client
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from gpuprov.config import CodecSettings, TemporalSettings, TemporalTlsSettings
from gpuprov.sdk import pem
from gpuprov.sdk.codec import data_converter

# The Rust core reports a failed connect to Python only as text ("Failed client connect: ..."),
# so this table is the one place that reads it: a marker of rustls/tonic's error, the setting
# that causes it, and what to tell the operator.
_HANDSHAKE_FAILURES: tuple[tuple[str, str, str], ...] = (
    ("UnknownIssuer", "server_ca", "the server's certificate is not signed by {ca}"),
    ("NotValidForName", "server_name", "the server's certificate is not valid for {name}"),
    ("InvalidCertificate(Expired", "server_ca", "the server's certificate has expired"),
    ("InvalidCertificate", "server_ca", "the server's certificate was refused ({detail})"),
    ("InvalidContentType", "enabled", "TLS is on, but {address} does not answer TLS"),
    ("H2NotNegotiated", "enabled", "{address} offers no HTTP/2 over TLS (ALPN h2): not gRPC?"),
    ("NoCertificatesPresented", "client_cert", "holds no certificate"),
    ("KeyMismatch", "client_key", "is not the private key of the client certificate"),
)
# The server took the connection but refused who we are (gRPC status, or a TLS alert).
_REFUSALS = ("Unauthenticated", "PermissionDenied", "AlertReceived", "CertificateRequired")
_SERVER_MESSAGE = re.compile(r'message: "([^"]*)"')
_INNER = re.compile(r"InvalidCertificate\((\w+)")
_API_KEY = re.compile(r"[\x21-\x7e]+")  # one header value: printable ASCII, no spaces


class TemporalSettingError(pem.SettingError):
    """A `[temporal]` setting that cannot work; the message names it, never its secret."""


async def connect_temporal(
    settings: TemporalSettings,
    *,
    codec: CodecSettings | None = None,
    runtime: Runtime | None = None,
) -> Client:
    """A client for the cluster `settings` names, over TLS / with an API key where configured.

    Pass the deployment's `codec` settings: with keys configured, payloads are encrypted
    (gpuprov/sdk/codec.py), and every worker and client of the namespace must use the same keys.
    A worker built on the client reports metrics through `runtime`.
    """
    options = connect_options(settings)
    try:
        return await Client.connect(
            settings.address,
            namespace=settings.namespace,
            data_converter=data_converter(codec),
            runtime=runtime,
            **options,
        )
    except RuntimeError as error:
        refused = refusal(settings, str(error))
        if refused is not None:
            raise refused from None
        raise


def connect_options(settings: TemporalSettings) -> dict[str, Any]:
    """Client.connect's `tls`, `api_key` and `rpc_metadata`, the material checked first."""
    api_key = _api_key(settings)
    options: dict[str, Any] = {"tls": _tls_config(settings.tls, with_api_key=api_key is not None)}
    if api_key is not None:
        options["api_key"] = api_key
        # Temporal Cloud routes API-key calls by this header (docs.temporal.io/cloud/api-keys).
        options["rpc_metadata"] = {"temporal-namespace": settings.namespace}
    return options


def refusal(settings: TemporalSettings, said: str) -> TemporalSettingError | None:
    """The setting to blame for a failed connect, or None when the server was unreachable."""
    tls = settings.tls
    for marker, setting, text in _HANDSHAKE_FAILURES:
        if marker in said:
            detail = _INNER.search(said)
            reason = text.format(
                ca="this CA"
                if _given(tls, "server_ca")
                else "a CA this system trusts (set temporal.tls.server_ca_file)",
                name=tls.server_name or settings.address.rsplit(":", 1)[0],
                address=settings.address,
                detail=detail.group(1) if detail else marker,
            )
            return TemporalSettingError(f"{_name(tls, setting)}: {reason}")
    if not any(marker in said for marker in _REFUSALS):
        return None
    found = _SERVER_MESSAGE.search(said)
    server_said = f": {found.group(1)[:200]}" if found and found.group(1) else ""
    if settings.api_key is not None or settings.api_key_file is not None:
        setting = "temporal.api_key_file" if settings.api_key_file else "temporal.api_key"
        return TemporalSettingError(f"{setting}: the server refused the API key{server_said}")
    if _given(tls, "client_cert"):
        return TemporalSettingError(
            f"{_name(tls, 'client_cert')}: the server refused the client certificate{server_said}"
        )
    return TemporalSettingError(
        f"temporal.tls: {settings.address} wants a client certificate or an API key "
        f"(temporal.tls.client_cert_file, temporal.api_key_file){server_said}"
    )


# ---------------------------------------------------------------- the material


def _tls_config(tls: TemporalTlsSettings, *, with_api_key: bool) -> TLSConfig | bool:
    if tls.enabled is False:
        return False
    if not tls.configured:
        return bool(tls.enabled) or with_api_key  # True: the system's CAs
    cert_pem = _pem(tls, "client_cert")
    key_pem = _pem(tls, "client_key")
    ca_pem = _pem(tls, "server_ca")
    if cert_pem is not None and key_pem is not None:
        pem.check_pair(_name(tls, "client_cert"), cert_pem, _name(tls, "client_key"), key_pem)
    if ca_pem is not None:
        pem.certificates(_name(tls, "server_ca"), ca_pem)
    return TLSConfig(
        server_root_ca_cert=ca_pem,
        domain=tls.server_name,
        client_cert=cert_pem,
        client_private_key=key_pem,
    )


def _given(tls: TemporalTlsSettings, name: str) -> bool:
    return getattr(tls, name) is not None or getattr(tls, f"{name}_file") is not None


def _name(tls: TemporalTlsSettings, name: str) -> str:
    """How the operator spelled the setting: the file's setting (and path) where a file is
    used, else the inline one."""
    path = getattr(tls, f"{name}_file", None)
    if path is not None:
        return f"temporal.tls.{name}_file ({path})"
    return f"temporal.tls.{name}"


def _pem(tls: TemporalTlsSettings, name: str) -> bytes | None:
    path = getattr(tls, f"{name}_file")
    if path is not None:
        return pem.read(_name(tls, name), path)
    inline = getattr(tls, name)
    if inline is None:
        return None
    text = inline.get_secret_value() if isinstance(inline, SecretStr) else inline
    return text.encode()


def _api_key(settings: TemporalSettings) -> str | None:
    if settings.api_key_file is not None:
        setting = f"temporal.api_key_file ({settings.api_key_file})"
        raw = pem.read(setting, settings.api_key_file)
        try:
            key = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise TemporalSettingError(f"{setting}: not an API key (not ASCII text)") from None
    elif settings.api_key is not None:
        setting, key = "temporal.api_key", settings.api_key.get_secret_value().strip()
    else:
        return None
    if not _API_KEY.fullmatch(key):
        # Never quoted: it is a secret, or whatever file was named by mistake.
        raise TemporalSettingError(
            f"{setting}: not an API key ({len(key)} characters; expected one line of "
            "printable characters without spaces)"
        )
    return key

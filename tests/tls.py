"""Real TLS for tests: a throwaway PKI made with `cryptography`, and nginx as the TLS terminator
in front of the suite's Temporal dev server (which speaks only plaintext gRPC).

`Pki(directory)` writes PEM files: a CA, a server certificate for `temporal.test`, `localhost`
and 127.0.0.1, a client certificate signed by the CA, and an "intruder": a client certificate
and key from a second CA that nobody trusts (plus that CA, to pin as the wrong server CA).

`running_nginx(directory, upstream, pki, api_key)` runs `nginx -g 'daemon off;'` with its own
configuration inside `directory`, with two TLS ports, both HTTP/2 (gRPC needs ALPN h2):
- `mtls_port`: requires a client certificate signed by the CA (`ssl_verify_client on`);
- `api_key_port`: server TLS only; requires `Authorization: Bearer <api_key>`, as Temporal
  Cloud's API-key endpoints do.
A refused caller gets gRPC status 16 UNAUTHENTICATED, the answer a Temporal frontend gives.
nginx must be installed (`make test` installs it where missing); the tests fail, never skip,
without it.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bench.front import NginxMissing, user_line
from bench.front import running_nginx as running_nginx_config
from gpuprov.cli.dev import free_port

SERVER_NAME = "temporal.test"
_DAY = datetime.timedelta(days=1)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def make_leaf(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    common_name: str,
    *,
    server: bool,
    valid_until: datetime.datetime | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - 2 * _DAY)
        .not_valid_after(valid_until or now + _DAY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server:
        names: list[x509.GeneralName] = [
            x509.DNSName(common_name),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


@dataclass
class Pki:
    """PEM files of a CA, a server and a client signed by it, and an untrusted intruder."""

    directory: Path

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        ca = make_ca("gpuprov test CA")
        other = make_ca("somebody else's CA")
        now = datetime.datetime.now(datetime.UTC)
        pairs = {
            "server": make_leaf(ca, SERVER_NAME, server=True),
            "client": make_leaf(ca, "gpuprov-worker", server=False),
            "intruder": make_leaf(other, "gpuprov-worker", server=False),
            "expired": make_leaf(ca, "gpuprov-worker", server=False, valid_until=now - _DAY),
        }
        self._write("ca.pem", _cert_pem(ca[1]))
        self._write("other-ca.pem", _cert_pem(other[1]))
        for name, (key, certificate) in pairs.items():
            self._write(f"{name}.pem", _cert_pem(certificate))
            self._write(f"{name}.key", _key_pem(key))

    def _write(self, name: str, data: bytes) -> None:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca(self) -> Path:
        return self.path("ca.pem")


_CONFIG = """\
daemon off;
{user}
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {dir}/tmp;
  proxy_temp_path {dir}/tmp;
  fastcgi_temp_path {dir}/tmp;
  uwsgi_temp_path {dir}/tmp;
  scgi_temp_path {dir}/tmp;
  # Long polls (a worker's task poll waits up to a minute) must not be cut.
  grpc_read_timeout 300s;
  grpc_send_timeout 300s;
  client_body_timeout 300s;
  server {{
    listen 127.0.0.1:{mtls_port} ssl http2;
    ssl_certificate {server_cert};
    ssl_certificate_key {server_key};
    ssl_client_certificate {ca};
    ssl_verify_client on;
    error_page 495 496 = @unauthenticated;
    location / {{ grpc_pass grpc://{upstream}; }}
    location @unauthenticated {{
      default_type application/grpc;
      add_header grpc-status 16 always;
      add_header grpc-message "client certificate refused" always;
      return 200;
    }}
  }}
  server {{
    listen 127.0.0.1:{api_key_port} ssl http2;
    ssl_certificate {server_cert};
    ssl_certificate_key {server_key};
    error_page 401 = @unauthenticated;
    location / {{
      if ($http_authorization != "Bearer {api_key}") {{ return 401; }}
      grpc_pass grpc://{upstream};
    }}
    location @unauthenticated {{
      default_type application/grpc;
      add_header grpc-status 16 always;
      add_header grpc-message "invalid API key" always;
      return 200;
    }}
  }}
}}
"""


@dataclass
class TlsFront:
    mtls_port: int
    api_key_port: int
    process: subprocess.Popen[bytes]

    @property
    def mtls_address(self) -> str:
        return f"127.0.0.1:{self.mtls_port}"

    @property
    def api_key_address(self) -> str:
        return f"127.0.0.1:{self.api_key_port}"


@contextlib.contextmanager
def running_nginx(directory: Path, upstream: str, pki: Pki, api_key: str) -> Iterator[TlsFront]:
    """nginx terminating TLS for `upstream` (host:port of a plaintext gRPC server)."""
    mtls_port, api_key_port = free_port(), free_port()
    config = _CONFIG.format(
        user=user_line(),
        dir=directory,
        mtls_port=mtls_port,
        api_key_port=api_key_port,
        server_cert=pki.path("server.pem"),
        server_key=pki.path("server.key"),
        ca=pki.ca,
        upstream=upstream,
        api_key=api_key,
    )
    with contextlib.ExitStack() as stack:
        try:
            nginx = running_nginx_config(directory, config, [mtls_port, api_key_port])
            process = stack.enter_context(nginx)
        except (NginxMissing, RuntimeError) as error:
            pytest.fail(str(error), pytrace=False)
        yield TlsFront(mtls_port, api_key_port, process)

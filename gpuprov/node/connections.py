"""`KeptConnections`: the agent's connections to the control plane, kept open between requests
(HTTP/1.1 keep-alive), one per thread, so a heartbeat every interval costs the API a request and
not a TCP and TLS handshake as well.

A connection the server closed while it sat idle (its keep-alive timeout, a restart, a load
balancer's idle cut) shows up only when the next request is written or its answer read; that
request is sent once more on a new connection, as browsers and HTTP libraries do. A failure on
a connection just opened is the caller's: nothing is retried here twice.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import urllib.parse
from dataclasses import dataclass

from .errors import AgentError

# a kept connection the server had already closed: the request never reached it
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class ProtocolError(OSError):
    """The server's answer was not HTTP the client could read (cut mid-answer, a bad line)."""


class KeptConnections:
    """One kept connection per thread and per API origin. `request` is thread-safe because no
    two threads share a connection; `close` ends the calling thread's."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._contexts: dict[str | None, ssl.SSLContext] = {}

    def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float,
        ca_file: str | None,
    ) -> Answer:
        """`method` `url` on this thread's kept connection to its origin (a new one if none is
        kept); https trusts only `ca_file`'s CAs when given, else the system's."""
        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        origin = (parts.scheme, parts.netloc, ca_file)
        kept: dict = self._local.__dict__.setdefault("connections", {})
        connection = kept.pop(origin, None)
        reused = connection is not None
        while True:
            if connection is None:
                connection = self._connect(parts, timeout, ca_file)
            try:
                answer = _exchange(connection, method, target, body, headers, timeout)
            except _STALE:
                connection.close()
                if not reused:
                    raise
                connection, reused = None, False  # closed while idle: once more, new
                continue
            except OSError:
                connection.close()
                raise
            except http.client.HTTPException as error:
                connection.close()
                raise ProtocolError(f"unreadable answer: {error!r}") from None
            if answer.keep:
                kept[origin] = connection
            else:
                connection.close()
            return answer.answer

    def close(self) -> None:
        for connection in self._local.__dict__.pop("connections", {}).values():
            connection.close()

    def _connect(
        self, parts: urllib.parse.SplitResult, timeout: float, ca_file: str | None
    ) -> http.client.HTTPConnection:
        host, port = parts.hostname or "", parts.port
        if parts.scheme != "https":
            return http.client.HTTPConnection(host, port, timeout=timeout)
        context = self._contexts.get(ca_file) or self._contexts.setdefault(
            ca_file, tls_context(ca_file)
        )
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Only `ca_file`'s CAs when given, else the system's; built once per file, not per call."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise AgentError(f"cannot use --ca-file {ca_file}: {error}") from None


@dataclass(frozen=True)
class _Exchanged:
    answer: Answer
    keep: bool


def _exchange(
    connection: http.client.HTTPConnection,
    method: str,
    target: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
) -> _Exchanged:
    connection.timeout = timeout
    if connection.sock is not None:
        connection.sock.settimeout(timeout)
    connection.request(method, target, body=body, headers=headers)
    response = connection.getresponse()
    content = response.read()
    return _Exchanged(Answer(response.status, response.headers, content), not response.will_close)

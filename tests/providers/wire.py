"""What an adapter put on the wire: captured requests as raw bytes (request line with the full
URL, every header, the body), so a "never sends the secret" test scans all of it, not only the
body it happened to parse."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from urllib.parse import unquote_to_bytes

import httpx


def raw(request: httpx.Request, *, omit_headers: tuple[str, ...] = (), body: bool = True) -> bytes:
    """The request as sent: method and full URL, every header as given (but `omit_headers`),
    then the body (unless `body` is False)."""
    omitted = {name.lower().encode() for name in omit_headers}
    lines = [f"{request.method} {request.url}".encode()]
    lines += [n + b": " + v for n, v in request.headers.raw if n.lower() not in omitted]
    return b"\r\n".join(lines) + b"\r\n\r\n" + (request.read() if body else b"")


def secret_forms(secret: str) -> list[bytes]:
    """The secret as it could appear in a request: as is, JSON-escaped, or base64-encoded at any
    of the three byte alignments inside a longer value (the characters that also carry a
    neighbour's bits are left off). Percent-encoding is undone on the request side (`carries`)."""
    text = secret.encode()
    forms = {text, json.dumps(secret)[1:-1].encode()}
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + text).rstrip(b"=")
        forms.add(encoded[(pad * 8 + 5) // 6 : -2])
    return sorted(forms)


def carries(
    request: httpx.Request, secret: str, *, omit_headers: tuple[str, ...] = (), body: bool = True
) -> bool:
    """Whether `secret` is anywhere in the request (leaving out `omit_headers`, and the body
    unless `body`)."""
    wire = raw(request, omit_headers=omit_headers, body=body)
    decoded = unquote_to_bytes(wire)  # a query string or form body may percent-encode it
    return any(form in wire or form in decoded for form in secret_forms(secret))


def assert_never_sent(secret: str, requests: Iterable[httpx.Request]) -> None:
    """No captured request carries `secret` anywhere; and there were requests to scan."""
    captured = list(requests)
    assert captured, "no request was captured: nothing was scanned"
    for request in captured:
        assert not carries(request, secret), f"{request.method} {request.url.path} sent it"

"""The agent's HTTP client for the control plane (http.client, on connections kept open
between calls: connections.py): JSON in and out, the worker credential as a Bearer token,
`--ca-file` pinning the API's CA over HTTPS, 4xx final, 5xx, 429 and connection errors retried
with backoff (never sooner than Retry-After); no secret, and no password in a URL, in any
message. `register` exchanges the join token for the credential.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from .connections import KeptConnections
from .errors import AgentError

log = logging.getLogger(__name__)

HTTP_TIMEOUT = 30.0
MAX_PAUSE = 30.0
MAX_RETRY_AFTER = 300.0  # seconds: the longest Retry-After honoured


def _server_message(body: bytes) -> str:
    """FastAPI's {"detail": ...}; for validation errors only loc and msg, never the "input"
    (which may echo the token back)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        detail = json.loads(text)["detail"]
    except (ValueError, KeyError, TypeError):
        return text[:500] or "(empty response)"
    if isinstance(detail, list):
        parts = []
        for problem in detail:
            if isinstance(problem, dict):
                where = ".".join(str(part) for part in problem.get("loc", []))
                parts.append(f"{where}: {problem.get('msg', '?')}")
        return "; ".join(parts)[:500] or "(invalid request)"
    return str(detail)[:500]


def _untrusted(error: OSError) -> ssl.SSLCertVerificationError | None:
    """The certificate failure, if that is what `error` is (or wraps)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return error
    reason = getattr(error, "reason", None)
    return reason if isinstance(reason, ssl.SSLCertVerificationError) else None


def retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (the API sends whole seconds), capped at MAX_RETRY_AFTER
    so a wrong header cannot park the agent; None when absent or not a number."""
    try:
        seconds = float((value or "").strip())
    except ValueError:
        return None
    return min(seconds, MAX_RETRY_AFTER) if seconds >= 0 else None


def _has_credentials(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.username is not None or parts.password is not None
    except ValueError:
        return "@" in url.partition("//")[2].partition("/")[0]


def _has_host(url: str) -> bool:
    """A host and, if any, a port that is a number: what a connection can be opened to."""
    try:
        parts = urllib.parse.urlsplit(url)
        return bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:
        return False


def masked_url(url: str) -> str:
    """`url` with anything before an @ in its authority (user, password) shown as ***."""
    scheme, slashes, rest = url.partition("//")
    authority, slash, tail = rest.partition("/")
    if not slashes or "@" not in authority:
        return url
    return f"{scheme}//***@{authority.rpartition('@')[2]}{slash}{tail}"


def call_api(
    api_url: str,
    path: str,
    body: dict | None = None,
    credential: str | None = None,
    ca_file: str | None = None,
    tries: int = 10,
    pause: float = 1.0,
    secret: str | None = None,
    what: str | None = None,
    timeout: float = HTTP_TIMEOUT,
    connections: KeptConnections | None = None,
) -> dict:
    """POST `body` (GET without one) to {api_url}{path}; the response JSON on 2xx. Messages
    call the request `what` (default: the path); `timeout` bounds each attempt. On
    `connections` the connection stays open for the next call; without, it is closed.

    A 4xx is final: AgentError with the server's message and `status`; so is a certificate
    that does not verify. 5xx, 429 and connection errors are retried with exponential backoff
    from `pause` (capped at 30 s), never sooner than the answer's Retry-After, for `tries`
    attempts in all. `secret` (and the credential) never appear in a message, nor does a
    password in the URL: a URL with credentials is refused before any call.
    """
    url = api_url.rstrip("/") + path
    if not url.startswith(("http://", "https://")):
        raise AgentError(f"bad API URL {masked_url(api_url)!r}: expected http(s)://host:port")
    if _has_credentials(url):
        raise AgentError(
            f"bad API URL {masked_url(api_url)!r}: credentials (user:password@) do not belong "
            "in it; the API takes none there"
        )
    if not _has_host(url):
        raise AgentError(f"bad API URL {masked_url(api_url)!r}: expected http(s)://host:port")
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    data = json.dumps(body).encode() if body is not None else None
    hidden = {value: name for value, name in ((secret, "<token>"), (credential, "<credential>"))}
    tries, problem, wait = max(tries, 1), "", None
    single_use = connections is None
    kept = KeptConnections() if connections is None else connections
    method = "POST" if data is not None else "GET"
    try:
        for attempt in range(1, tries + 1):
            try:
                answer = kept.request(method, url, data, headers, timeout, ca_file)
            except OSError as error:  # refused, reset, timed out, cut mid-answer, TLS
                untrusted = _untrusted(error)
                if untrusted is not None:
                    raise AgentError(
                        f"the API's certificate at {url} is not trusted "
                        f"({untrusted.verify_message}): pass --ca-file with the CA that signed it"
                    ) from None
                problem, wait = f"cannot reach {url}: {getattr(error, 'reason', error)}", None
            else:
                if 200 <= answer.status < 300:
                    try:
                        return json.loads(answer.body) if answer.body.strip() else {}  # 204
                    except ValueError as error:  # a 200 whose body is not JSON
                        raise AgentError(f"unreadable response from {url}: {error}") from None
                message = _hide(_server_message(answer.body), hidden)
                if answer.status < 500 and answer.status != 429:  # 429: too busy for us now
                    refusal = f"{what or path} refused ({answer.status}): {message}"
                    raise AgentError(refusal, answer.status) from None
                problem = f"HTTP {answer.status}: {message}"
                wait = retry_after(answer.headers.get("Retry-After"))
            if attempt < tries:
                delay = max(min(pause * 2 ** (attempt - 1), MAX_PAUSE), wait or 0.0)
                log.warning("attempt %d/%d: %s; retrying in %.1fs", attempt, tries, problem, delay)
                time.sleep(delay)
    finally:
        if single_use:
            kept.close()
    raise AgentError(
        f"{what or path} failed after {tries} attempts: {problem}", transient=True, retry_after=wait
    )


def _hide(text: str, secrets: dict) -> str:
    """`text` with each secret replaced by its placeholder ({secret: "<token>"})."""
    for secret, placeholder in secrets.items():
        if secret:
            text = text.replace(secret, placeholder)
    return text


def register(
    api_url: str,
    token: str,
    capabilities: dict,
    identity: dict | None = None,
    tries: int = 10,
    pause: float = 1.0,
    ca_file: str | None = None,
) -> dict:
    """POST {api_url}/v1/workers/register; the response JSON on 200, with the worker's
    `credential` (save it with save_credential; never print it).

    A 4xx (unknown, used or expired token; refused by the job; too large; bad body) is final:
    AgentError with the server's message and `status`. 5xx and connection errors are retried
    with exponential backoff from `pause` (capped at 30 s) for `tries` attempts in all.
    """
    body = {"token": token, "capabilities": capabilities}
    if identity is not None:
        body["identity"] = identity
    return call_api(
        api_url,
        "/v1/workers/register",
        body,
        ca_file=ca_file,
        tries=tries,
        pause=pause,
        secret=token,
        what="registration",
    )


def backoff(failures: int, cap: float) -> float:
    """Seconds before retry number `failures`: 1, 2, 4, ... up to `cap`, less a random part of
    up to half, so a fleet that lost the API at once does not come back at once."""
    return min(cap, 2.0 ** (failures - 1)) * random.uniform(0.5, 1.0)


def until_through(call: Callable, what: str) -> Any:
    """`call()`, retried with backoff for as long as the control plane is out of reach or
    failing (a transient AgentError: no connection, 5xx, 429); a refusal (4xx) is raised.
    Logged when failures start and every tenth time."""
    failures = 0
    while True:
        try:
            return call()
        except AgentError as error:
            if not error.transient:
                raise
            failures += 1
            if failures % 10 == 1:
                log.warning("%s failed (%d in a row): %s; retrying", what, failures, error)
            time.sleep(max(backoff(failures, MAX_PAUSE), error.retry_after or 0.0))

"""Access tokens for the Compute Engine and Cloud Billing APIs.

`GoogleTokens` wraps google-auth credentials (a service-account key file, or Application
Default Credentials) and refreshes them in a worker thread, never on the event loop: a refresh
is a blocking HTTPS call (or a metadata-server call on a GCE host). The refresh goes through
`HttpxRequest`, a google-auth transport on httpx, so no extra HTTP library is needed. Tests
inject `StaticToken` and never touch real credentials, files or the environment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from providers.settings import MissingCredentials

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
_HOW = (
    "set credentials_file to a service-account JSON key, or provide Application Default "
    "Credentials (GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`, "
    "or a GCE host's service account)"
)


class TokenProvider(Protocol):
    async def token(self) -> str: ...

    async def aclose(self) -> None: ...


class StaticToken:
    """A fixed bearer token (tests, or a token minted elsewhere)."""

    def __init__(self, value: str) -> None:
        self._value = value

    async def token(self) -> str:
        return self._value

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:  # never print the token
        return "StaticToken(***)"


class _Response:
    """google.auth.transport.Response over an httpx response."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.headers = response.headers
        self.data = response.content


class HttpxRequest:
    """google.auth.transport.Request over a synchronous httpx client (used in a thread)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self._client = httpx.Client(timeout=timeout)

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> _Response:
        from google.auth import exceptions

        try:
            response = self._client.request(
                method, url, content=body, headers=dict(headers or {}), timeout=timeout
            )
        except httpx.HTTPError as error:
            raise exceptions.TransportError(f"{type(error).__name__}") from None
        return _Response(response)

    def close(self) -> None:
        self._client.close()


class GoogleTokens:
    """Tokens from google-auth credentials, refreshed off the event loop when stale."""

    def __init__(self, credentials: Any, timeout: float = 30.0) -> None:
        self._credentials = credentials
        self._request = HttpxRequest(timeout)
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        async with self._lock:  # one refresh at a time; the others reuse its token
            if not self._credentials.valid:
                await asyncio.to_thread(self._credentials.refresh, self._request)
            return str(self._credentials.token)

    async def aclose(self) -> None:
        self._request.close()


def load_credentials(credentials_file: str | None) -> tuple[Any, str | None]:
    """(credentials, project from them) from the key file, else ADC; MissingCredentials when
    there are none. ADC may probe the metadata server, so call this once, at start-up."""
    import google.auth
    from google.auth import exceptions
    from google.oauth2 import service_account

    if credentials_file:
        try:
            credentials = service_account.Credentials.from_service_account_file(
                credentials_file, scopes=SCOPES
            )
        except (OSError, ValueError, KeyError) as error:
            raise MissingCredentials(
                f"cannot read credentials_file {credentials_file}: {type(error).__name__}"
            ) from None
        return credentials, credentials.project_id
    try:
        credentials, project = google.auth.default(scopes=list(SCOPES))
    except exceptions.DefaultCredentialsError:
        raise MissingCredentials(f"no Google credentials: {_HOW}") from None
    return credentials, project

"""Signing in to the dashboard: the API key in a cookie, and the checks every form passes.

The sign-in form takes an operator API key once; the key is then kept in the cookie
`gpuprov_key` (HttpOnly: no script reads it; SameSite=Strict: no other site's page sends it;
Secure over HTTPS; Path=/ui) and checked like a bearer key on every page, so a revoked key signs
its page out at once. It never appears in a URL or a page. A bad key gets the sign-in page again
(401), and counts against the same throttle as a bad bearer key (429 while throttled).

Every form that changes something (release, cancel, drain, sign out) carries a CSRF token: an
HMAC of the form's purpose under the signed-in key, so only a page rendered for that key can
have it; and a request whose Origin (or Sec-Fetch-Site) says another site sent it is refused
before the token is read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from fastapi import Depends, HTTPException, Request, Response

from gpuprov.api.auth import Caller, Guard, caller_of, guard
from gpuprov.store.credentials import Credentials

COOKIE = "gpuprov_key"
COOKIE_PATH = "/ui"
CSRF_FIELD = "csrf"
MAX_FORM_BYTES = 4096  # a sign-in or a button: a few hundred bytes
KEY_PREFIX = "gpo_"


class SignedOut(Exception):
    """No live key in the cookie: the page answers with the sign-in form (`message` says why)."""

    def __init__(self, message: str | None = None, status: int = 401) -> None:
        super().__init__(message or "")
        self.message = message
        self.status = status


class Session:
    """The signed-in caller and what its pages need: the CSRF token of its forms."""

    def __init__(self, caller: Caller, key: str) -> None:
        self.caller = caller
        self._key = key

    @property
    def csrf(self) -> str:
        return csrf_token(self._key)

    def check_csrf(self, submitted: str | None) -> None:
        if not submitted or not hmac.compare_digest(submitted, self.csrf):
            raise HTTPException(403, "the form's CSRF token is missing or not this session's")


def csrf_token(key: str) -> str:
    return hmac.new(key.encode(), b"gpuprov dashboard form", hashlib.sha256).hexdigest()


async def lookup(request: Request, key: str) -> Caller | None:
    """The caller whose live operator key `key` is, or None."""
    if not key.startswith(KEY_PREFIX) or len(key) > 256:
        return None
    credentials: Credentials = request.app.state.credentials
    row = await asyncio.to_thread(credentials.operator, key)
    return caller_of(row) if row is not None else None


async def signed_in(request: Request, throttle: Annotated[Guard, Depends(guard)]) -> Session:
    """The page's caller, from the cookie's key; SignedOut without a live one."""
    key = request.cookies.get(COOKIE)
    if not key:
        raise SignedOut()
    caller = await lookup(request, key)
    if caller is None:
        refusal = throttle.refused(key, "unknown or revoked operator API key")
        if refusal.status_code == 429:
            raise refusal
        raise SignedOut("That key is unknown or revoked: sign in again.")
    return Session(caller, key)


def same_origin(request: Request) -> None:
    """403 for a form another site's page sent (its Origin, or the browser's Sec-Fetch-Site)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise HTTPException(403, "this form was sent from another site")
    origin = request.headers.get("origin")
    if origin is None or origin == "null" and request.url.path == "/ui/login":
        return
    sent_from = urlsplit(origin)
    host = request.headers.get("host", "")
    # The host alone: behind a TLS-terminating proxy the scheme seen here is not the page's.
    if sent_from.netloc != host:
        raise HTTPException(403, "this form was sent from another site")


async def form(request: Request) -> dict[str, str]:
    """The urlencoded form's fields (the first value of each); 413 for a body over the limit."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, "form too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "not a form") from None
    return {name: values[0] for name, values in fields.items()}


def set_cookie(request: Request, response: Response, key: str) -> None:
    response.set_cookie(
        COOKIE,
        key,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")

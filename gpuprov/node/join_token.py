"""The join token, read once and never from the command line: stdin (a pipe, a file, or a
prompt without echo on a terminal), `--token-fd N`, or `--token-file` (0600: the bare token,
or an env file whose GPUPROV_JOIN_TOKEN= is the token and GPUPROV_API_URL= stands in for
--url). $GPUPROV_JOIN_TOKEN still works, with a warning, and is dropped from the environment at
once so no child inherits it.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import re
import select
import time
from dataclasses import dataclass

from .errors import AgentError

log = logging.getLogger(__name__)

TOKEN_ENV = "GPUPROV_JOIN_TOKEN"  # deprecated: visible to `ps e`
URL_ENV = "GPUPROV_API_URL"  # read from an env-style --token-file only
TOKEN_WAIT = 30.0  # seconds to wait for the token on stdin / --token-fd


@dataclass
class JoinSecret:
    """The token, and what an env-style token file says besides (API URL, VM name)."""

    token: str
    api_url: str | None = None
    vm: str | None = None


def _read_line(fd: int, what: str, timeout: float) -> str:
    """The first line readable from `fd` (up to EOF), waiting at most `timeout` seconds."""
    deadline, data = time.monotonic() + timeout, b""
    try:
        while b"\n" not in data and len(data) < 4096:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentError(f"no join token on {what} within {timeout:g}s")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
    except OSError as error:
        raise AgentError(f"cannot read the join token from {what}: {error.strerror}") from None
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def _env_value(text: str, name: str) -> str | None:
    """NAME=value from env-file text (`export ` and quotes allowed), else None."""
    match = re.search(rf"^[ \t]*(?:export[ \t]+)?{name}[ \t]*=[ \t]*(.*?)[ \t]*$", text, re.M)
    return match.group(1).strip("'\"") if match else None


def _read_token_file(path: str, delete: bool) -> JoinSecret:
    """A bare token (first line), or an env file holding GPUPROV_JOIN_TOKEN=."""
    try:
        mode = os.stat(path).st_mode & 0o777
        with open(path, "rb") as handle:
            text = handle.read(65536).decode("utf-8", "replace")
    except OSError as error:
        raise AgentError(f"cannot read token file {path}: {error.strerror}") from None
    if mode & 0o077:
        log.warning("token file %s is open to other users (mode %03o): chmod 600 it", path, mode)
    if delete:
        try:
            os.unlink(path)
        except OSError as error:
            log.warning("cannot delete token file %s: %s", path, error.strerror)
    token = _env_value(text, TOKEN_ENV)
    if token is not None:
        return JoinSecret(token, _env_value(text, URL_ENV), _env_value(text, "GPUPROV_VM"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return JoinSecret(lines[0] if lines else "")


def read_join_secret(
    token_file: str | None = None,
    token_fd: int | None = None,
    delete_file: bool = False,
    wait: float | None = None,
    allow_env: bool = True,
) -> JoinSecret:
    """The join token from --token-file, else --token-fd, else $GPUPROV_JOIN_TOKEN (unless
    `allow_env` is False: `run` never takes it), else stdin.

    $GPUPROV_JOIN_TOKEN is removed from this process's environment whichever source is used,
    so no child (nvidia-smi, the CUDA check) inherits it.
    """
    from_env = os.environ.pop(TOKEN_ENV, "").strip()
    if from_env and not allow_env:
        log.warning("ignoring $%s: pass the token on stdin or with --token-file", TOKEN_ENV)
        from_env = ""
    wait = TOKEN_WAIT if wait is None else wait
    if token_file:
        secret = _read_token_file(token_file, delete_file)
    elif token_fd is not None:
        secret = JoinSecret(_read_line(token_fd, f"descriptor {token_fd}", wait))
        with contextlib.suppress(OSError):
            os.close(token_fd)
    elif from_env:
        log.warning(
            "reading the join token from $%s: `ps e` and /proc/PID/environ show it to this "
            "user and root; pipe it on stdin or use --token-file instead",
            TOKEN_ENV,
        )
        secret = JoinSecret(from_env)
    elif os.isatty(0):
        secret = JoinSecret(getpass.getpass("join token: ").strip())
    else:
        secret = JoinSecret(_read_line(0, "stdin", wait))
    if not secret.token:
        raise AgentError("no join token: pipe it on stdin, or pass --token-file or --token-fd")
    if not 16 <= len(secret.token) <= 256 or any(
        character.isspace() or not character.isprintable() for character in secret.token
    ):  # never quote it: it may be a wrong file's content, or the token itself
        raise AgentError(
            f"the join token read does not look like one ({len(secret.token)} characters; "
            "expected one line of 16-256 printable characters)"
        )
    return secret


def read_token(
    token_file: str | None = None, token_fd: int | None = None, delete_file: bool = False
) -> str:
    """The join token alone (see read_join_secret)."""
    return read_join_secret(token_file, token_fd, delete_file).token

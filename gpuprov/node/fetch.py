"""The step before the agent starts on a node: agent.pyz made the archive its pin names.

    python3 -I -S fetch.py URL SHA256 DEST [CA_FILE]

DEST holding bytes whose SHA-256 is SHA256: nothing to do (a reboot with the API down still
starts the agent). Otherwise GET URL (over HTTPS trusting CA_FILE's CAs alone, if given) and
write the body to DEST (aside, then renamed, 0644) only if its SHA-256 is SHA256. Else (no
answer, a truncated or tampered archive) exit 1 with one line on stderr and no DEST: the agent
never starts, its join token stays unspent, and the unit's Restart= tries again. Cloud-init
writes this file alone (providers/node_agent.py): standard library only.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import sys
import urllib.request

TIMEOUT = 30.0  # seconds the connection and each read may take
MAX_BYTES = 32 * 1024 * 1024  # far above any agent.pyz: a runaway answer is cut off


def sha256_of(path: str) -> str | None:
    """The SHA-256 of the file at `path`, or None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def download(url: str, ca_file: str | None) -> bytes:
    """The body of GET `url`; OSError (urllib's errors among them) when it cannot be had."""
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https://") else None
    with urllib.request.urlopen(url, timeout=TIMEOUT, context=context) as answer:
        return answer.read(MAX_BYTES + 1)


def install(data: bytes, dest: str) -> None:
    """`data` written beside `dest`, then renamed over it: never a half-written agent."""
    part = f"{dest}.{os.getpid()}.part"
    with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as handle:
        handle.write(data)
    os.chmod(part, 0o644)
    os.replace(part, dest)


def fetch(url: str, pinned: str, dest: str, ca_file: str | None = None) -> str | None:
    """Make `dest` the agent pinned to `pinned`; None once it is, else why it is not."""
    if sha256_of(dest) == pinned:
        return None
    if os.path.lexists(dest):
        os.unlink(dest)  # changed since it was written: never run, fetched again below
    try:
        data = download(url, ca_file)
    except (OSError, ValueError) as error:
        return f"cannot fetch {url}: {getattr(error, 'reason', error)}"
    got = hashlib.sha256(data).hexdigest()
    if got != pinned:
        return f"refused {url}: {len(data)} bytes with SHA-256 {got}, pinned {pinned}"
    install(data, dest)
    return None


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print("usage: fetch.py URL SHA256 DEST [CA_FILE]", file=sys.stderr)
        return 2
    problem = fetch(argv[1], argv[2], argv[3], argv[4] if len(argv) == 5 else None)
    if problem is not None:
        print(f"gpuprov-agent fetch: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The launch's `user_data`: the spec's own cloud-init user data, the node's bootstrap, or both.

The bootstrap (API URL and single-use join token) becomes a cloud-config that writes
`/etc/gpuprov/join.env` (root-only, 0600) for the node agent. With the spec's own user data as
well, both go as a MIME multi-part archive, which cloud-init runs part by part. The result holds
a secret: it goes into the launch body and nowhere else (Lambda's `user_data` is write-only).
"""

from __future__ import annotations

import json
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from providers.base import InstanceSpec
from providers.errors import ErrorKind, ProviderError

MAX_USER_DATA = 1_000_000  # bytes; Lambda refuses user data over 1 MB
JOIN_ENV_PATH = "/etc/gpuprov/join.env"


def user_data(spec: InstanceSpec) -> str | None:
    """The user data to launch with, or None. InvalidRequest if it exceeds Lambda's limit."""
    parts = [part for part in (spec.user_data, _bootstrap(spec)) if part]
    if not parts:
        return None
    text = parts[0] if len(parts) == 1 else _multipart(parts)
    size = len(text.encode())
    if size > MAX_USER_DATA:
        raise ProviderError(
            ErrorKind.INVALID_REQUEST,
            f"user data of {spec.vm} is {size} bytes; Lambda accepts at most {MAX_USER_DATA}",
        )
    return text


def _bootstrap(spec: InstanceSpec) -> str | None:
    if spec.bootstrap is None:
        return None
    env = (
        f"GPUPROV_API_URL={spec.bootstrap.api_url}\n"
        f"GPUPROV_JOIN_TOKEN={spec.bootstrap.join_token}\n"
    )
    config = {
        "write_files": [
            {"path": JOIN_ENV_PATH, "permissions": "0600", "owner": "root:root", "content": env}
        ]
    }
    # JSON is YAML: no quoting pitfalls whatever the URL holds.
    return "#cloud-config\n" + json.dumps(config)


# cloud-init's first-line markers -> the MIME subtype of that part (text/<subtype>)
MARKERS = {
    "#cloud-config": "cloud-config",
    "#!": "x-shellscript",
    "#include": "x-include-url",
    "#cloud-boothook": "cloud-boothook",
    "#part-handler": "part-handler",
}


def _multipart(parts: list[str]) -> str:
    archive = MIMEMultipart()
    for part in parts:
        subtype = next((sub for mark, sub in MARKERS.items() if part.startswith(mark)), "plain")
        archive.attach(MIMEText(part, subtype, "utf-8"))
    return archive.as_string()

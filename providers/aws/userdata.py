"""User data for RunInstances: the node's bootstrap (API URL and join token) and the spec's own
user data, as one cloud-init document.

The join token is a secret: it goes only into the RunInstances request (the SDK base64-encodes
`UserData`), never into a log line, an exception, a return value or Offer.detail. On the machine
cloud-init writes it to a root-only file (0600) for the node agent to read (`--token-file`).
"""

from __future__ import annotations

import hashlib
import json
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from providers.base import InstanceSpec

JOIN_ENV_PATH = "/etc/gpuprov/join.env"
MAX_USER_DATA_BYTES = 16 * 1024  # EC2's limit on raw user data


def user_data(spec: InstanceSpec) -> str | None:
    """The UserData to launch `spec` with, or None when there is nothing to pass."""
    parts: list[tuple[str, str]] = []
    if spec.bootstrap is not None:
        parts.append(("cloud-config", _bootstrap_cloud_config(spec)))
    if spec.user_data:
        parts.append((_subtype(spec.user_data), spec.user_data))
    if not parts:
        return None
    if len(parts) == 1 and spec.bootstrap is None:
        return spec.user_data  # the spec's own document, untouched
    # The boundary is derived from the content, not random: a retried RunInstances must send
    # byte-identical user data, or EC2 answers IdempotentParameterMismatch for its ClientToken.
    digest = hashlib.sha256("\0".join(text for _, text in parts).encode()).hexdigest()
    document = MIMEMultipart(boundary=f"gpuprov-{digest[:32]}")
    for subtype, text in parts:
        document.attach(MIMEText(text, subtype))  # 7bit when ASCII, else base64 UTF-8
    return document.as_string()


def _bootstrap_cloud_config(spec: InstanceSpec) -> str:
    assert spec.bootstrap is not None
    env = (
        f"GPUPROV_API_URL={spec.bootstrap.api_url}\n"
        f"GPUPROV_JOIN_TOKEN={spec.bootstrap.join_token}\n"
        f"GPUPROV_VM={spec.vm}\n"
    )
    write = {"path": JOIN_ENV_PATH, "permissions": "0600", "owner": "root:root", "content": env}
    # JSON is valid YAML: no hand-written quoting of the token or URL.
    return "#cloud-config\n" + json.dumps({"write_files": [write]})


def _subtype(text: str) -> str:
    """The MIME subtype cloud-init reads a part as, from its first line."""
    if text.startswith("#cloud-config"):
        return "cloud-config"
    if text.startswith("#!"):
        return "x-shellscript"
    if text.startswith("#include"):
        return "x-include-url"
    return "x-shellscript"

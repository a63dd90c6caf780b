"""The `user-data` metadata value: the spec's own cloud-init user data, the node's bootstrap, or
both (cloud-init's GCE data source reads the `user-data` metadata key on Ubuntu images).

The bootstrap (API URL and single-use join token) becomes a cloud-config that writes
`/etc/gpuprov/join.env` (root-only, 0600) for the node agent (`agent.py register --token-file`),
the same file the other adapters write. With the spec's own user data as well, both go as a MIME
multi-part archive, which cloud-init runs part by part. The result holds a secret: it goes into
the insert body and nowhere else.
"""

from __future__ import annotations

import json
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from providers.base import InstanceSpec
from providers.errors import ErrorKind, ProviderError

JOIN_ENV_PATH = "/etc/gpuprov/join.env"
MAX_VALUE_BYTES = 256 * 1024  # Compute Engine's limit on one metadata value
MARKERS = {  # cloud-init's first-line markers -> the MIME subtype of that part
    "#cloud-config": "cloud-config",
    "#!": "x-shellscript",
    "#include": "x-include-url",
    "#cloud-boothook": "cloud-boothook",
    "#part-handler": "part-handler",
}


def user_data(spec: InstanceSpec) -> str | None:
    """The `user-data` value for `spec`, or None; InvalidRequest past the metadata limit."""
    parts = [part for part in (_bootstrap(spec), spec.user_data) if part]
    if not parts:
        return None
    text = parts[0] if len(parts) == 1 else _multipart(parts)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_VALUE_BYTES:
        raise ProviderError(
            ErrorKind.INVALID_REQUEST,
            f"user data of {spec.vm} is {size} bytes; a GCE metadata value holds {MAX_VALUE_BYTES}",
        )
    return text


def _bootstrap(spec: InstanceSpec) -> str | None:
    if spec.bootstrap is None:
        return None
    env = (
        f"GPUPROV_API_URL={spec.bootstrap.api_url}\n"
        f"GPUPROV_JOIN_TOKEN={spec.bootstrap.join_token}\n"
        f"GPUPROV_VM={spec.vm}\n"
    )
    write = {"path": JOIN_ENV_PATH, "permissions": "0600", "owner": "root:root", "content": env}
    return "#cloud-config\n" + json.dumps({"write_files": [write]})  # JSON is YAML: no quoting


def _multipart(parts: list[str]) -> str:
    archive = MIMEMultipart()
    for part in parts:
        subtype = next((sub for mark, sub in MARKERS.items() if part.startswith(mark)), "plain")
        archive.attach(MIMEText(part, subtype, "utf-8"))
    return archive.as_string()

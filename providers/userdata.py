"""Cloud-init user data for a new machine: the spec's own user data, the node's bootstrap, or both.

Shared by the adapters whose clouds boot with cloud-init user data: aws (RunInstances
`UserData`), gce (the `user-data` metadata value), lambda (the launch body's `user_data`). Each
passes its cloud's size limit and name; everything else is the same on every cloud:

- The bootstrap (API URL, single-use join token, the VM's name) becomes a cloud-config that
  writes `/etc/gpuprov/join.env` (root:root, 0600), the env file the node agent reads with
  `--token-file` (gpuprov/agent.py).
- The spec's own user data, alone, goes to the cloud untouched.
- With a bootstrap, the result is a MIME multi-part archive (the spec's own first, then the
  bootstrap, whose `merge_how` appends its write_files to any the spec's cloud-config has),
  which cloud-init runs part by part; a part's type comes from its first line, the way
  cloud-init itself tells them apart (text/plain, cloud-init's own guess, otherwise).
- The same spec always gives byte-identical user data: the MIME boundary is derived from the
  content, never random. EC2 needs this (a retried RunInstances with the same ClientToken but
  other user data fails with IdempotentParameterMismatch); elsewhere retries stay comparable.
- Past the cloud's limit, or not UTF-8 text: InvalidRequest, naming sizes only.

The result holds a secret (the join token): it goes into the cloud's create request and nowhere
else, never into a log line, an exception, a return value or Offer.detail.
"""

from __future__ import annotations

import hashlib
import json
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from providers.base import InstanceSpec
from providers.errors import ErrorKind, ProviderError

JOIN_ENV_PATH = "/etc/gpuprov/join.env"
# cloud-init's first-line markers -> the MIME subtype of that part (text/<subtype>). Longer
# markers first: "#cloud-config-archive" also starts with "#cloud-config".
MARKERS = (
    ("#cloud-config-archive", "cloud-config-archive"),
    ("#cloud-config", "cloud-config"),
    ("#cloud-boothook", "cloud-boothook"),
    ("#part-handler", "part-handler"),
    ("#include-once", "x-include-once-url"),
    ("#include", "x-include-url"),
    ("#!", "x-shellscript"),
)


def user_data(spec: InstanceSpec, *, max_bytes: int, cloud: str) -> str | None:
    """The user data to create `spec` with, or None when there is nothing to pass.

    InvalidRequest when it exceeds `max_bytes` (UTF-8), `cloud`'s limit, or is not UTF-8 text."""
    own = spec.user_data or None
    if own is not None:
        _utf8(own, spec.vm)
    if spec.bootstrap is None:
        document = own
    else:
        # The bootstrap part goes last and says how to merge: cloud-init merges each part onto
        # the ones before it, by default replacing lists, so a spec whose own cloud-config has
        # write_files would otherwise drop (or be dropped by) join.env.
        document = _multipart([*([own] if own else []), bootstrap_cloud_config(spec)])
    if document is None:
        return None
    size = len(_utf8(document, spec.vm))
    if size > max_bytes:
        raise ProviderError(
            ErrorKind.INVALID_REQUEST,
            f"user data of {spec.vm} is {size} bytes; {cloud} accepts at most {max_bytes}",
        )
    return document


def bootstrap_cloud_config(spec: InstanceSpec) -> str:
    """The cloud-config that writes the node's join.env (holds the join token)."""
    assert spec.bootstrap is not None
    env = (
        f"GPUPROV_API_URL={spec.bootstrap.api_url}\n"
        f"GPUPROV_JOIN_TOKEN={spec.bootstrap.join_token}\n"
        f"GPUPROV_VM={spec.vm}\n"
    )
    write = {"path": JOIN_ENV_PATH, "permissions": "0600", "owner": "root:root", "content": env}
    merge_how = [
        {"name": "list", "settings": ["append"]},
        {"name": "dict", "settings": ["no_replace", "recurse_list"]},
    ]
    # JSON is valid YAML: no hand-written quoting of the token or URL, whatever they hold.
    return "#cloud-config\n" + json.dumps({"merge_how": merge_how, "write_files": [write]})


def part_subtype(text: str) -> str:
    """The MIME subtype cloud-init reads a part as, from its first line."""
    return next((sub for mark, sub in MARKERS if text.startswith(mark)), "plain")


def _multipart(parts: list[str]) -> str:
    # Deterministic boundary (see the module docstring); 128 bits of a hash of the content
    # cannot occur in that content by accident.
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    archive = MIMEMultipart(boundary=f"gpuprov-{digest[:32]}")
    for text in parts:
        # 7bit when ASCII; base64 UTF-8 otherwise, and for a text with a CR in it, which a 7bit
        # part would reach cloud-init with its line ends rewritten.
        charset = "utf-8" if "\r" in text else None
        archive.attach(MIMEText(text, part_subtype(text), charset))
    return archive.as_string()


def _utf8(text: str, vm: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ProviderError(
            ErrorKind.INVALID_REQUEST, f"user data of {vm} is not valid UTF-8 text"
        ) from None

"""Cloud-init user data for a new machine: the spec's own user data, the node's bootstrap, or both.

Shared by the adapters whose clouds boot with cloud-init user data: aws (RunInstances
`UserData`), gce (the `user-data` metadata value), lambda (the launch body's `user_data`). Each
passes its cloud's size limit and name; everything else is the same on every cloud:

- The bootstrap (API URL, single-use join token, the VM's name, the API's CA if it has a
  private one) becomes a cloud-config that fetches, pins and starts the node agent
  (providers/node_agent.py): the fetch-and-verify step, `/etc/gpuprov/join.env` (root:root,
  0600, the env file the agent reads with `--token-file`), the CA, and a systemd unit whose
  every start first makes agent.pyz the archive its pinned SHA-256 names (fetched from the API
  at GET /v1/node/agent.pyz). The agent itself is not in the user data: a few KB go to the
  cloud, whatever the agent's size.
- The spec's own user data, alone, goes to the cloud untouched.
- With a bootstrap, the result is a MIME multi-part archive (the spec's own first, then the
  bootstrap, whose `merge_how` appends its write_files to any the spec's cloud-config has),
  which cloud-init runs part by part; a part's type comes from its first line, the way
  cloud-init itself tells them apart (text/plain, cloud-init's own guess, otherwise).
- The same spec always gives byte-identical user data: the MIME boundary is derived from the
  content, never random. EC2 needs this (a retried RunInstances with the same ClientToken but
  other user data fails with IdempotentParameterMismatch); elsewhere retries stay comparable.
- Past the cloud's limit: Unavailable for the whole provider, naming sizes only. The limit is
  this cloud's (EC2 16 KB, GCE metadata 256 KiB, ...), so every offer of this cloud would
  refuse the document while another cloud may take it: the job fails over, it does not abort.
  Not UTF-8 text: InvalidRequest (no cloud can take it). Where the cloud takes bytes (EC2),
  `compressed_user_data` gzips (deterministically) a document that carries the bootstrap or
  is over the limit: cloud-init decompresses gzip user data before anything else. The spec's
  own user data alone, within the limit, goes as it is.

The result holds a secret (the join token): it goes into the cloud's create request and nowhere
else, never into a log line, an exception, a return value or Offer.detail.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from providers import agent_artifact, node_agent
from providers.base import InstanceSpec
from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.node_agent import JOIN_ENV_PATH as JOIN_ENV_PATH  # re-exported (tests)
from providers.node_agent import NO_NOTICES, NoticeSource

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
# Each part's lists are appended to, and its tables merged into, those of the parts before it.
MERGE_HOW = [
    {"name": "list", "settings": ["append"]},
    {"name": "dict", "settings": ["no_replace", "recurse_list"]},
]


def user_data(
    spec: InstanceSpec, *, max_bytes: int, cloud: str, notices: NoticeSource = NO_NOTICES
) -> str | None:
    """The user data to create `spec` with, or None when there is nothing to pass. `notices`:
    where its agent watches the cloud's notices about the machine (node_agent.NoticeSource).

    Unavailable (for the provider) when it exceeds `max_bytes` (UTF-8), `cloud`'s limit;
    InvalidRequest when it is not UTF-8 text."""
    document = _document(spec, notices)
    if document is None:
        return None
    _fits(len(_utf8(document, spec.vm)), max_bytes, cloud, spec.vm)
    return document


def compressed_user_data(
    spec: InstanceSpec, *, max_bytes: int, cloud: str, notices: NoticeSource = NO_NOTICES
) -> bytes | None:
    """As `user_data`, as bytes, for a cloud whose limit counts raw bytes and that passes them
    to cloud-init unchanged (EC2): gzip-compressed when it carries the bootstrap (about 2 KB
    then, with a CA) or the plain document is over `max_bytes`.
    cloud-init reads gzip user data on every data source ("Compression" in its user-data
    formats); the same document always gives the same bytes (no timestamp in the header)."""
    document = _document(spec, notices)
    if document is None:
        return None
    raw = _utf8(document, spec.vm)
    if spec.bootstrap is not None or len(raw) > max_bytes:
        raw = gzip.compress(raw, compresslevel=9, mtime=0)
    _fits(len(raw), max_bytes, cloud, spec.vm)
    return raw


def _document(spec: InstanceSpec, notices: NoticeSource) -> str | None:
    own = spec.user_data or None
    if own is not None:
        _utf8(own, spec.vm)
    if spec.bootstrap is None:
        return own
    # The bootstrap part goes last and says how to merge: cloud-init merges each part onto
    # the ones before it, by default replacing lists, so a spec whose own cloud-config has
    # write_files or runcmd would otherwise drop (or be dropped by) the agent's.
    return _multipart([*([own] if own else []), bootstrap_cloud_config(spec, notices)])


def _fits(size: int, max_bytes: int, cloud: str, vm: str) -> None:
    if size > max_bytes:
        raise ProviderError(
            ErrorKind.UNAVAILABLE,
            f"user data of {vm} is {size} bytes; {cloud} accepts at most {max_bytes}",
            block_scope=BlockScope.PROVIDER,
        )


def bootstrap_cloud_config(spec: InstanceSpec, notices: NoticeSource = NO_NOTICES) -> str:
    """The cloud-config that fetches, pins and starts the node agent (holds the join token)."""
    assert spec.bootstrap is not None
    boot = spec.bootstrap
    if any(not ch.isprintable() or ch.isspace() for ch in boot.api_url):
        raise ProviderError(
            ErrorKind.INVALID_REQUEST,
            "the API URL for nodes has whitespace or a control character: fix [api] public_url",
        )
    env = (
        f"GPUPROV_API_URL={boot.api_url}\n"
        f"GPUPROV_JOIN_TOKEN={boot.join_token}\n"
        f"GPUPROV_VM={spec.vm}\n"
    )
    files = [
        _file(JOIN_ENV_PATH, "0600", content=env),
        _file(node_agent.FETCH_PATH, "0644", content=agent_artifact.fetch_source().decode()),
        _file(
            node_agent.UNIT_PATH,
            "0644",
            content=node_agent.unit(boot.api_url, bool(boot.ca_pem), notices),
        ),
    ]
    if boot.ca_pem:
        files.append(_file(node_agent.CA_PATH, "0644", content=boot.ca_pem))
    runcmd = [
        ["systemctl", "daemon-reload"],
        # --no-block: runcmd runs inside cloud-final; the unit must not wait for it.
        ["systemctl", "enable", "--now", "--no-block", node_agent.UNIT_NAME],
    ]
    document = {"merge_how": MERGE_HOW, "write_files": files, "runcmd": runcmd}
    # JSON is valid YAML: no hand-written quoting of the token or URL, whatever they hold.
    return "#cloud-config\n" + json.dumps(document)


def _file(path: str, permissions: str, **fields: str) -> dict[str, str]:
    return {"path": path, "permissions": permissions, "owner": "root:root", **fields}


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

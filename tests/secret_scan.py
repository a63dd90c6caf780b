"""The secret scan of Temporal histories: does any secret a run used appear anywhere in what
Temporal keeps of a workflow?

    histories(client, workflow_id)          every run of the workflow (back along
                                            continue-as-new), and of the child workflows any
                                            run started, oldest run first
    scan(histories, secrets, codec)         the findings: (kind, event id, where, form)
    forms(secret)                           the encodings of one secret that are looked for

Every event is walked field by field (it is a protobuf message): every string field (failure
messages and stack traces, activity and signal names, identities, search attribute keys,
memo keys, header keys, ...) is searched, every bytes field is searched as text, and every
`Payload` met on the way (inputs and results, failure details and encoded attributes, memo
and search attribute values, headers, user metadata) is decrypted with the codec where it is
encrypted (gpuprov/sdk/codec.py) and its metadata and data are searched. An encrypted payload
without a codec to open it is an error, never a clean result: a scan that cannot read a
payload has not shown that a secret is not in it.

A secret is looked for as it is, JSON-escaped, percent-encoded, as hex, and as base64 (standard
and URL-safe, at each of the three byte alignments it can have inside a longer value); a secret
of several lines (a PEM key) also by each of its lines that is its own (not a `-----BEGIN`
line). A finding names the secret's kind, never the secret: the report is safe to print.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from gpuprov.sdk.codec import ENCODING, EncryptionCodec

MIN_SECRET_CHARS = 12  # shorter needles would match ordinary text
MIN_LINE_CHARS = 24  # a line of a multi-line secret looked for on its own


@dataclass(frozen=True)
class Finding:
    """One place a secret was found: its kind, the event, the field path and the encoding."""

    kind: str
    event_id: int
    where: str  # "<workflow id>/<run id> <event type> <field path>"
    form: str  # raw, json-escaped, percent-encoded, hex, base64, base64url, line

    def __str__(self) -> str:
        return f"{self.kind} ({self.form}) in event {self.event_id}: {self.where}"


@dataclass
class Scan:
    """What a scan found, and how much it read: a scan of nothing shows nothing."""

    findings: list[Finding] = field(default_factory=list)
    histories: int = 0
    events: int = 0
    payloads: int = 0
    decrypted: int = 0  # payloads the codec opened

    def kinds(self) -> set[str]:
        return {finding.kind for finding in self.findings}

    def report(self) -> str:
        return "\n".join(str(finding) for finding in self.findings) or "nothing found"


class UnreadablePayload(ValueError):
    """An encrypted payload and no codec (or not its key): the scan cannot vouch for it."""


def forms(secret: str) -> dict[str, str]:
    """Each encoding of `secret` to look for, by name."""
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"a secret of {len(secret)} characters would match ordinary text")
    found = {"raw": secret, "json-escaped": json.dumps(secret)[1:-1]}
    found["percent-encoded"] = quote(secret, safe="")
    raw = secret.encode()
    found["hex"] = raw.hex()
    for pad in range(3):
        # Inside a longer value the secret's bytes can start at any of three offsets of a
        # base64 quantum; the characters that also carry a neighbour's bits are left off.
        shifted = b"\0" * pad + raw
        start = (pad * 8 + 5) // 6
        standard = base64.b64encode(shifted).rstrip(b"=").decode()[start:-2]
        found[f"base64+{pad}"] = standard
        found[f"base64url+{pad}"] = standard.replace("+", "-").replace("/", "_")
    lines = [line.strip() for line in secret.splitlines()]
    for number, line in enumerate(lines):
        if len(lines) > 1 and len(line) >= MIN_LINE_CHARS and not line.startswith("-----"):
            found[f"line {number + 1}"] = line
    return {name: text for name, text in found.items() if text}


class _Needles:
    """Every form of every secret, searched in one piece of text at a time."""

    def __init__(self, secrets: Mapping[str, Sequence[str]]) -> None:
        self.by_kind: list[tuple[str, str, str]] = []  # (kind, form name, text)
        for kind, values in secrets.items():
            if not values:
                raise ValueError(f"no value of {kind!r} to look for: the scan would be vacuous")
            for value in values:
                for name, text in forms(value).items():
                    self.by_kind.append((kind, name.split("+")[0], text))

    def search(self, text: str) -> Iterator[tuple[str, str]]:
        seen: set[tuple[str, str]] = set()
        for kind, name, needle in self.by_kind:
            if needle in text and (kind, name) not in seen:
                seen.add((kind, name))
                yield kind, name


async def histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Every run of `workflow_id` (its latest back to its first, through each run's
    `continued_execution_run_id`), then the same for each child workflow they started."""
    runs: list[WorkflowHistory] = []
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        runs.insert(0, history)
        started = history.events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            break
        run_id = started.continued_execution_run_id
    children: list[WorkflowHistory] = []
    for history in runs:
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                child = event.child_workflow_execution_started_event_attributes
                children += await histories(client, child.workflow_execution.workflow_id)
    return runs + children


def scan(
    found: Sequence[WorkflowHistory],
    secrets: Mapping[str, Sequence[str]],
    codec: EncryptionCodec | None = None,
) -> Scan:
    """Search every event of every history for every form of every secret."""
    needles = _Needles(secrets)
    result = Scan(histories=len(found))
    for history in found:
        for event in history.events:
            result.events += 1
            where = f"{history.workflow_id}/{history.run_id} {EventType.Name(event.event_type)}"
            _walk(event, "", _Context(needles, codec, result, event.event_id, where))
    return result


@dataclass
class _Context:
    needles: _Needles
    codec: EncryptionCodec | None
    result: Scan
    event_id: int
    where: str

    def holds_secret(self, text: str) -> bool:
        return next(self.needles.search(text), None) is not None

    def search(self, text: str, path: str) -> None:
        for kind, form in self.needles.search(text):
            where = f"{self.where} {path.lstrip('.')}"
            self.result.findings.append(Finding(kind, self.event_id, where, form))


def _walk(message: Message, path: str, context: _Context) -> None:
    if isinstance(message, Payload):
        _payload(message, path, context)
        return
    for descriptor, value in message.ListFields():
        here = f"{path}.{descriptor.name}"
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            for index, (key, item) in enumerate(value.items()):
                # The key names the entry in a finding unless it is itself a secret.
                label = key if isinstance(key, str) and not context.holds_secret(key) else index
                _value(key, f"{here}[{index}](key)", context)
                _value(item, f"{here}[{label!r}]", context)
        elif descriptor.is_repeated:
            for index, item in enumerate(value):
                _value(item, f"{here}[{index}]", context)
        else:
            _value(value, here, context)


def _value(value: object, path: str, context: _Context) -> None:
    if isinstance(value, Message):
        _walk(value, path, context)
    elif isinstance(value, str):
        context.search(value, path)
    elif isinstance(value, bytes):
        context.search(value.decode("utf-8", "replace"), path)


def _payload(payload: Payload, path: str, context: _Context) -> None:
    """A payload: opened with the codec where encrypted, then its metadata and data (and, for
    JSON data, every string inside it unescaped) searched."""
    context.result.payloads += 1
    if payload.metadata.get("encoding") == ENCODING:
        if context.codec is None:
            raise UnreadablePayload(f"{context.where} {path}: encrypted, and no codec to open it")
        payload = context.codec.decrypt(payload)
        context.result.decrypted += 1
        path = f"{path}(decrypted)"
    for key, value in payload.metadata.items():
        context.search(f"{key}={value.decode('utf-8', 'replace')}", f"{path}.metadata")
    text = payload.data.decode("utf-8", "replace")
    context.search(text, f"{path}.data")
    try:
        document = json.loads(text)
    except ValueError:
        return
    for index, inner in enumerate(_strings(document)):
        context.search(inner, f"{path}.data(json string {index})")


def _strings(document: object) -> Iterator[str]:
    """Every string of a JSON document, keys included."""
    if isinstance(document, str):
        yield document
    elif isinstance(document, dict):
        for key, value in document.items():
            yield key
            yield from _strings(value)
    elif isinstance(document, list):
        for item in document:
            yield from _strings(item)

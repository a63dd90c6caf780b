"""How a VM identity becomes GCE names, labels and request ids.

GCE is stricter than the contract's `gpuprov-<vm>`: resource names are RFC 1035 (`[a-z]`, then
`[-a-z0-9]`, at most 63 characters, ending alphanumeric) and label values are at most 63 of
`[a-z0-9_-]`. A VM identity that does not fit is shortened and given an 8-hex digest of the
whole identity, so two identities never share a name. The full identity also rides in the
instance metadata (`gpuprov-vm`), which is how `observe_region` maps a shortened label back.

Request ids are UUIDs derived from (project, zone, resource name, action): a retried insert or
delete repeats its id, so Compute Engine ignores the repeat instead of acting twice.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from providers.base import VM_LABEL_PREFIX

MAX_NAME = 63
VM_LABEL_KEY = "gpuprov_vm"  # label key holding the (fitted) VM identity
JOB_LABEL_KEY = "gpuprov_job"
VM_METADATA_KEY = "gpuprov-vm"  # metadata key holding the full VM identity
_REQUEST_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/gpuprov/gce/request-id")

_NAME_OK = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_OK = re.compile(r"[a-z0-9_-]{0,63}")
_LABEL_KEY_OK = re.compile(r"[a-z][a-z0-9_-]{0,62}")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _fit(prefix: str, vm: str, suffix: str, valid: re.Pattern[str], invalid: str) -> str:
    """`prefix + vm + suffix` when that is valid, else a cleaned, shortened vm with a digest."""
    whole = f"{prefix}{vm}{suffix}"
    if len(whole) <= MAX_NAME and valid.fullmatch(whole):
        return whole
    cleaned = re.sub(invalid, "-", vm.lower())
    room = MAX_NAME - len(prefix) - len(suffix) - 9  # "-" + 8 hex
    stem = cleaned[:room].strip("-_")
    return f"{prefix}{stem}-{_digest(vm)}{suffix}" if stem else f"{prefix}{_digest(vm)}{suffix}"


def vm_label_value(vm: str) -> str:
    """The value of the `gpuprov_vm` label: the identity itself when it is a valid value."""
    return _fit("", vm, "", _LABEL_OK, r"[^a-z0-9_-]")


def instance_name(vm: str) -> str:
    """`gpuprov-<vm>`, fitted to GCE's resource-name rules."""
    return _fit(VM_LABEL_PREFIX, vm, "", _NAME_OK, r"[^a-z0-9-]")


def network_tag(vm: str) -> str:
    """The network tag the VM carries and its firewall rule targets (same rules as names)."""
    return instance_name(vm)


def firewall_name(vm: str) -> str:
    """The per-VM firewall rule: `gpuprov-<vm>-ssh`, fitted."""
    return _fit(VM_LABEL_PREFIX, vm, "-ssh", _NAME_OK, r"[^a-z0-9-]")


def ports_firewall_name(vm: str) -> str:
    """The per-VM firewall rule for the job's ports: `gpuprov-<vm>-ports`, fitted."""
    return _fit(VM_LABEL_PREFIX, vm, "-ports", _NAME_OK, r"[^a-z0-9-]")


def request_id(project: str, zone: str, name: str, action: str, after: str | None = None) -> str:
    """A UUID fixed by what the call does, so a retry of the same call repeats it. `after`
    (the name of an operation that failed with this id) starts the next id in the chain: a
    call whose earlier attempt failed for good must not be answered with that old failure."""
    key = f"{project}/{zone}/{name}/{action}" + (f"/after/{after}" if after else "")
    return str(uuid.uuid5(_REQUEST_NAMESPACE, key))


def instance_id(zone: str, name: str) -> str:
    """The id gpuprov keeps for an instance: `<zone>/<name>` (delete needs both)."""
    return f"{zone}/{name}"


def split_instance_id(value: str) -> tuple[str, str] | None:
    """`<zone>/<name>` -> (zone, name); None for anything else (an unknown id is success)."""
    zone, _, name = value.partition("/")
    if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-[a-z]", zone) or not _NAME_OK.fullmatch(name):
        return None
    return zone, name


def user_labels(labels: dict[str, str], vm: str, job: str) -> dict[str, str]:
    """The instance's labels: the identity, the job, and the spec's own labels where they are
    valid GCE labels (keys and values lowercased, invalid characters replaced)."""
    result: dict[str, str] = {}
    for key, value in labels.items():
        clean_key = re.sub(r"[^a-z0-9_-]", "_", key.lower())[:63]
        clean_value = re.sub(r"[^a-z0-9_-]", "_", value.lower())[:63]
        if _LABEL_KEY_OK.fullmatch(clean_key):
            result[clean_key] = clean_value
        if len(result) >= 60:  # GCE allows 64 labels; ours come next
            break
    result[JOB_LABEL_KEY] = vm_label_value(job)
    result[VM_LABEL_KEY] = vm_label_value(vm)
    return result

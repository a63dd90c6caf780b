"""The per-VM firewall rules prepare makes, listed back by identity for the reconciler.

`GET global/firewalls?filter=name eq "gpuprov-.*"` (paginated; the filter's `eq` takes an RE2
expression matched against the whole name). Firewall rules are global resources of the project,
so the answer is the same whatever region it is asked for. A rule is mapped back to its VM only
where the VM's own rule names (identity.py) give exactly its name: from the name itself, or,
where a long identity was shortened with a digest, from the description prepare wrote, which
holds the whole identity. So every VM listed is one whose cleanup deletes that rule, and a rule
of anyone else's that merely starts with `gpuprov-` is never listed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from providers.base import VM_LABEL_PREFIX
from providers.gce.client import GceClient
from providers.gce.identity import firewall_name, ports_firewall_name
from providers.gce.parse import Name, Text, read

SSH_DESCRIPTION = "gpuprov: SSH to "  # + the VM identity
PORTS_DESCRIPTION = "gpuprov: the job's ports on "  # + the VM identity
NAME_FILTER = f'name eq "{VM_LABEL_PREFIX}.*"'


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # only what the mapping uses


class Firewall(_Read):
    name: Name
    description: Text | None = None


class FirewallList(_Read):
    items: list[Firewall] = Field(default_factory=list, max_length=5000)
    nextPageToken: Annotated[str, Field(max_length=4096)] | None = None


async def side_resources(client: GceClient) -> dict[str, list[str]]:
    """Every per-VM firewall rule of the project, by VM: "firewall <name>"."""
    action = "list firewalls"
    url = client.url("global/firewalls")
    by_vm: dict[str, list[str]] = {}
    async for page in client.pages(url, action, {"filter": NAME_FILTER, "maxResults": 500}):
        for rule in read(FirewallList, page, action).items:
            vm = vm_of(rule)
            if vm is not None:
                by_vm.setdefault(vm, []).append(f"firewall {rule.name}")
    return by_vm


def vm_of(rule: Firewall) -> str | None:
    """The VM whose own rule this is, or None. The description first: a shortened name is
    also a valid name for its own stem, but only the description holds the whole identity,
    which is what ownership is judged by."""
    guesses: list[str] = []
    for prefix in (SSH_DESCRIPTION, PORTS_DESCRIPTION):
        if rule.description and rule.description.startswith(prefix):
            guesses.append(rule.description[len(prefix) :])
    for suffix in ("-ssh", "-ports"):
        if rule.name.startswith(VM_LABEL_PREFIX) and rule.name.endswith(suffix):
            guesses.append(rule.name[len(VM_LABEL_PREFIX) : -len(suffix)])
    for vm in guesses:
        if vm and rule.name in (firewall_name(vm), ports_firewall_name(vm)):
            return vm
    return None

"""The VM's own firewall ruleset: how a job's `ports` are opened on Lambda Cloud.

- prepare: `GET /firewall-rulesets`, then, unless the VM's ruleset is already there (an earlier
  try made it), `POST /firewall-rulesets {name: gpuprov-<vm>, region, rules}` with one tcp rule
  per port range and source network (`ports_source_networks`). Launch then names it in
  `firewall_rulesets: [{id}]`.
- cleanup: `GET /firewall-rulesets`, then `DELETE /firewall-rulesets/{id}` for the rulesets
  named `gpuprov-<vm>` only; gone is success, "in use" (the instance still terminating) is
  retried.

The ruleset holds the job's ports only. SSH (22) and ICMP stay as the account's global ruleset
says (Lambda opens them by default): a per-VM rule for 22 from anywhere would widen an account
that narrowed SSH. Rulesets are regional; the name carries the VM identity, so nothing else is
ever deleted.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import quote

from providers.base import InstanceSpec, port_ranges
from providers.errors import ErrorKind, ProviderError

from . import parse
from .client import LambdaClient
from .errors import Gone, Op

MAX_DESCRIPTION = 128  # Lambda's limit on a rule's description


def rules(spec: InstanceSpec, sources: list[str]) -> list[dict[str, Any]]:
    """One tcp rule per (port range, source network)."""
    return [
        {
            "protocol": "tcp",
            "port_range": [first, last],
            "source_network": source,
            "description": f"gpuprov {spec.vm}: job port {first}-{last}"[:MAX_DESCRIPTION],
        }
        for first, last in port_ranges(spec.ports)
        for source in sources
    ]


async def ensure(client: LambdaClient, spec: InstanceSpec, region: str, sources: list[str]) -> str:
    """The id of the VM's ruleset in `region`, made if it is not there yet. Idempotent: an
    earlier try's ruleset is found by name and region; a create whose answer was lost is
    settled by listing again."""
    name = parse.instance_name(spec.vm)
    if (found := await _find(client, name, region)) is not None:
        return found
    body = {"name": name, "region": region, "rules": rules(spec, sources)}
    try:
        return parse.created_ruleset_id(
            await client.post(Op.ADD_RULESET, "/firewall-rulesets", body)
        )
    except ProviderError as error:
        if (
            error.kind is ErrorKind.TRANSIENT
            or (found := await _find(client, name, region)) is None
        ):
            raise
        return found


async def remove(client: LambdaClient, vm: str) -> None:
    """Delete every ruleset named for the VM (one, normally); gone is success."""
    name = parse.instance_name(vm)
    listed = parse.firewall_rulesets(await client.get(Op.LIST_RULESETS, "/firewall-rulesets"))
    for ruleset in listed:
        if ruleset.name == name:
            with contextlib.suppress(Gone):
                await client.delete(
                    Op.DELETE_RULESET, f"/firewall-rulesets/{quote(ruleset.id, safe='')}"
                )


async def _find(client: LambdaClient, name: str, region: str) -> str | None:
    listed = parse.firewall_rulesets(await client.get(Op.LIST_RULESETS, "/firewall-rulesets"))
    for ruleset in listed:
        if ruleset.name == name and ruleset.region is not None and ruleset.region.name == region:
            return ruleset.id
    return None

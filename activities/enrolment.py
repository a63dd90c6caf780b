"""Enrolment of a node inside the create activity: the VM row first, then its join token.

The row is written before the cloud is asked for anything, so a crash can never lose track of
a machine. The token is minted here, stored only as its SHA-256, and travels to the node inside
InstanceSpec.bootstrap (excluded from serialisation): it never enters an activity result, a
workflow input or any other part of Temporal history.
"""

from __future__ import annotations

from datetime import timedelta

from gpuprov.store.records import Records
from providers.base import Billing, InstanceSpec, NodeBootstrap, Offer


class Enrolment:
    def __init__(
        self, records: Records, api_url: str, token_ttl: timedelta, api_ca_pem: str | None = None
    ) -> None:
        self._records = records
        self._api_url = api_url
        self._token_ttl = token_ttl
        self._api_ca_pem = api_ca_pem  # the CA nodes pin for the API, if it has a private one

    def record_and_mint(
        self, offer: Offer, spec: InstanceSpec, billing: Billing | None = None
    ) -> InstanceSpec:
        """Record the VM row (idempotent) with the offer's quote and the cloud's billing terms,
        and return the spec carrying a fresh join token."""
        self._records.record_vm(
            job=spec.job,
            node_index=spec.node_index,
            attempt=spec.attempt,
            vm=spec.vm,
            provider=offer.provider,
            region=offer.region,
            zone=offer.zone,
            instance_type=offer.instance_type,
            price=offer.price,
            billing=billing,
        )
        token = self._records.mint_token(vm=spec.vm, ttl=self._token_ttl)
        bootstrap = NodeBootstrap(api_url=self._api_url, join_token=token, ca_pem=self._api_ca_pem)
        return spec.model_copy(update={"bootstrap": bootstrap})

    def created(self, vm: str, instance_ids: list[str]) -> None:
        """The cloud accepted the create (or an observe adopted what it made): launched now."""
        self._records.set_vm_instances(vm, instance_ids, "created")

    def terminated(self, vm: str, seen_ids: list[str] | None = None) -> None:
        """Confirmed gone: the row says so, its actual cost is recorded and the node's worker is
        revoked. `seen_ids`: the instances teardown deleted."""
        self._records.vm_terminated(vm, seen_ids or ())

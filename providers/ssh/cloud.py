"""Machines you own (provider id `ssh`): a pool of hosts from `[providers.ssh]`, claimed per VM.

There is no cloud API: the "account" is the host list, the claims database
(providers/ssh/claims.py) says who holds which host, and SSH (providers/ssh/remote.py) is the
only call made to a machine. Primitive -> what happens:

- plan: one offer per host that nobody holds (`ssh/<region>/<name>`), cheapest first; the price
  is the configured one (source "config"), none when unset. No network call.
- prepare: nothing to make; an offer naming a host no longer configured is Unavailable. A
  job's `ports` need no opening here: the machines are yours, reachable as your own network
  and firewall allow (gpuprov changes neither). A job's `image` cannot be honoured (the
  machine runs what it has): Capabilities.unsupported says so, and the core never offers
  these hosts to a job naming one.
- create: claim the host for the VM (one INSERT; the first wins). Held by another VM: Capacity
  (the offer is blocked for a while and the job moves on). Held by this VM already: the same
  claim again (a retry). Returns `[<host name>]`; the VM identity is the claim's `vm`.
- observe: for each host the VM holds, an SSH handshake (no login): the host key it proves it
  holds must be the configured one (or match the configured fingerprint, or the key pinned on
  first contact). Reachable and trusted: Running, with an SshEndpoint carrying the fingerprint;
  unreachable, or a host key that does not match: Failed with the reason.
- observe_region: the same for every claim of the region (one database query, then the
  handshakes concurrently).
- sweep_regions: the configured regions.
- delete: drop the VM's claims on the given hosts; the hosts are offered again.
- cleanup: log in to every host the VM held and observe found reachable meanwhile (claim log),
  with the host's `key_path` and only its trusted host key, and remove what the node agent
  installed ("$HOME/.gpuprov/<vm>/"), stopping the agent if it still runs. Unreachable: Failed
  (the job records a possible orphan and moves on; the reconciler cleans up again later).
- observe_side_resources: the contract's default, None: what the agent installed is seen only by
  logging in to each host, so the reconciler never lists it; an orphan record or a VM row
  whose cleanup failed brings a VM back to cleanup instead.
- ssh_client_key_path (for activities/bootstrap.py): the key of the host the VM holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncssh
from sqlalchemy.exc import DBAPIError

from providers.base import (
    Billing,
    Capabilities,
    CloudProvider,
    InstanceSpec,
    InstanceStatus,
    Location,
    Observed,
    Offer,
    ResourceRequest,
    SshEndpoint,
    price_quote,
)
from providers.errors import ErrorKind, ProviderError
from providers.settings import MissingCredentials, capabilities_from
from providers.ssh import remote
from providers.ssh.claims import ClaimStore
from providers.ssh.config import SshConfig, SshHost
from providers.ssh_common import describe_error, public_line

# The price is the owner's own accounting for the machine, with no billing increment: an
# actual cost counts exact seconds and says so.
BILLING = Billing()
PROVIDER_ID = "ssh"
PRICE_SOURCE = "config"
MAX_CONCURRENT_CHECKS = 16

log = logging.getLogger(__name__)
T = TypeVar("T")


class SshMachines(CloudProvider):
    name = PROVIDER_ID

    def __init__(self, config: SshConfig, claims: ClaimStore | None = None) -> None:
        if not config.hosts:
            raise MissingCredentials(
                "no machines listed: add [[providers.ssh.hosts]] entries (name, host, user, "
                "key_path)"
            )
        for host in config.hosts:
            path = os.path.expanduser(host.key_path)
            if not os.access(path, os.R_OK):
                raise MissingCredentials(f"host {host.name}: cannot read key_path {path}")
        self.config = config
        self._hosts = {host.name: host for host in config.hosts}
        self._claims = claims or ClaimStore(config.claims_url)
        self._client_keys: dict[str, asyncssh.SSHKey] = {}
        self._checks = asyncio.Semaphore(MAX_CONCURRENT_CHECKS)
        self._reached: set[tuple[str, str]] = set()  # (vm, host) already marked reached

    def capabilities(self) -> Capabilities:
        # node_agent: the core sets it, with ssh_bootstrap, when it runs activities/bootstrap.py.
        # image: a machine you own runs the system it has; nothing here can boot another.
        return capabilities_from(
            self.config, unsupported=["spot", "user_data", "image"], billing=BILLING
        )

    async def aclose(self) -> None:
        self._claims.close()

    def secrets(self) -> list[str]:
        return self.config.secret_values()

    # ------------------------------------------------------------------ primitives

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        held = await self._db(self._claims.held)
        now = datetime.now(UTC)
        offers = [_offer(host, now) for host in self.config.hosts if host.name not in held]
        return sorted(offers, key=_offer_order)

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        self._host_of(offer)
        return {}

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        """Claim the offer's host, or, when another VM holds it, one of its equals: every node
        of a multi-node attempt gets the same offer, and the pool serves them host by host."""
        host = self._host_of(offer)
        already = await self._db(self._claims.held_in, host.region, spec.vm)
        if already.get(spec.vm):  # a retried create: this VM holds its host already
            return already[spec.vm][:1]
        holders = []
        for candidate in [host, *self._equals_of(host)]:
            holder = await self._db(self._claims.claim, candidate.name, spec.vm, candidate.region)
            if holder == spec.vm:
                return [candidate.name]
            holders.append(f"{candidate.name} by {holder}")
        raise ProviderError(ErrorKind.CAPACITY, f"every equal host is held: {', '.join(holders)}")

    def _equals_of(self, host: SshHost) -> list[SshHost]:
        """Other hosts that can stand in for `host`: same region, GPU model and count, no dearer
        (a host without a price stands in only for another without one)."""

        def no_dearer(other: SshHost) -> bool:
            if host.price is None or other.price is None:
                return host.price is None and other.price is None
            return other.price <= host.price and other.currency == host.currency

        equals = [
            other
            for other in self.config.hosts
            if other.name != host.name
            and other.region == host.region
            and (other.gpu or "").lower() == (host.gpu or "").lower()
            and other.gpu_count == host.gpu_count
            and no_dearer(other)
        ]
        return sorted(equals, key=lambda other: (other.price or 0.0, other.name))

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        held = await self._db(self._claims.held_in, location.region, vm)
        return await self._check_all(vm, held.get(vm, []))

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        held = await self._db(self._claims.held_in, location.region)
        checks = await asyncio.gather(*(self._check_all(vm, hosts) for vm, hosts in held.items()))
        return dict(zip(held, checks, strict=True))

    def sweep_regions(self) -> list[str]:
        return sorted({host.region for host in self.config.hosts})

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        freed = await self._db(self._claims.release, vm, location.region, list(ids))
        if freed:
            log.info("released %s from %s", ", ".join(freed), vm)

    async def cleanup(self, location: Location, vm: str) -> None:
        # A host never reachable while the VM held it never got the agent: nothing to remove.
        used = await self._db(self._claims.hosts_used_by, vm, location.region, reached_only=True)
        for name in used:
            host = self._hosts.get(name)
            if host is None:
                log.warning("cleanup of %s: host %s is no longer configured; skipped", vm, name)
                continue
            await self._clean(host, vm)

    # ------------------------------------------------------------------ for bootstrap

    def ssh_client_key_path(self, vm: str) -> str | None:
        """The private key that logs in to the host `vm` holds (activities/bootstrap.py)."""
        for name, holder in self._claims.held().items():
            if holder == vm and name in self._hosts:
                return os.path.expanduser(self._hosts[name].key_path)
        return None

    # ------------------------------------------------------------------ internals

    async def _db(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A claims-database call off the event loop; the database being down or locked is
        Transient (Temporal retries the step), never an unclassified crash."""
        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except DBAPIError as error:
            raise ProviderError(
                ErrorKind.TRANSIENT, f"claims database: {type(error.orig).__name__}"
            ) from None

    def _host_of(self, offer: Offer) -> SshHost:
        name = offer.detail.get("host")
        host = self._hosts.get(name) if isinstance(name, str) else None
        if host is None:
            raise ProviderError(
                ErrorKind.UNAVAILABLE, f"host {name!r} is not in [providers.ssh] any more"
            )
        return host

    async def _check_all(self, vm: str, names: list[str]) -> list[Observed]:
        return list(await asyncio.gather(*(self._check(vm, name) for name in names)))

    async def _check(self, vm: str, name: str) -> Observed:
        """Reachability and host-key trust of one host `vm` holds, as an Observed."""
        host = self._hosts.get(name)
        if host is None:
            return Observed(id=name, status=InstanceStatus.FAILED, message="no longer configured")
        try:
            checked = await self._verified_key(host)
        except ProviderError as error:
            return Observed(id=name, status=InstanceStatus.FAILED, message=error.message)
        if (vm, name) not in self._reached:
            await self._db(self._claims.mark_reached, vm, name)
            self._reached.add((vm, name))
        endpoint = SshEndpoint(
            host=host.host, port=host.port, user=host.user, host_key_fingerprint=checked.fingerprint
        )
        return Observed(id=name, status=InstanceStatus.RUNNING, ssh=endpoint)

    async def _verified_key(self, host: SshHost) -> remote.HostKeyCheck:
        """The host key `host` presents, once trusted (pinned on first contact when nothing is
        configured). Unreachable: Transient; not trusted: Failed."""
        where = remote.address(host)
        pinned = await self._db(self._claims.pinned_key, where)
        async with self._checks:
            try:
                presented = await remote.presented_host_key(
                    host, self.config.connect_timeout, remote.expected_key(host, pinned)
                )
            except (OSError, TimeoutError, asyncssh.Error) as error:
                raise ProviderError(
                    ErrorKind.TRANSIENT, f"{where} unreachable: {describe_error(error)}"
                ) from None
        problem = remote.judge(host, presented, pinned)
        unconfigured = host.host_key is None and host.host_key_fingerprint is None
        if unconfigured and pinned is None:  # first contact: pin it (a racing pin wins)
            recorded = await self._db(self._claims.pin, where, public_line(presented))
            problem = remote.judge(host, presented, recorded)
        if problem is not None:
            raise ProviderError(ErrorKind.FAILED, f"{where}: {problem}")
        return remote.HostKeyCheck(presented)

    async def _clean(self, host: SshHost, vm: str) -> None:
        """Failed, not Transient, when the host cannot be reached: Temporal's retries would hold
        the job's failover for minutes; a failed cleanup is recorded as a possible orphan and
        the reconciler cleans up again later."""
        try:
            checked = await self._verified_key(host)
        except ProviderError as error:
            raise ProviderError(ErrorKind.FAILED, f"cleanup of {vm}: {error.message}") from None
        client_key = await self._client_key(host)
        try:
            result = await remote.run_trusted(
                host, checked.key, client_key, remote.cleanup_command(vm), remote.CLEANUP_TIMEOUT
            )
        except asyncssh.PermissionDenied:
            raise ProviderError(
                ErrorKind.CREDENTIALS, f"{host.name}: {host.user} refused our key"
            ) from None
        except (OSError, TimeoutError, asyncssh.Error) as error:
            raise ProviderError(
                ErrorKind.FAILED, f"cleanup of {vm} on {host.name}: {describe_error(error)}"
            ) from None
        if result.exit_status != 0:
            raise ProviderError(
                ErrorKind.FAILED,
                f"cleanup of {vm} on {host.name} exited {result.exit_status}: "
                f"{str(result.stderr or '').strip()[-300:]}",
            )

    async def _client_key(self, host: SshHost) -> asyncssh.SSHKey:
        key = self._client_keys.get(host.name)
        if key is None:
            path = os.path.expanduser(host.key_path)
            try:
                key = await asyncio.to_thread(asyncssh.read_private_key, path)
            except (OSError, asyncssh.KeyImportError, ValueError) as error:
                reason = error.strerror if isinstance(error, OSError) else type(error).__name__
                raise ProviderError(
                    ErrorKind.CREDENTIALS, f"{host.name}: cannot use key_path {path}: {reason}"
                ) from None
            self._client_keys[host.name] = key
        return key


def _offer(host: SshHost, now: datetime) -> Offer:
    price = price_quote(host.price, currency=host.currency, source=PRICE_SOURCE, observed_at=now)
    return Offer(
        id=f"{PROVIDER_ID}/{host.region}/{host.name}",
        provider=PROVIDER_ID,
        region=host.region,
        instance_type=host.name,
        gpu_name=host.gpu,
        gpu_count=host.gpu_count,
        gpu_memory_gb=host.gpu_memory_gb,
        vcpus=host.vcpus,
        memory_gb=host.memory_gb,
        disk_gb=host.disk_gb,
        price=price,
        detail={"host": host.name, "labels": dict(host.labels)},
    )


def _offer_order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)

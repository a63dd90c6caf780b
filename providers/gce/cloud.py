"""Google Compute Engine (provider id `gce`): the provider contract over Compute Engine REST v1.

Paths below are relative to `https://compute.googleapis.com/compute/v1/projects/<project>`.

- plan: `GET aggregated/machineTypes?filter=...` and `GET aggregated/acceleratorTypes?filter=...`
  (both paginated); prices from the Cloud Billing Catalog,
  `GET cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus` (cached; see pricing.py).
- prepare: `POST global/firewalls?requestId=` (tcp:22 from `ssh_source_ranges` to the VM's
  network tag), and a second rule `gpuprov-<vm>-ports` (the spec's ports, as ranges, from
  `ports_source_ranges`) when the spec names any; 409 `alreadyExists` = done.
- create: `POST zones/<z>/instances?requestId=` (instance_body.py: the boot disk from the spec's
  image or image family, or `sourceMachineImage` for a machine image), then
  `POST zones/<z>/operations/<op>/wait` until DONE, at most `operation_timeout` s: stockouts
  and quota arrive through the operation.
  `alreadyExists` = adopt the instance an earlier attempt made.
- observe: `GET zones/<z>/instances?filter=labels.gpuprov_vm = "<vm>"` (paginated).
- observe_region: `GET aggregated/instances?filter=labels.gpuprov_vm:*` (paginated), keeping
  the region's zones; a zone of the region that is `unreachables` or warned UNREACHABLE makes
  the answer Transient.
- delete: `DELETE zones/<z>/instances/<name>?requestId=` per id; 404 `notFound` = gone.
- cleanup: `DELETE global/firewalls/gpuprov-<vm>-ssh?requestId=`, the same for
  `gpuprov-<vm>-ports`; 404 = gone.
- observe_side_resources: `GET global/firewalls?filter=name eq "gpuprov-.*"` (paginated), the
  rules that are a VM's own by name (firewalls.py). Global: the same answer for every region.
- diagnose: observe, `GET zones/<z>/instances/<name>` (upcomingMaintenance) and
  `GET zones/<z>/operations?filter=targetLink = "..."` (preempted, hostError, ...).

Identity: instance name `gpuprov-<vm>`, label `gpuprov_vm=<vm>`, network tag `gpuprov-<vm>`, all
fitted to GCE's rules (identity.py). Request ids are UUIDs derived from the VM, the zone and the
action, so a retried create or delete repeats its id and Compute Engine does not act twice; an id
whose operation failed with a retryable error is followed by the next id in its chain.
Instance ids kept by gpuprov are `<zone>/<name>`.
"""

from __future__ import annotations

from typing import Any

import httpx

from providers.base import (
    Billing,
    Capabilities,
    CloudProvider,
    Diagnosis,
    InstanceSpec,
    Location,
    Observed,
    Offer,
    ResourceRequest,
    port_ranges,
)
from providers.errors import ErrorKind, ProviderError
from providers.gce import diagnosis, firewalls
from providers.gce.auth import GoogleTokens, TokenProvider, load_credentials
from providers.gce.client import GceClient
from providers.gce.config import GceConfig, region_of
from providers.gce.errors import GceApiError, of_our_own
from providers.gce.identity import (
    VM_LABEL_KEY,
    firewall_name,
    instance_id,
    instance_name,
    network_tag,
    ports_firewall_name,
    request_id,
    split_instance_id,
    vm_label_value,
)
from providers.gce.instance_body import instance_body
from providers.gce.offers import PROVIDER_ID, accelerator_types, build_offers, machine_types
from providers.gce.parse import (
    Instance,
    InstanceAggregatedList,
    InstanceList,
    Operation,
    OperationList,
    by_vm,
    observed,
    read,
)
from providers.gce.pricing import PriceBook
from providers.settings import capabilities_from

# "All vCPUs, GPUs, and GB of memory are charged a minimum of 1 minute ... After 1 minute,
# instances are charged in 1 second increments."
BILLING = Billing(
    granularity_seconds=1,
    minimum_seconds=60,
    source="https://cloud.google.com/compute/vm-instance-pricing",
)
SSH_PORT = 22
CHAIN = 3  # request ids tried per call when earlier ones ended in a retryable failure
EVENTS_LISTED = 50


class GceCloud(CloudProvider):
    name = PROVIDER_ID

    def __init__(
        self,
        config: GceConfig,
        *,
        tokens: TokenProvider | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """The registry passes only `config`: credentials come from `credentials_file` or ADC
        (MissingCredentials when neither). Tests pass `tokens` (and `config.base_url`)."""
        if tokens is None:
            credentials, _ = load_credentials(config.credentials_file)
            tokens = GoogleTokens(credentials, config.request_timeout)
        self.config = config
        self.client = GceClient(
            config.project, tokens, config.base_url, config.request_timeout, http
        )
        self.prices = PriceBook(self.client, config.billing_base_url, config.price_cache_seconds)

    def capabilities(self) -> Capabilities:
        # node_agent: the user data installs the agent as a systemd service (providers/userdata.py).
        return capabilities_from(self.config, node_agent=True, cloud_init=True, billing=BILLING)

    async def aclose(self) -> None:
        await self.client.aclose()

    def secrets(self) -> list[str]:
        return [*self.config.secret_values(), *self.client.secrets()]

    def sweep_regions(self) -> list[str]:
        return self.config.regions

    # ------------------------------------------------------------------ primitives

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        catalogue = self.config.machine_types
        types = await machine_types(self.client, {e.machine_type for e in catalogue})
        wanted = {e.accelerator_type for e in catalogue if e.accelerator_type}
        wanted |= {a.guestAcceleratorType for m in types for a in m.accelerators}
        accelerators = await accelerator_types(self.client, wanted)
        components = [c for e in catalogue for c in [*e.price_skus, *e.spot_price_skus]]
        await self.prices.refresh({sku for c in components for sku in c.skus})
        return build_offers(self.config, types, accelerators, self.prices)

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        _zone_and_type(offer)
        tag = network_tag(spec.vm)
        ssh = await self._firewall(
            firewall_name(spec.vm),
            f"{firewalls.SSH_DESCRIPTION}{spec.vm}",
            ["22"],
            [tag],
            self.config.ssh_source_ranges,
        )
        prepared: dict[str, Any] = {"firewall": ssh, "network_tag": tag}
        # The job's ports in a rule of their own (22 stays SSH's, open to ssh_source_ranges).
        ranges = port_ranges([port for port in spec.ports if port != SSH_PORT])
        if ranges:
            prepared["ports_firewall"] = await self._firewall(
                ports_firewall_name(spec.vm),
                f"{firewalls.PORTS_DESCRIPTION}{spec.vm}",
                [str(first) if first == last else f"{first}-{last}" for first, last in ranges],
                [tag],
                self.config.ports_source_ranges,
            )
        return prepared

    async def _firewall(
        self, name: str, description: str, ports: list[str], tags: list[str], sources: list[str]
    ) -> str:
        """An INGRESS rule allowing tcp `ports` from `sources` to the VMs tagged `tags`;
        409 `alreadyExists` (an earlier prepare made it) is done."""
        body = {
            "name": name,
            "description": description,
            "network": self.config.network,
            "direction": "INGRESS",
            "priority": 1000,
            "allowed": [{"IPProtocol": "tcp", "ports": ports}],
            "sourceRanges": sources,
            "targetTags": tags,
        }
        action = f"create firewall {name}"
        try:
            operation = await self._mutate("POST", "global/firewalls", action, "global", name, body)
        except GceApiError as error:
            if not error.exists:
                raise
            return name
        _raise_unless_ok(operation, action, tolerate_exists=True)
        return name

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        zone, _ = _zone_and_type(offer)
        name = instance_name(spec.vm)
        created = [instance_id(zone, name)]
        action = f"insert {name} in {zone}"
        body = instance_body(self.config, offer, prepared, spec, name)
        try:
            path = f"zones/{zone}/instances"
            operation = await self._mutate("POST", path, action, zone, name, body)
            operation = await self.client.wait_operation(
                zone,
                operation,
                action,
                self.config.operation_timeout,
                self.config.operation_poll_interval,
            )
            _raise_unless_ok(operation, action, tolerate_exists=True)
        except GceApiError as error:
            if error.exists:  # an earlier attempt made it: adopt, never a second machine
                return created
            raise
        # DONE without error, or still running after operation_timeout: the core observes.
        return created

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        label = vm_label_value(vm)
        query = f'labels.{VM_LABEL_KEY} = "{label}"'
        if location.zone:
            instances = await self._zone_instances(location.zone, query)
        else:
            instances = await self._region_instances(location.region, query)
        mine = [i for i in instances if i.labels.get(VM_LABEL_KEY) == label]
        return [self._observed(i) for i in mine]

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        instances = await self._region_instances(location.region, f"labels.{VM_LABEL_KEY}:*")
        return by_vm(instances, self.config.ssh_user, self.config.external_ip)

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        own = instance_name(vm)
        for value in ids:
            parts = split_instance_id(value)
            if parts is None or parts[1] != own:
                continue  # not an id this adapter made for this VM: never delete it
            zone, name = parts
            action = f"delete {name} in {zone}"
            try:
                path = f"zones/{zone}/instances/{name}"
                operation = await self._mutate("DELETE", path, action, zone, name, None)
                _raise_unless_ok(operation, action, tolerate_gone=True)
            except GceApiError as error:
                if not error.gone:
                    raise of_our_own(error) from None

    async def cleanup(self, location: Location, vm: str) -> None:
        """Both per-VM rules, whether prepare made the ports one or not: 404 is gone."""
        for name in (firewall_name(vm), ports_firewall_name(vm)):
            action = f"delete firewall {name}"
            try:
                path = f"global/firewalls/{name}"
                operation = await self._mutate("DELETE", path, action, "global", name, None)
                _raise_unless_ok(operation, action, tolerate_gone=True)
            except GceApiError as error:
                if not error.gone:
                    raise of_our_own(error) from None

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]]:
        return await firewalls.side_resources(self.client)

    async def diagnose(
        self, location: Location, vm: str, instance_id: str | None = None
    ) -> Diagnosis:
        base = await super().diagnose(location, vm, instance_id)
        where = split_instance_id(base.instance.id) if base.instance else None
        if where is None and location.zone:
            where = (location.zone, instance_name(vm))
        if where is None:
            return base
        zone, name = where
        findings = list(base.findings)
        instance = None
        if base.instance is not None:
            instance = await self._get_instance(zone, name)
            if instance and instance.resourceStatus:
                maintenance = instance.resourceStatus.upcomingMaintenance
                if found := diagnosis.maintenance_finding(maintenance):
                    findings.append(found)
        link = instance.selfLink if instance and instance.selfLink else self._link(zone, name)
        findings.extend(diagnosis.event_findings(await self._events(zone, link), instance))
        return Diagnosis(instance=base.instance, findings=findings)

    # ------------------------------------------------------------------ internals

    async def _mutate(
        self, method: str, path: str, action: str, zone: str, name: str, body: Any
    ) -> Operation:
        """One insert/delete with its derived request id. A DONE operation that failed with a
        retryable error under that id (a replayed earlier failure) moves on to the next id."""
        after: str | None = None
        failure: ProviderError | None = None
        for _ in range(CHAIN):
            verb = "insert" if method == "POST" else "delete"
            params = {"requestId": request_id(self.client.project, zone, name, verb, after)}
            data = await self.client.call(
                method, self.client.url(path), action, params=params, body=body, writes=True
            )
            operation = read(Operation, data, action)
            failure = operation.failure(action)
            if failure is None or failure.kind is not ErrorKind.TRANSIENT:
                return operation
            after = operation.name
        assert failure is not None
        raise failure

    async def _zone_instances(self, zone: str, query: str) -> list[Instance]:
        action = f"list instances in {zone}"
        url = self.client.url(f"zones/{zone}/instances")
        found: list[Instance] = []
        try:
            async for page in self.client.pages(url, action, {"filter": query, "maxResults": 500}):
                found.extend(read(InstanceList, page, action).items)
        except GceApiError as error:  # our own zone and filter: never an abort
            raise of_our_own(error) from None
        return found

    async def _region_instances(self, region: str, query: str) -> list[Instance]:
        action = f"list instances in {region}"
        url = self.client.url("aggregated/instances")
        params = {"filter": query, "maxResults": 500}
        found: list[Instance] = []
        try:
            async for page in self.client.pages(url, action, params):
                found.extend(_in_region(read(InstanceAggregatedList, page, action), region, action))
        except GceApiError as error:
            raise of_our_own(error) from None
        return found

    async def _get_instance(self, zone: str, name: str) -> Instance | None:
        action = f"get {name} in {zone}"
        try:
            data = await self.client.call(
                "GET", self.client.url(f"zones/{zone}/instances/{name}"), action
            )
        except GceApiError as error:
            if error.gone:
                return None
            raise
        return read(Instance, data, action)

    async def _events(self, zone: str, link: str) -> list[Operation]:
        action = f"list operations in {zone}"
        params = {
            "filter": f'targetLink = "{link}"',
            "orderBy": "creationTimestamp desc",
            "maxResults": EVENTS_LISTED,
        }
        data = await self.client.call(
            "GET", self.client.url(f"zones/{zone}/operations"), action, params=params
        )
        return list(read(OperationList, data, action).items)

    def _link(self, zone: str, name: str) -> str:
        """The selfLink Compute Engine gives an instance (its canonical URL)."""
        return (
            "https://www.googleapis.com/compute/v1/projects/"
            f"{self.client.project}/zones/{zone}/instances/{name}"
        )

    def _observed(self, instance: Instance) -> Observed:
        return observed(instance, self.config.ssh_user, self.config.external_ip)


def _zone_and_type(offer: Offer) -> tuple[str, str]:
    machine_type = offer.detail.get("machine_type")
    if offer.provider != PROVIDER_ID or not offer.zone or not isinstance(machine_type, str):
        raise ProviderError(ErrorKind.INVALID_REQUEST, f"{offer.id} is not a GCE offer")
    return offer.zone, machine_type


def _in_region(listing: InstanceAggregatedList, region: str, action: str) -> list[Instance]:
    """The instances of one aggregated page that are in `region`."""
    # A partial answer that misses a zone of this region could make a live instance look gone
    # (and a wait for gone end early): that is no answer at all.
    if missing := [s for s in listing.unreachable_scopes if _region_of_scope(s) == region]:
        raise ProviderError(ErrorKind.TRANSIENT, f"{action}: unreachable: {', '.join(missing[:5])}")
    return [
        instance
        for scoped in listing.items.values()
        for instance in scoped.instances
        if region_of(instance.zone) == region
    ]


def _region_of_scope(scope: str) -> str | None:
    """`zones/us-central1-a` -> `us-central1`; `regions/x` -> `x`; else None."""
    kind, _, name = scope.rpartition("/")
    if kind.endswith("zones"):
        return region_of(name)
    return name if kind.endswith("regions") else None


def _raise_unless_ok(
    operation: Operation, action: str, tolerate_exists: bool = False, tolerate_gone: bool = False
) -> None:
    error = operation.failure(action)
    if error is None or (tolerate_exists and error.exists) or (tolerate_gone and error.gone):
        return
    raise error

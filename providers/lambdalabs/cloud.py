"""The Lambda Cloud adapter (provider id `lambda`), on Lambda Cloud API v1.

Primitive -> Lambda calls (base `https://cloud.lambda.ai/api/v1`, `Authorization: Bearer <key>`):
- plan: `GET /instance-types`. One offer per (instance type, region in the type's
  `regions_with_capacity_available`) within the `regions` allow-list: a type with capacity
  nowhere gives no offer. Price = `price_cents_per_hour / 100` USD per instance-hour (source
  names the API); no spot market.
- prepare: with `spec.ssh_public_key`: `GET /ssh-keys`, then `POST /ssh-keys {name, public_key}`
  registering the per-VM key `gpuprov-<vm>` unless it is already there (idempotent); without
  it, the configured `ssh_key_name` (no call). With an image asked for (spec or config):
  `GET /images` to check it exists in the offer's region. With `spec.ports`: the VM's own
  firewall ruleset `gpuprov-<vm>` in the offer's region (`GET`, then `POST /firewall-rulesets`;
  providers/lambdalabs/firewall.py). SSH (22) and ICMP stay as the account's global ruleset has
  them (open by default).
- create: `POST /instance-operations/launch` with `region_name`, `instance_type_name`, exactly
  one `ssh_key_names` entry, `name = gpuprov-<vm>`, `tags` (`gpuprov-vm = <vm>` plus the spec's
  labels), the image, the VM's firewall ruleset (`firewall_rulesets: [{id}]`), and
  `user_data` (providers/userdata.py: the spec's, and the node bootstrap; never logged).
  Launches are spaced `min_launch_interval` (12 s) apart. Launch is NOT idempotent: after an
  ambiguous answer the core's retried create observes by name/tag first and adopts.
- observe: `GET /instances` (the whole account, one call, no pagination), filtered by the
  `gpuprov-vm` tag or the `gpuprov-<vm>` name and by region; `terminated` is left out.
- observe_region: the same single `GET /instances`, grouped by VM identity.
- sweep_regions: the configured `regions` (no call).
- delete: `POST /instance-operations/terminate {instance_ids: [id]}`, ONE id per call, so one
  gone id (`global/object-does-not-exist` = success) cannot fail the others.
- cleanup: `GET /firewall-rulesets`, then `DELETE /firewall-rulesets/{id}` for the ruleset
  named `gpuprov-<vm>`; `GET /ssh-keys`, then `DELETE /ssh-keys/{id}` for the key named
  `gpuprov-<vm>` only (never the configured key or any other user key); gone is success.
- observe_side_resources: `GET /firewall-rulesets` (the region's rulesets) and `GET /ssh-keys`
  (account-wide: the same keys whatever region is asked), those named `gpuprov-<vm>` for a VM
  whose name was not shortened (a shortened name cannot be read back as a VM).
- diagnose: `GET /instances`; findings from Lambda's status (preempted, unhealthy, booting...).

Errors: providers/lambdalabs/errors.py (by Lambda's error `code`; see docs/clouds/lambda.md).
"""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from providers.base import (
    VM_LABEL_PREFIX,
    Billing,
    Capabilities,
    CloudProvider,
    Diagnosis,
    Finding,
    InstanceSpec,
    Location,
    Observed,
    Offer,
    ResourceRequest,
    Severity,
)
from providers.errors import ErrorKind, ProviderError
from providers.settings import MissingCredentials, capabilities_from
from providers.userdata import user_data

from . import firewall, parse
from .client import LambdaClient
from .config import LambdaConfig
from .errors import Gone, Op

# "ODC prices instances by hourly usage and bills in one-minute increments"; no minimum stated.
BILLING = Billing(granularity_seconds=60, source="https://docs.lambda.ai/public-cloud/billing")
MAX_PUBLIC_KEY = 4096  # Lambda's limit on an SSH public key
MAX_USER_DATA = 1_000_000  # bytes; Lambda refuses user data over 1 MB
_UUID = re.compile(
    r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
)
_TAG_KEY = re.compile(r"[a-z][a-z0-9-:]+")  # Lambda's rule for tag keys (<= 55 chars)


class Prepared(BaseModel):
    """What prepare hands to create (journaled: no secrets)."""

    model_config = ConfigDict(extra="forbid")

    ssh_key_name: str
    per_vm_key: bool = False
    image: dict[str, str] | None = None
    firewall_ruleset_id: str | None = None  # the VM's own ruleset, for the spec's ports


class LambdaCloud(CloudProvider):
    name = parse.PROVIDER_ID

    def __init__(
        self,
        config: LambdaConfig,
        *,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Built by the registry with the `[providers.lambda]` section (MissingCredentials when
        it yields no key). Tests pass `api_key` (and a `base_url` in the config, or an httpx
        `transport`), so they never read the environment or key files."""
        self.config = config
        key = api_key if api_key is not None else config.resolve_api_key(config.API_KEY_ENV)
        if not key.strip():
            raise MissingCredentials(
                f"empty Lambda API key: set {config.API_KEY_ENV}, or api_key_file or api_key"
            )
        self._client = LambdaClient(
            key.strip(),
            config.base_url,
            timeout=config.request_timeout,
            min_launch_interval=config.min_launch_interval,
            transport=transport,
        )

    def capabilities(self) -> Capabilities:
        # node_agent: the user data installs the agent as a systemd service (providers/userdata.py).
        return capabilities_from(
            self.config, unsupported=["spot"], node_agent=True, cloud_init=True, billing=BILLING
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def secrets(self) -> list[str]:
        return [*self.config.secret_values(), *self._client.secrets()]

    # ------------------------------------------------------------------ primitives

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        data = await self._client.get(Op.INSTANCE_TYPES, "/instance-types")
        return parse.offers(data, self.config.regions, datetime.now(UTC))

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        _check_offer(offer)
        image = await self._resolve_image(offer, spec)  # before any key: Unavailable leaves none
        if spec.ssh_public_key and spec.ssh_public_key.strip():
            key_name, per_vm = await self._register_vm_key(spec), True
        elif self.config.ssh_key_name:
            key_name, per_vm = self.config.ssh_key_name, False
        else:
            raise ProviderError(
                ErrorKind.INVALID_REQUEST,
                "Lambda launches need exactly one SSH key: set [providers.lambda] ssh_key_name "
                "to a key in the account, or give the VM an ssh_public_key",
            )
        ruleset = None
        if spec.ports:
            sources = self.config.ports_source_networks
            ruleset = await firewall.ensure(self._client, spec, offer.region, sources)
        return Prepared(
            ssh_key_name=key_name, per_vm_key=per_vm, image=image, firewall_ruleset_id=ruleset
        ).model_dump()

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        _check_offer(offer)
        try:
            ready = Prepared.model_validate(prepared)
        except ValidationError:
            raise ProviderError(
                ErrorKind.INVALID_REQUEST, f"unreadable prepare output for {spec.vm}"
            ) from None
        body: dict[str, Any] = {
            "region_name": offer.region,
            "instance_type_name": offer.instance_type,
            "ssh_key_names": [ready.ssh_key_name],
            "name": parse.instance_name(spec.vm),
            "tags": tags(spec),
        }
        if ready.image:
            body["image"] = ready.image
        if ready.firewall_ruleset_id:
            body["firewall_rulesets"] = [{"id": ready.firewall_ruleset_id}]
        text = user_data(spec, max_bytes=MAX_USER_DATA, cloud="Lambda")
        if text is not None:
            body["user_data"] = text
        return parse.launched_ids(await self._client.launch(body))

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        data = await self._client.get(Op.LIST_INSTANCES, "/instances")
        found = []
        for _, instance in parse.gpuprov_instances(data, Op.LIST_INSTANCES, vm):
            seen = parse.observed(instance) if instance.region.name == location.region else None
            if seen is not None:
                found.append(seen)
        return found

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        data = await self._client.get(Op.LIST_INSTANCES, "/instances")
        by_vm: dict[str, list[Observed]] = {}
        for vm, instance in parse.gpuprov_instances(data, Op.LIST_INSTANCES):
            seen = parse.observed(instance) if instance.region.name == location.region else None
            if seen is not None:
                by_vm.setdefault(vm, []).append(seen)
        return by_vm

    def sweep_regions(self) -> list[str]:
        return list(self.config.regions or [])

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        """Terminate each id in its own call; every id is tried, then the first failure (if
        any) is raised. Gone ids are success."""
        first_failure: ProviderError | None = None
        for instance_id in dict.fromkeys(ids):
            try:
                await self._client.post_only(
                    Op.TERMINATE, "/instance-operations/terminate", {"instance_ids": [instance_id]}
                )
            except Gone:
                continue
            except ProviderError as error:
                first_failure = first_failure or error
        if first_failure is not None:
            raise first_failure

    async def cleanup(self, location: Location, vm: str) -> None:
        """Delete the per-VM firewall ruleset and key `gpuprov-<vm>` where prepare made them;
        nothing else."""
        await firewall.remove(self._client, vm)
        name = parse.instance_name(vm)
        if name == self.config.ssh_key_name:
            return  # the operator's own key, whatever it is called
        keys = parse.ssh_keys(await self._client.get(Op.LIST_KEYS, "/ssh-keys"))
        for key in keys:
            if key.name == name:
                await self._delete_key(key.id)

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]]:
        rulesets = await self._client.get(Op.LIST_RULESETS, "/firewall-rulesets")
        keys = await self._client.get(Op.LIST_KEYS, "/ssh-keys")
        by_vm: dict[str, list[str]] = {}
        for ruleset in parse.firewall_rulesets(rulesets):
            region = ruleset.region.name if ruleset.region is not None else None
            if region in (None, location.region) and (vm := _vm_named(ruleset.name)):
                by_vm.setdefault(vm, []).append(f"firewall-ruleset {ruleset.id} {ruleset.name}")
        for key in parse.ssh_keys(keys):
            if key.name != self.config.ssh_key_name and (vm := _vm_named(key.name)):
                by_vm.setdefault(vm, []).append(f"ssh-key {key.name}")
        return by_vm

    async def diagnose(
        self, location: Location, vm: str, instance_id: str | None = None
    ) -> Diagnosis:
        data = await self._client.get(Op.LIST_INSTANCES, "/instances")
        mine = [
            instance
            for _, instance in parse.gpuprov_instances(data, Op.LIST_INSTANCES, vm)
            if instance.region.name == location.region
            and instance.status != parse.TERMINATED
            and instance_id in (None, instance.id)
        ]
        if not mine:
            return Diagnosis(instance=None)
        instance = mine[0]
        seen = parse.observed(instance)
        findings = parse.findings(instance)
        if len(mine) > 1:
            ids = ", ".join(other.id for other in mine)
            findings.append(Finding(severity=Severity.WARN, code="duplicate", message=ids))
        return Diagnosis(instance=seen, findings=findings)

    # ------------------------------------------------------------------ internals

    async def _register_vm_key(self, spec: InstanceSpec) -> str:
        """The per-VM key `gpuprov-<vm>`, registered once: reused when already there with the
        same public key, replaced when ours holds another."""
        public_key = (spec.ssh_public_key or "").strip()
        if len(public_key) > MAX_PUBLIC_KEY:
            raise ProviderError(
                ErrorKind.INVALID_REQUEST,
                f"ssh_public_key of {spec.vm} is {len(public_key)} characters; Lambda accepts "
                f"at most {MAX_PUBLIC_KEY}",
            )
        name = parse.instance_name(spec.vm)
        keys = parse.ssh_keys(await self._client.get(Op.LIST_KEYS, "/ssh-keys"))
        ours = [key for key in keys if key.name == name]
        if any((key.public_key or "").strip() == public_key for key in ours):
            return name  # prepared before: idempotent
        for stale in ours:
            await self._delete_key(stale.id)
        try:
            await self._client.post(
                Op.ADD_KEY, "/ssh-keys", {"name": name, "public_key": public_key}
            )
        except ProviderError as error:
            # An earlier try whose answer was lost may have added it after all.
            if error.kind is ErrorKind.TRANSIENT or not await self._has_key(name, public_key):
                raise
        return name

    async def _has_key(self, name: str, public_key: str) -> bool:
        keys = parse.ssh_keys(await self._client.get(Op.LIST_KEYS, "/ssh-keys"))
        return any(k.name == name and (k.public_key or "").strip() == public_key for k in keys)

    async def _delete_key(self, key_id: str) -> None:
        with contextlib.suppress(Gone):  # already gone is what we wanted
            await self._client.delete(Op.DELETE_KEY, f"/ssh-keys/{_path_id(key_id)}")

    async def _resolve_image(self, offer: Offer, spec: InstanceSpec) -> dict[str, str] | None:
        """The launch's `image`, checked against `GET /images` in the offer's region: unknown
        everywhere is InvalidRequest, missing only here is Unavailable (try another region)."""
        image = _image_spec(spec.image, self.config)
        if image is None:
            return None
        field, value = next(iter(image.items()))
        known = [
            found
            for found in parse.images(await self._client.get(Op.IMAGES, "/images"))
            if getattr(found, field) == value
        ]
        if not known:
            raise ProviderError(
                ErrorKind.INVALID_REQUEST, f"Lambda has no image with {field} {value!r}"
            )
        if not any(found.region is None or found.region.name == offer.region for found in known):
            raise ProviderError(
                ErrorKind.UNAVAILABLE, f"image {field} {value!r} is not offered in {offer.region}"
            )
        return image


def tags(spec: InstanceSpec) -> list[dict[str, str]]:
    """`gpuprov-vm = <vm>` first, then the spec's labels that Lambda accepts as tags."""
    found = [{"key": parse.IDENTITY_TAG, "value": spec.vm}]
    for key, value in sorted(spec.labels.items()):
        if (
            key != parse.IDENTITY_TAG
            and len(key) <= 55
            and _TAG_KEY.fullmatch(key)
            and len(value) <= 128
        ):
            found.append({"key": key, "value": value})
    return found


def _image_spec(asked: str | None, config: LambdaConfig) -> dict[str, str] | None:
    """The spec's image (a UUID is an id, anything else a family), else the configured one."""
    if asked and asked.strip():
        asked = asked.strip()
        return {"id": asked} if _UUID.fullmatch(asked) else {"family": asked}
    if config.image_id:
        return {"id": config.image_id}
    if config.image_family:
        return {"family": config.image_family}
    return None


def _check_offer(offer: Offer) -> None:
    if offer.provider != parse.PROVIDER_ID or not offer.instance_type or not offer.region:
        raise ProviderError(ErrorKind.INVALID_REQUEST, f"offer {offer.id} is not a Lambda offer")


def _path_id(value: str) -> str:
    """An id (from the cloud's own answers) as exactly one path segment."""
    return quote(value, safe="")


def _vm_named(name: str) -> str | None:
    """The VM whose own ruleset or key `name` is: `gpuprov-<vm>`, never a shortened one (its
    `~` never occurs in a VM identity, and the name is all that is listed)."""
    vm = name.removeprefix(VM_LABEL_PREFIX)
    if not vm or vm == name or "~" in vm:
        return None
    return vm if parse.instance_name(vm) == name else None

"""The AWS EC2 adapter (provider id `aws`), over aiobotocore (providers/aws/client.py).

Primitive -> EC2 API calls (region = the offer's or location's region):
- plan: per configured region, DescribeInstanceTypeOfferings (LocationType availability-zone,
  filtered to the configured types) and DescribeInstanceTypes (shapes: GPU model, count and
  memory, vCPUs, memory, architecture), cached for `cache_seconds`; one offer per (zone, type),
  plus a spot offer when `spot` is on. Prices for the offers the request can use: Price List
  GetProducts (on-demand, cached) and DescribeSpotPriceHistory (spot); None where unknown.
- prepare: the spec's image (else the configured one): SSM GetParameter for a
  `resolve:ssm:<parameter>`, then DescribeImages (AMI id, root device); CreateSecurityGroup +
  AuthorizeSecurityGroupIngress (tcp 22, and the spec's ports), ImportKeyPair when the spec
  brings a public key; every `...Duplicate` is success (providers/aws/resources.py).
- create: one RunInstances, with ClientToken derived from the VM identity and attempt (a
  retry with the same parameters launches nothing new), tags gpuprov-vm=<vm> and
  Name=gpuprov-<vm> on the instance and its volumes, and user data that installs and starts
  the node agent (providers/userdata.py; gzip-compressed when over EC2's 16 KB).
- observe: DescribeInstances, Filters tag:gpuprov-vm=<vm> and instance-state-name not terminated.
- observe_region: DescribeInstances, Filters tag-key=gpuprov-vm and the same states (paginated).
- sweep_regions: the configured regions (no call).
- delete: TerminateInstances (idempotent); `InvalidInstanceID.NotFound` is success but not
  proof: only an empty observe-by-tag says gone (EC2 is eventually consistent).
- cleanup: DescribeKeyPairs + DeleteKeyPair, DescribeSecurityGroups + DeleteSecurityGroup, for
  the resources named and tagged for this VM only.
- observe_side_resources: DescribeSecurityGroups and DescribeKeyPairs (each paginated), Filters
  tag-key=gpuprov-vm; only those also named gpuprov-<vm>, by that VM (what cleanup removes).
- diagnose: DescribeInstances by tag (terminated included: StateReason says why a VM went) and
  DescribeInstanceStatus IncludeAllInstances (status checks, scheduled events).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from typing import Any

from aiobotocore.session import AioSession
from pydantic import ValidationError

from providers.aws import diagnose as findings
from providers.aws import parse, resources
from providers.aws.client import Ec2Api, StaticCredentials, check_chain
from providers.aws.config import AwsConfig
from providers.aws.pricing import Prices
from providers.base import (
    Billing,
    Capabilities,
    CloudProvider,
    Diagnosis,
    InstanceSpec,
    Location,
    Model,
    Observed,
    Offer,
    ResourceRequest,
    compatibility_reasons,
)
from providers.errors import ErrorKind, ProviderError, redact
from providers.node_agent import EC2_NOTICES
from providers.settings import capabilities_from
from providers.userdata import compressed_user_data

log = logging.getLogger(__name__)

# Linux instances (on-demand and spot) are billed "on one second increments, with a minimum of
# 60 seconds"; the Price List quote is for Linux without a separately charged distribution.
BILLING = Billing(
    granularity_seconds=1,
    minimum_seconds=60,
    source="https://aws.amazon.com/about-aws/whats-new/2017/10/announcing-amazon-ec2-per-second-billing/",
)
PROVIDER_ID = "aws"
GONE = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
TYPES_PER_CALL = 100  # DescribeInstanceTypes takes at most 100 names
MAX_USER_DATA_BYTES = 16 * 1024  # EC2's limit on raw user data (before base64)
Catalogue = dict[str, tuple[parse.Shape, set[str]]]  # type -> (shape, zones offering it)


class Prepared(Model):
    """What prepare returns (journaled in Temporal history: ids only, nothing secret)."""

    image_id: str
    root_device: str
    security_group_id: str
    key_name: str | None = None


def client_token(spec: InstanceSpec) -> str:
    """RunInstances' idempotency token: the same for every try of one (VM, attempt), different
    for any other; ASCII, 48 characters (EC2 allows 64)."""
    digest = hashlib.sha256(f"{spec.vm}/{spec.attempt}".encode()).hexdigest()
    return f"gpuprov-{digest[:40]}"


class AwsCloud(CloudProvider):
    name = PROVIDER_ID

    def __init__(
        self,
        config: AwsConfig,
        *,
        credentials: StaticCredentials | None = None,
        session: AioSession | None = None,
    ) -> None:
        """`credentials` (tests): explicit keys, and the AWS chain is never consulted.
        Without them the chain must find credentials now, or MissingCredentials. `session`
        (tests): one aiobotocore session shared by many adapters."""
        if credentials is None:
            check_chain(config.profile)
        self.config = config
        self._api = Ec2Api(config, credentials, session)
        self._prices = Prices(self._api, config.cache_seconds)
        self._catalogues: dict[str, tuple[float, Catalogue]] = {}

    def capabilities(self) -> Capabilities:
        # node_agent: the user data installs the agent as a systemd service (providers/userdata.py).
        return capabilities_from(self.config, node_agent=True, cloud_init=True, billing=BILLING)

    async def aclose(self) -> None:
        await self._api.aclose()

    def secrets(self) -> list[str]:
        return [*self.config.secret_values(), *self._api.secrets()]

    # ------------------------------------------------------------------ plan

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        regions = [
            region
            for region in self.config.regions
            if (request.regions is None or region in request.regions)
            and region not in request.denied_regions
        ]
        answers = await asyncio.gather(
            *(self._region_offers(region, request) for region in regions), return_exceptions=True
        )
        offers: list[Offer] = []
        errors: list[ProviderError] = []
        for region, answer in zip(regions, answers, strict=True):
            if isinstance(answer, ProviderError):
                said = redact(answer.message, self.secrets())
                log.warning("aws: no offers from %s: %s", region, said)
                errors.append(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                offers.extend(answer)
        if errors and not offers:
            raise errors[0]  # nothing answered: say why (a Credentials error aborts the job)
        return sorted(offers, key=_offer_order)

    async def _region_offers(self, region: str, request: ResourceRequest) -> list[Offer]:
        catalogue = await self._catalogue(region)
        allowed = self.config.zones.get(region)
        disk_gb = max(self.config.root_volume_gb, math.ceil(request.min_disk_gb or 0))
        offers = [
            offer
            for shape, zones in catalogue.values()
            for zone in sorted(zones)
            if allowed is None or zone in allowed
            for offer in self._offers_for(region, zone, shape, disk_gb)
        ]
        usable = [offer for offer in offers if not compatibility_reasons(offer, request)]
        on_demand = sorted({o.instance_type for o in usable if not o.spot})
        spot = sorted({o.instance_type for o in usable if o.spot})
        od_quotes, spot_quotes = await asyncio.gather(
            self._prices.on_demand(region, on_demand), self._prices.spot(region, spot)
        )
        priced = []
        for offer in offers:
            if offer.spot:
                quote = spot_quotes.get((offer.instance_type, offer.zone or ""))
            else:
                quote = od_quotes.get(offer.instance_type)
            priced.append(offer.model_copy(update={"price": quote}) if quote else offer)
        return priced

    def _offers_for(self, region: str, zone: str, shape: parse.Shape, disk_gb: int) -> list[Offer]:
        detail = {
            "instance_type": shape.name,
            "architecture": shape.architecture,
            "root_volume_gb": disk_gb,
        }
        common: dict[str, Any] = dict(
            provider=PROVIDER_ID,
            region=region,
            zone=zone,
            instance_type=shape.name,
            gpu_name=shape.gpu_name,
            gpu_count=shape.gpu_count,
            gpu_memory_gb=shape.gpu_memory_gb,
            vcpus=shape.vcpus,
            memory_gb=shape.memory_gb,
            disk_gb=float(disk_gb),
        )
        with parse.reading("DescribeInstanceTypes"):
            offers = [Offer(id=f"aws/{zone}/{shape.name}", detail=detail, **common)]
            if self.config.spot:
                offers.append(
                    Offer(
                        id=f"aws/{zone}/{shape.name}/spot",
                        spot=True,
                        detail={**detail, "spot": True},
                        **common,
                    )
                )
        return offers

    async def _catalogue(self, region: str) -> Catalogue:
        cached = self._catalogues.get(region)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        offerings = await self._api.pages(
            region,
            "DescribeInstanceTypeOfferings",
            "InstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": self.config.instance_types}],
        )
        zones = parse.offered_zones(offerings)
        present = [t for t in self.config.instance_types if t in zones]
        shapes: dict[str, parse.Shape] = {}
        for start in range(0, len(present), TYPES_PER_CALL):
            described = await self._api.pages(
                region,
                "DescribeInstanceTypes",
                "InstanceTypes",
                InstanceTypes=present[start : start + TYPES_PER_CALL],
            )
            shapes.update(parse.shapes(described))
        catalogue = {name: (shapes[name], zones[name]) for name in present if name in shapes}
        self._catalogues[region] = (time.monotonic() + self.config.cache_seconds, catalogue)
        return catalogue

    # ------------------------------------------------------------------ prepare / create

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        region = offer.region
        architecture = str(offer.detail.get("architecture") or "x86_64")
        image_id, root_device = await resources.image(
            self._api, self.config, region, spec, architecture
        )
        group_id = await resources.security_group(self._api, self.config, region, spec)
        key_name = await resources.key_pair(self._api, self.config, region, spec)
        prepared = Prepared(
            image_id=image_id,
            root_device=root_device,
            security_group_id=group_id,
            key_name=key_name,
        )
        return prepared.model_dump()

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        params = self._run_instances_params(offer, _prepared(prepared), spec)
        answer = await self._api.must(offer.region, "RunInstances", **params)
        with parse.reading("RunInstances"):
            ids = [str(instance["InstanceId"]) for instance in answer["Instances"]]
        if not ids:
            raise ProviderError(ErrorKind.FAILED, "RunInstances answered without an instance")
        return ids

    def _run_instances_params(
        self, offer: Offer, prepared: Prepared, spec: InstanceSpec
    ) -> dict[str, Any]:
        tags = resources.identity_tags(spec.vm, spec.labels)
        volume_gb = int(offer.detail.get("root_volume_gb") or self.config.root_volume_gb)
        root_volume = {"VolumeSize": volume_gb, "VolumeType": "gp3", "DeleteOnTermination": True}
        params: dict[str, Any] = dict(
            ImageId=prepared.image_id,
            InstanceType=offer.instance_type,
            MinCount=1,
            MaxCount=1,
            ClientToken=client_token(spec),
            SecurityGroupIds=[prepared.security_group_id],
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            BlockDeviceMappings=[{"DeviceName": prepared.root_device, "Ebs": root_volume}],
            MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
        )
        if offer.zone:
            params["Placement"] = {"AvailabilityZone": offer.zone}
        if prepared.key_name:
            params["KeyName"] = prepared.key_name
        if offer.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        else:
            # A node that powers itself off is gone, not a stopped machine still billing EBS.
            params["InstanceInitiatedShutdownBehavior"] = "terminate"
        # Bytes: botocore base64-encodes them; gzip-compressed past EC2's limit.
        document = compressed_user_data(
            spec, max_bytes=MAX_USER_DATA_BYTES, cloud="EC2", notices=EC2_NOTICES
        )
        if document is not None:
            params["UserData"] = document
        return params

    # ------------------------------------------------------------------ observe

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        instances = await self._instances(
            location.region,
            [
                {"Name": f"tag:{parse.VM_TAG}", "Values": [vm]},
                {"Name": "instance-state-name", "Values": parse.LIVE_STATES},
            ],
        )
        return [
            found
            for instance in instances
            if parse.tag(instance, parse.VM_TAG) == vm
            and (found := parse.observed(instance, self.config.ssh_user)) is not None
        ]

    async def observe_region(self, location: Location) -> dict[str, list[Observed]]:
        instances = await self._instances(
            location.region,
            [
                {"Name": "tag-key", "Values": [parse.VM_TAG]},
                {"Name": "instance-state-name", "Values": parse.LIVE_STATES},
            ],
        )
        by_vm: dict[str, list[Observed]] = {}
        for instance in instances:
            vm = parse.tag(instance, parse.VM_TAG)
            found = parse.observed(instance, self.config.ssh_user)
            if vm and found is not None:
                by_vm.setdefault(vm, []).append(found)
        return by_vm

    def sweep_regions(self) -> list[str]:
        return list(self.config.regions)

    async def _instances(self, region: str, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        reservations = await self._api.pages(
            region, "DescribeInstances", "Reservations", Filters=filters
        )
        return parse.instances(reservations)

    # ------------------------------------------------------------------ delete / cleanup

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        if not ids:
            return
        answer = await self._api.call(
            location.region, "TerminateInstances", ok_codes=GONE, InstanceIds=ids
        )
        if answer is None and len(ids) > 1:
            # One unknown id fails the whole batch: terminate the others one by one.
            for instance_id in ids:
                await self._api.call(
                    location.region, "TerminateInstances", ok_codes=GONE, InstanceIds=[instance_id]
                )

    async def cleanup(self, location: Location, vm: str) -> None:
        label = f"gpuprov-{vm}"
        await resources.delete_key_pairs(self._api, location.region, vm, label)
        await resources.delete_security_groups(self._api, location.region, vm, label)

    async def observe_side_resources(self, location: Location) -> dict[str, list[str]]:
        return await resources.side_resources(self._api, location.region)

    # ------------------------------------------------------------------ diagnose

    async def diagnose(
        self, location: Location, vm: str, instance_id: str | None = None
    ) -> Diagnosis:
        every = await self._instances(
            location.region, [{"Name": f"tag:{parse.VM_TAG}", "Values": [vm]}]
        )
        mine = [
            instance
            for instance in every
            if parse.tag(instance, parse.VM_TAG) == vm
            and instance_id in (None, instance["InstanceId"])
        ]
        observed = [
            found
            for instance in mine
            if (found := parse.observed(instance, self.config.ssh_user)) is not None
        ]
        found_here = findings.observed_findings(observed) + findings.state_reason_findings(mine)
        if observed:
            statuses = await self._api.pages(
                location.region,
                "DescribeInstanceStatus",
                "InstanceStatuses",
                InstanceIds=[o.id for o in observed],
                IncludeAllInstances=True,
            )
            found_here += findings.status_findings(statuses)
        return Diagnosis(instance=observed[0] if observed else None, findings=found_here)


def _prepared(prepared: dict[str, Any]) -> Prepared:
    try:
        return Prepared.model_validate(prepared)
    except ValidationError as error:
        raise ProviderError(
            ErrorKind.INVALID_REQUEST, f"prepare's record is not the AWS adapter's: {error}"
        ) from None


def _offer_order(offer: Offer) -> tuple[bool, float, str]:
    return (offer.price is None, offer.price.amount if offer.price else 0.0, offer.id)

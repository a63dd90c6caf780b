"""The one redaction path (activities/redaction.py): whatever a provider call raises leaves the
activity scrubbed of every secret in play, then shortened, without its original as a cause."""

from __future__ import annotations

from typing import Any

import asyncssh
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities, CreateInput, PlanInput, VmInput
from activities.health import HealthActivities
from activities.redaction import scrubbed, secrets_in_play
from activities.ssh_keys import host_key_cloud_config
from gpuprov.contract import HealthInput
from providers.base import (
    CloudProvider,
    Diagnosis,
    Finding,
    InstanceSpec,
    Location,
    NodeBootstrap,
    Observed,
    Offer,
    ResourceRequest,
)
from providers.errors import (
    MAX_MESSAGE_CHARS,
    REDACTED,
    BlockScope,
    ErrorKind,
    ProviderError,
    redact,
)

KEY = "key-0123456789abcdefghij"
TOKEN = "join-0123456789abcdefghij"
OFFER = Offer(id="stub/r/t", provider="stub", region="r", instance_type="t")


class Stub(CloudProvider):
    """A provider whose every call raises what the test hands it."""

    name = "stub"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def secrets(self) -> list[str]:
        return [KEY]

    async def plan(self, request: ResourceRequest) -> list[Offer]:
        raise self.error

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        return {}

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        raise self.error

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        return []

    async def delete(self, location: Location, vm: str, ids: list[str]) -> None:
        raise self.error

    async def cleanup(self, location: Location, vm: str) -> None:
        raise self.error


async def plan_failure(error: Exception) -> ApplicationError:
    activities = CloudActivities({"stub": Stub(error)})
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(
            activities.plan, PlanInput(provider="stub", request=ResourceRequest())
        )
    return caught.value


def spec(**fields: Any) -> InstanceSpec:
    return InstanceSpec(vm="j-a1-n0-x", job="j", node_index=0, attempt=1, **fields)


async def test_a_classified_error_keeps_its_kind_delay_and_scope_and_loses_the_key() -> None:
    error = ProviderError(
        ErrorKind.QUOTA, f"refused {KEY}" * 300, retry_after=None, block_scope=BlockScope.PROVIDER
    )
    failure = await plan_failure(error)
    assert (failure.type, failure.non_retryable) == ("Quota", True)
    assert failure.details == ({"block_scope": BlockScope.PROVIDER},)
    assert KEY not in failure.message and failure.message.startswith(f"refused {REDACTED}")
    assert len(failure.message) <= MAX_MESSAGE_CHARS
    assert failure.__cause__ is None  # the original, unscrubbed, would be recorded as the cause


async def test_an_unclassified_exception_is_scrubbed_too_and_stays_retryable() -> None:
    failure = await plan_failure(KeyError(f"no field in {{'auth': '{KEY}'}}"))
    assert failure.type == "KeyError" and failure.non_retryable is False
    assert KEY not in failure.message and REDACTED in failure.message
    assert failure.__cause__ is None and failure.__suppress_context__


async def test_a_create_failure_loses_the_join_token_and_the_generated_host_key() -> None:
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    user_data = host_key_cloud_config(host_key, ["ssh-ed25519 AAAA client"])
    echoed = f"bad user data {user_data} for token {TOKEN}"
    node = spec(user_data=user_data, bootstrap=NodeBootstrap(api_url="http://x", join_token=TOKEN))
    activities = CloudActivities({"stub": Stub(ProviderError(ErrorKind.INVALID_REQUEST, echoed))})
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(
            activities.create, CreateInput(offer=OFFER, prepared={}, spec=node)
        )
    message = caught.value.message
    assert TOKEN not in message
    private = host_key.export_private_key("openssh").decode().splitlines()[1:-1]
    assert private and not any(line in message for line in private)
    assert "ssh-ed25519 AAAA client" in message  # public words stay


def test_failures_that_are_already_ours_pass_through_untouched() -> None:
    ours = ApplicationError("provider 'x' is not enabled", type="InvalidRequest")
    with pytest.raises(ApplicationError) as caught, scrubbed(Stub(ours)):
        raise ours
    assert caught.value is ours


def test_the_secrets_in_play_are_the_providers_and_the_specs() -> None:
    node = spec(bootstrap=NodeBootstrap(api_url="http://x", join_token=TOKEN))
    assert secrets_in_play(Stub(ValueError()), node) == [KEY, TOKEN]
    assert secrets_in_play(Stub(ValueError())) == [KEY]


def test_redact_replaces_longer_secrets_first_and_ignores_values_too_short_to_be_one() -> None:
    assert redact("abcdefgh-ijkl and abcdefgh", ["abcdefgh", "abcdefgh-ijkl"]) == (
        f"{REDACTED} and {REDACTED}"
    )
    assert redact("a key k", ["k", ""]) == "a key k"


def test_any_run_of_8_characters_of_a_secret_counts_as_the_secret() -> None:
    assert redact(f"bad key {KEY[:20]}...", [KEY]) == f"bad key {REDACTED}..."
    assert redact(f"[{KEY[3:11]}] [{KEY[:7]}]", [KEY]) == f"[{REDACTED}] [{KEY[:7]}]"
    assert redact(f"{KEY[:9]}/{KEY[12:]}", [KEY]) == f"{REDACTED}/{REDACTED}"


class Echoing(Stub):
    """A provider whose successful answers carry its key: an instance's status message, a
    diagnosis finding."""

    async def observe(self, location: Location, vm: str) -> list[Observed]:
        return [Observed(id="i-1", status="Running", message=f"booted with key {KEY[:12]}")]

    async def diagnose(self, location: Location, vm: str, instance_id: str | None = None):
        said = Finding(severity="warn", code="maintenance", message=f"token {KEY} expires")
        return Diagnosis(instance=None, findings=[said])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # not about the database
async def test_what_observe_and_diagnose_answer_leaves_the_activity_scrubbed(records) -> None:
    where = Location(provider="stub", region="r")
    activities = CloudActivities({"stub": Echoing(ValueError())})
    [running] = await ActivityEnvironment().run(
        activities.wait_running, VmInput(location=where, vm="j-a1-n0-x")
    )
    assert running.message == f"booted with key {REDACTED}"
    records.record_vm(
        job="j", node_index=0, attempt=1, vm="j-a1-n0-x", provider="stub", region="r", zone=None
    )
    health = HealthActivities({"stub": Echoing(ValueError())}, records, keys=None)
    report = await ActivityEnvironment().run(health.check_health, HealthInput(vm="j-a1-n0-x"))
    assert [finding.message for finding in report.findings] == [f"token {REDACTED} expires"]

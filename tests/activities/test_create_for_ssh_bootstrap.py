"""The create activity for a provider whose nodes the core bootstraps over SSH: the node gets
the worker's client key as its authorized key (prepare sees it too, for clouds that register
keys there) and, where the machine runs cloud-init, a host key derived on the worker and pinned
for the VM (in the database, on SQLite and PostgreSQL), so bootstrap verifies the very first
contact against a key it already knows. No join token goes to the cloud: bootstrap hands the
agent its own over SSH. Nothing secret comes back out of the activity."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities, CreateInput, PrepareInput
from activities.enrolment import Enrolment
from activities.ssh_keys import KeyStore
from gpuprov.engine.worker import open_records
from gpuprov.store.records import Records
from gpuprov.store.ssh_records import SshRecords
from providers.base import Capabilities, InstanceSpec, Offer, ResourceRequest
from providers.fake import FakeCloud
from tests.helpers import fast_cloud

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


class RecordingCloud(FakeCloud):
    """The fake cloud, saying whether it runs cloud-init, keeping the spec create was given."""

    def __init__(self, cloud_init: bool) -> None:
        super().__init__(fast_cloud())
        self._cloud_init = cloud_init
        self.created: list[InstanceSpec] = []
        self.prepared: list[InstanceSpec] = []

    async def prepare(self, offer: Offer, spec: InstanceSpec) -> dict[str, Any]:
        self.prepared.append(spec)
        return await super().prepare(offer, spec)

    def capabilities(self) -> Capabilities:
        return super().capabilities().model_copy(update={"cloud_init": self._cloud_init})

    async def create(self, offer: Offer, prepared: dict[str, Any], spec: InstanceSpec) -> list[str]:
        self.created.append(spec)
        return await super().create(offer, prepared, spec)


async def create_once(cloud: RecordingCloud, keys: KeyStore, vm: str) -> list[str]:
    activities = CloudActivities({"fake": cloud}, ssh_bootstrap={"fake"}, keys=keys)
    [offer, *_] = await cloud.plan(ResourceRequest())
    spec = InstanceSpec(vm=vm, job="j", node_index=0, attempt=1)
    return await ActivityEnvironment().run(
        activities.create, CreateInput(offer=offer, prepared={}, spec=spec)
    )


@pytest.fixture
def keys(tmp_path: Path, records: Records) -> KeyStore:
    return KeyStore(SshRecords(records.db), directory=tmp_path / "keys")


@pytest.mark.parametrize("cloud_init", [True, False])
async def test_the_node_gets_the_workers_client_key(keys: KeyStore, cloud_init: bool) -> None:
    cloud = RecordingCloud(cloud_init)
    await create_once(cloud, keys, "j-a1-n0-abcdef")
    [spec] = cloud.created
    assert spec.ssh_public_key == keys.client_public_key()
    await cloud.aclose()


async def test_a_cloud_init_node_gets_a_host_key_that_is_pinned_before_first_contact(
    keys: KeyStore,
) -> None:
    cloud = RecordingCloud(cloud_init=True)
    vm = "j-a1-n0-abcdef"
    ids = await create_once(cloud, keys, vm)
    [spec] = cloud.created
    assert spec.user_data is not None and spec.user_data.startswith("#cloud-config\n")
    document = json.loads(spec.user_data.removeprefix("#cloud-config\n"))
    private = asyncssh.import_private_key(document["ssh_keys"]["ed25519_private"])
    pinned = keys.known_host_key(vm)
    assert pinned is not None and pinned.public_data == private.public_data
    assert document["ssh_authorized_keys"] == [keys.client_public_key()]
    assert "PRIVATE" not in json.dumps(ids)  # what goes back to the workflow: ids only
    await cloud.aclose()


async def test_no_host_key_is_made_where_the_machine_runs_no_cloud_init(keys: KeyStore) -> None:
    cloud = RecordingCloud(cloud_init=False)
    vm = "j-a1-n0-abcdef"
    await create_once(cloud, keys, vm)
    [spec] = cloud.created
    assert spec.user_data is None
    assert keys.known_host_key(vm) is None  # bootstrap trusts a fingerprint or pins first use
    await cloud.aclose()


@pytest.mark.parametrize("bootstrapped", [True, False])
async def test_prepare_sees_the_client_key_only_where_the_core_bootstraps_over_ssh(
    tmp_path: Path, bootstrapped: bool
) -> None:
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    keys = KeyStore(SshRecords(records.db), directory=tmp_path / "keys")
    cloud = RecordingCloud(cloud_init=False)
    activities = CloudActivities(
        {"fake": cloud}, ssh_bootstrap={"fake"} if bootstrapped else set(), keys=keys
    )
    [offer, *_] = await cloud.plan(ResourceRequest())
    spec = InstanceSpec(vm="j-a1-n0-abcdef", job="j", node_index=0, attempt=1)
    await ActivityEnvironment().run(activities.prepare, PrepareInput(offer=offer, spec=spec))
    await ActivityEnvironment().run(activities.launch, PrepareInput(offer=offer, spec=spec))
    expected = keys.client_public_key() if bootstrapped else None
    assert [s.ssh_public_key for s in cloud.prepared] == [expected, expected]
    await cloud.aclose()
    records.db.dispose()


async def test_the_cloud_gets_no_join_token_where_bootstrap_brings_its_own(tmp_path: Path) -> None:
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    keys = KeyStore(SshRecords(records.db), directory=tmp_path / "keys")
    cloud = RecordingCloud(cloud_init=True)
    enrolment = Enrolment(records, "http://api:8080", timedelta(minutes=5))
    activities = CloudActivities({"fake": cloud}, enrolment, ssh_bootstrap={"fake"}, keys=keys)
    [offer, *_] = await cloud.plan(ResourceRequest())
    spec = InstanceSpec(vm="j-a1-n0-abcdef", job="j", node_index=0, attempt=1)
    try:
        await ActivityEnvironment().run(
            activities.create, CreateInput(offer=offer, prepared={}, spec=spec)
        )
    finally:
        records.db.dispose()
        await cloud.aclose()
    [created] = cloud.created
    assert created.bootstrap is None  # no token, so no agent installed from the user data
    assert created.user_data is not None and "GPUPROV_JOIN_TOKEN" not in created.user_data

"""The ssh provider's primitives against real SSH servers on loopback (OpenSSH's sshd and an
asyncssh server): the same contract a cloud keeps, claims standing in for instances."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from activities import bootstrap
from providers.base import (
    InstanceSpec,
    InstanceStatus,
    Location,
    ResourceRequest,
    Verdict,
)
from providers.errors import ErrorKind, ProviderError
from providers.ssh import remote
from providers.ssh.cloud import SshMachines
from providers.ssh.config import SshConfig, SshHost
from tests.sshd import TestServer, free_port, running_asyncssh_server, running_sshd

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

OWNED = Location(provider="ssh", region="owned")


def spec(vm: str) -> InstanceSpec:
    return InstanceSpec(vm=vm, job="job", node_index=0, attempt=1)


def entry(server: TestServer | None, name: str, **overrides: Any) -> SshHost:
    """A host entry for `server`, or for a loopback port nothing listens on."""
    data: dict[str, Any] = {
        "name": name,
        "host": "127.0.0.1",
        "port": server.port if server else free_port(),
        "user": server.user if server else "root",
        "key_path": str(server.client_key_path) if server else "/dev/null",
    }
    data.update(overrides)
    return SshHost(**data)


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[TestServer]:
    """With an RSA host key too, as stock hosts have: fingerprints and pins are the ed25519's."""
    with running_sshd(tmp_path / "sshd", rsa_too=True) as server:
        yield server


async def pool(tmp_path: Path, *hosts: SshHost, **settings: Any) -> SshMachines:
    config = SshConfig(
        hosts=list(hosts),
        claims_url=f"sqlite:///{tmp_path / 'claims.db'}",
        connect_timeout=2,
        **settings,
    )
    return SshMachines(config)


@pytest.fixture
async def machines(tmp_path: Path, sshd: TestServer) -> AsyncIterator[SshMachines]:
    """`box` is the sshd (price 2.0); `spare` is down (no price); `cheap` is down (1.0)."""
    provider = await pool(
        tmp_path,
        entry(sshd, "box", price=2.0, gpu="RTX 4090", gpu_count=2, labels={"rack": "a"}),
        entry(None, "spare"),
        entry(None, "cheap", price=1.0),
    )
    yield provider
    await provider.aclose()


async def claim(machines: SshMachines, host: str, vm: str) -> list[str]:
    [offer] = [o for o in await machines.plan(ResourceRequest()) if o.instance_type == host]
    prepared = await machines.prepare(offer, spec(vm))
    return await machines.create(offer, prepared, spec(vm))


# ---------------------------------------------------------------------- plan / create


async def test_plan_offers_every_free_host_cheapest_first_with_configured_prices(
    machines: SshMachines,
) -> None:
    offers = await machines.plan(ResourceRequest())
    assert [o.id for o in offers] == ["ssh/owned/cheap", "ssh/owned/box", "ssh/owned/spare"]
    box = offers[1]
    assert box.price is not None and (box.price.amount, box.price.source) == (2.0, "config")
    assert (box.gpu_name, box.gpu_count, box.spot) == ("RTX 4090", 2, False)
    assert box.detail == {"host": "box", "labels": {"rack": "a"}}
    assert offers[2].price is None  # no price configured: none invented


async def test_a_claimed_host_is_never_offered_or_given_to_another_vm(
    machines: SshMachines,
) -> None:
    [offer] = [o for o in await machines.plan(ResourceRequest()) if o.instance_type == "box"]
    assert await machines.create(offer, {}, spec("vm-a")) == ["box"]
    assert await machines.create(offer, {}, spec("vm-a")) == ["box"]  # a retry: same claim
    with pytest.raises(ProviderError) as raised:
        await machines.create(offer, {}, spec("vm-b"))
    assert raised.value.kind is ErrorKind.CAPACITY and "vm-a" in raised.value.message
    assert "box" not in [o.instance_type for o in await machines.plan(ResourceRequest())]


async def test_an_offer_for_a_host_no_longer_configured_is_unavailable(
    machines: SshMachines,
) -> None:
    [offer] = [o for o in await machines.plan(ResourceRequest()) if o.instance_type == "box"]
    stale = offer.model_copy(update={"detail": {"host": "gone"}})
    for call in (machines.prepare(stale, spec("vm")), machines.create(stale, {}, spec("vm"))):
        with pytest.raises(ProviderError) as raised:
            await call
        assert raised.value.kind is ErrorKind.UNAVAILABLE


# ---------------------------------------------------------------------- observe


async def test_a_reachable_claimed_host_is_running_with_its_verified_fingerprint(
    machines: SshMachines, sshd: TestServer
) -> None:
    assert await machines.observe(OWNED, "vm-a") == []
    await claim(machines, "box", "vm-a")
    [observed] = await machines.observe(OWNED, "vm-a")
    assert (observed.id, observed.status) == ("box", InstanceStatus.RUNNING)
    assert observed.ssh is not None
    assert (observed.ssh.host, observed.ssh.port, observed.ssh.user) == (
        "127.0.0.1",
        sshd.port,
        "root",
    )
    assert observed.ssh.host_key_fingerprint == sshd.host_fingerprint
    assert await machines.observe_region(OWNED) == {"vm-a": [observed]}
    assert machines.sweep_regions() == ["owned"]
    assert (await machines.diagnose(OWNED, "vm-a")).verdict is Verdict.HEALTHY


async def test_an_unreachable_claimed_host_is_failed(machines: SshMachines) -> None:
    await claim(machines, "cheap", "vm-a")
    [observed] = await machines.observe(OWNED, "vm-a")
    assert observed.status is InstanceStatus.FAILED
    assert "unreachable" in (observed.message or "") and "refused" in (observed.message or "")
    assert (await machines.diagnose(OWNED, "vm-a")).verdict is Verdict.UNHEALTHY


async def test_a_configured_host_key_that_does_not_match_is_failed(
    tmp_path: Path, sshd: TestServer
) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    wrong = other.export_public_key().decode().strip()
    provider = await pool(
        tmp_path,
        entry(sshd, "by-key", host_key=wrong),
        entry(
            sshd,
            "by-fingerprint",
            port=sshd.port,
            host="localhost",
            host_key_fingerprint=sshd.host_fingerprint,
        ),
    )
    try:
        await claim(provider, "by-key", "vm-a")
        await claim(provider, "by-fingerprint", "vm-b")
        [refused] = await provider.observe(OWNED, "vm-a")
        [accepted] = await provider.observe(OWNED, "vm-b")
    finally:
        await provider.aclose()
    assert refused.status is InstanceStatus.FAILED
    assert f"{sshd.host_fingerprint} is not the configured" in (refused.message or "")
    assert accepted.status is InstanceStatus.RUNNING


async def test_first_contact_pins_the_host_key_and_a_new_key_later_is_failed(
    tmp_path: Path,
) -> None:
    port = free_port()
    async with running_asyncssh_server(tmp_path / "first", port=port) as first:
        provider = await pool(tmp_path, entry(first, "box"))
        await claim(provider, "box", "vm-a")
        [seen] = await provider.observe(OWNED, "vm-a")
    async with running_asyncssh_server(tmp_path / "second", port=port) as second:
        [changed] = await provider.observe(OWNED, "vm-a")
    await provider.aclose()
    assert seen.status is InstanceStatus.RUNNING
    assert seen.ssh is not None and seen.ssh.host_key_fingerprint == first.host_fingerprint
    assert changed.status is InstanceStatus.FAILED
    assert "host key changed" in (changed.message or "")
    assert second.host_fingerprint in (changed.message or "")


# ---------------------------------------------------------------------- delete / cleanup


async def test_delete_releases_only_the_vms_own_claims(machines: SshMachines) -> None:
    await claim(machines, "box", "vm-a")
    await machines.delete(OWNED, "vm-b", ["box"])  # not its claim: nothing happens
    assert [o.id for o in await machines.observe(OWNED, "vm-a")] == ["box"]
    await machines.delete(OWNED, "vm-a", ["box", "never-heard-of"])
    assert await machines.observe(OWNED, "vm-a") == []
    assert "box" in [o.instance_type for o in await machines.plan(ResourceRequest())]
    await machines.delete(OWNED, "vm-a", ["box"])  # gone is success


async def test_cleanup_removes_what_the_agent_installed_for_that_vm_only(
    machines: SshMachines, sshd: TestServer
) -> None:
    await claim(machines, "box", "vm-a")
    await machines.observe(OWNED, "vm-a")  # reachable while held: the agent may be there
    installed = sshd.home / remote.REMOTE_ROOT / "vm-a"
    neighbour = sshd.home / remote.REMOTE_ROOT / "vm-later"
    for directory in (installed, neighbour):
        directory.mkdir(parents=True)
        (directory / "agent.pyz").write_text("# agent\n")
    await machines.delete(OWNED, "vm-a", ["box"])
    await machines.cleanup(OWNED, "vm-a")
    assert not installed.exists() and (neighbour / "agent.pyz").exists()
    await machines.cleanup(OWNED, "vm-a")  # idempotent


async def test_cleanup_of_the_last_vm_removes_the_agent_root_too(
    machines: SshMachines, sshd: TestServer
) -> None:
    await claim(machines, "box", "vm-a")
    await machines.observe(OWNED, "vm-a")
    (sshd.home / remote.REMOTE_ROOT / "vm-a").mkdir(parents=True)
    await machines.cleanup(OWNED, "vm-a")
    assert not (sshd.home / remote.REMOTE_ROOT).exists()


async def test_cleanup_skips_a_host_never_reached_and_fails_on_one_gone_dark(
    tmp_path: Path,
) -> None:
    async with running_asyncssh_server(tmp_path / "node") as node:
        provider = await pool(tmp_path, entry(node, "box"), entry(None, "dark"))
        await claim(provider, "dark", "vm-never")
        await provider.observe(OWNED, "vm-never")  # unreachable: never got an agent
        await claim(provider, "box", "vm-a")
        await provider.observe(OWNED, "vm-a")
    try:
        await provider.cleanup(OWNED, "vm-never")  # nothing to do, no SSH call made
        with pytest.raises(ProviderError) as raised:
            await provider.cleanup(OWNED, "vm-a")  # the node stopped answering
    finally:
        await provider.aclose()
    assert raised.value.kind is ErrorKind.FAILED and "vm-a" in raised.value.message


def test_cleanup_command_names_only_the_vms_directory() -> None:
    command = remote.cleanup_command("job-a1-n0.x")
    assert 'rm -rf -- "$HOME"/.gpuprov/job-a1-n0.x ' in command
    assert "'[.]gpuprov/job-a1-n0[.]x/agent[.]pyz'" in command


def test_bootstrap_installs_where_cleanup_removes() -> None:
    assert bootstrap.REMOTE_ROOT == remote.REMOTE_ROOT
    assert bootstrap.remote_dir("vm-1") == '"$HOME"/.gpuprov/vm-1'


# ---------------------------------------------------------------------- for bootstrap


async def test_bootstrap_logs_in_with_the_key_of_the_host_the_vm_holds(
    machines: SshMachines, sshd: TestServer
) -> None:
    assert machines.ssh_client_key_path("vm-a") is None
    await claim(machines, "box", "vm-a")
    assert machines.ssh_client_key_path("vm-a") == str(sshd.client_key_path)
    assert machines.capabilities().node_agent is False  # until the core runs bootstrap
    # The configured price is the owner's accounting, with no billing increment: exact seconds.
    assert machines.capabilities().billing.granularity_seconds is None


async def test_a_claims_database_that_cannot_be_reached_is_transient(tmp_path: Path) -> None:
    provider = await pool(tmp_path, entry(None, "box"))
    try:
        provider._claims.engine.dispose()
        for name in ("claims.db", "claims.db-wal", "claims.db-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        (tmp_path / "claims.db").mkdir()  # where the database was, something it cannot open
        with pytest.raises(ProviderError) as raised:
            await provider.plan(ResourceRequest())
    finally:
        await provider.aclose()
    assert raised.value.kind is ErrorKind.TRANSIENT and "claims database" in raised.value.message


async def test_a_jobs_ports_need_nothing_opened_and_an_image_is_declared_unsupported(
    machines: SshMachines,
) -> None:
    hints = machines.capabilities()
    assert "image" in hints.unsupported and "ports" not in hints.unsupported
    (offer, *_) = await machines.plan(ResourceRequest())
    node = spec("web-a1-n0").model_copy(update={"ports": [8080]})
    assert await machines.prepare(offer, node) == {}  # nothing to open on a machine you own

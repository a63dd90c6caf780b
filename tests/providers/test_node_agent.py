"""The node agent started by user data, read by cloud-init itself: every cloud-init cloud's user
data stays a few KB (the agent is fetched, not carried), its largest is within its documented
limit and valid to `cloud-init schema`; the files cloud-init writes from it hold the fetch step
byte for byte; and the unit's own command lines fetch agent.pyz from the real API, keep it only
if its SHA-256 is the pinned one (a tampered or truncated archive never runs and spends no
token) and register the node with the token from join.env, over plain HTTP or HTTPS with a
private CA the node pins."""

from __future__ import annotations

import importlib
import json
import random
import string
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import asyncssh
import pytest

from activities.ssh_keys import host_key_cloud_config
from gpuprov.api import node as api_node
from gpuprov.engine.worker import open_records
from gpuprov.store.records import Records
from providers import agent_artifact, node_agent
from providers.aws.cloud import MAX_USER_DATA_BYTES as EC2_LIMIT
from providers.base import InstanceSpec, NodeBootstrap
from providers.errors import ProviderError
from providers.gce.instance_body import MAX_USER_DATA_BYTES as GCE_LIMIT
from providers.userdata import compressed_user_data, user_data
from tests import cloudinit
from tests.nodes import CloudInitNode, gpu_path, serving_api, unit_value
from tests.tls import Pki

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

LAMBDA_LIMIT = importlib.import_module("providers.lambdalabs.cloud").MAX_USER_DATA
VM = "train-7b-a1-n0-ce4389"
TOKEN = "tok-Zq8vJ3nX0aB4cD5eF6gH7iJ8kL9mN0pQ"

Build = Callable[[InstanceSpec], str | bytes | None]
# Each cloud-init cloud: how its adapter builds user data, its documented limit, and how much
# incompressible spec user data must still fit beside the bootstrap (agent, token, a CA).
CLOUDS: dict[str, tuple[Build, int, int]] = {
    # EC2: 16 KB of raw user data (before base64); the adapter sends bytes, gzip past it.
    "aws": (lambda s: compressed_user_data(s, max_bytes=EC2_LIMIT, cloud="EC2"), EC2_LIMIT, 12_000),
    # Compute Engine: 256 KB per metadata value (`user-data`).
    "gce": (lambda s: user_data(s, max_bytes=GCE_LIMIT, cloud="GCE"), GCE_LIMIT, 250_000),
    # Lambda: plain-text `user_data` of at most 1 MB (launch body, OpenAPI 1.10.0).
    "lambda": (
        lambda s: user_data(s, max_bytes=LAMBDA_LIMIT, cloud="Lambda"),
        LAMBDA_LIMIT,
        990_000,
    ),
}


@pytest.fixture(scope="module")
def ca_pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    return Pki(tmp_path_factory.mktemp("pki")).ca.read_text()


def node_spec(api_url: str = "https://gpuprov.example:8443", **fields: object) -> InstanceSpec:
    bootstrap = fields.pop("bootstrap", None) or NodeBootstrap(api_url=api_url, join_token=TOKEN)
    return InstanceSpec(
        vm=VM, job="train-7b", node_index=0, attempt=1, bootstrap=bootstrap, **fields
    )


def noise(size: int) -> str:
    """A shell script of `size` characters that gzip cannot shrink much (random letters)."""
    rng = random.Random(size)
    head = "#!/bin/sh\n: "
    return head + "".join(rng.choices(string.ascii_letters + string.digits, k=size - len(head)))


def largest_own(build: Build, bootstrap: NodeBootstrap) -> int:
    """The most characters of incompressible spec user data `build` accepts beside `bootstrap`."""
    low, high = 16, 2_000_000
    while low < high:
        middle = (low + high + 1) // 2
        try:
            build(node_spec(bootstrap=bootstrap, user_data=noise(middle)))
        except ProviderError:
            high = middle - 1
        else:
            low = middle
    return low


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_the_largest_user_data_of_each_cloud_fits_its_limit_and_cloud_init_reads_it(
    cloud: str, ca_pem: str, tmp_path: Path
):
    build, limit, floor = CLOUDS[cloud]
    bootstrap = NodeBootstrap(
        api_url="https://gpuprov.example:8443", join_token=TOKEN, ca_pem=ca_pem
    )
    size = largest_own(build, bootstrap)
    assert size >= floor, f"{cloud}: only {size} bytes of spec user data fit beside the agent"
    with pytest.raises(ProviderError, match="accepts at most"):
        build(node_spec(bootstrap=bootstrap, user_data=noise(size + 1)))

    document = build(node_spec(bootstrap=bootstrap, user_data=noise(size)))
    assert document is not None
    sent = document.encode() if isinstance(document, str) else document
    assert len(sent) <= limit
    read = cloudinit.processed(document)
    assert read.part_types() == ["text/x-shellscript", "text/cloud-config"]
    assert read.parts[0]["payload"] == noise(size)
    assert cloudinit.schema_errors(read.config) == ""
    node = CloudInitNode.boot(document, tmp_path)
    assert node.path(node_agent.FETCH_PATH).read_bytes() == agent_artifact.fetch_source()
    assert not node.path(node_agent.AGENT_PATH).exists()  # fetched by the unit, not carried
    assert node.path(node_agent.CA_PATH).read_text() == ca_pem


def test_the_spec_own_cloud_config_and_the_agent_merge_and_pass_the_schema():
    own = (
        "#cloud-config\n"
        "packages: [htop]\n"
        "write_files: [{path: /etc/motd, content: hello}]\n"
        "runcmd: [[echo, first]]\n"
    )
    read = cloudinit.processed(user_data(node_spec(user_data=own), max_bytes=GCE_LIMIT, cloud="x"))
    paths = [entry["path"] for entry in read.config["write_files"]]
    assert paths == [
        "/etc/motd",
        node_agent.JOIN_ENV_PATH,
        node_agent.FETCH_PATH,
        node_agent.UNIT_PATH,
    ]
    assert read.config["runcmd"][0] == ["echo", "first"]  # the spec's own first, then ours
    assert read.config["runcmd"][-1][-1] == node_agent.UNIT_NAME
    assert read.config["packages"] == ["htop"]
    assert cloudinit.schema_errors(read.config) == ""


def test_the_ssh_bootstrap_host_key_user_data_passes_the_schema():
    key = asyncssh.generate_private_key("ssh-ed25519")
    document = host_key_cloud_config(key, ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA client"])
    assert cloudinit.schema_errors(document) == ""


def test_cloud_init_writes_the_join_env_root_only_and_the_unit_runs_the_daemon(tmp_path: Path):
    node = CloudInitNode.boot(
        user_data(node_spec(), max_bytes=GCE_LIMIT, cloud="x") or "", tmp_path
    )
    join_env = node.path(node_agent.JOIN_ENV_PATH)
    assert join_env.stat().st_mode & 0o777 == 0o600
    assert f"GPUPROV_JOIN_TOKEN={TOKEN}\n" in join_env.read_text()
    unit = node.path(node_agent.UNIT_PATH).read_text()
    assert unit_value(unit, "ExecStart") == [
        "/usr/bin/python3",
        "-I",
        "-S",
        "/usr/local/lib/gpuprov/agent.pyz",
        "run",
        "--url",
        "https://gpuprov.example:8443",
        "--token-file",
        "/etc/gpuprov/join.env",
        "--state-dir",
        "/var/lib/gpuprov",
    ]
    assert TOKEN not in unit  # the token is only in the root-only file
    assert "Restart=on-failure" in unit and "WantedBy=multi-user.target" in unit
    assert "RestartPreventExitStatus=2" in unit  # the agent's "refused for good"
    assert "KillMode=process" in unit  # a restart of the agent leaves the job's work running
    assert "Delegate=yes" in unit  # each work's cgroup is the agent's to make below the unit's


# The user data each cloud gets beside a spec without its own, with an EC CA of about 600 bytes
# (an RSA one takes about 1 KB more): the agent is fetched, so it costs nothing here. The sizes
# docs/architecture.md reports; EC2's must stay well under 4 KB.
USER_DATA_BUDGETS = {"aws": 3_000, "gce": 6_000, "lambda": 6_000}


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_each_cloud_s_user_data_stays_small_whatever_the_agent_s_size(cloud: str, ca_pem: str):
    build, limit, _ = CLOUDS[cloud]
    for ca in (None, ca_pem):
        boot = NodeBootstrap(api_url="https://gpuprov.example:8443", join_token=TOKEN, ca_pem=ca)
        document = build(node_spec(bootstrap=boot))
        assert document is not None
        sent = document.encode() if isinstance(document, str) else document
        assert len(sent) <= USER_DATA_BUDGETS[cloud] < limit, (cloud, ca is not None, len(sent))
        assert len(sent) < len(agent_artifact.artifact()) // 10  # the agent is not in it
    assert USER_DATA_BUDGETS["aws"] < 4_000


def test_the_unit_fetches_the_agent_from_the_api_against_its_pin():
    unit = node_agent.unit("https://api.example:8443/", ca=True)
    assert unit_value(unit, "ExecStartPre") == [
        "/usr/bin/python3",
        "-I",
        "-S",
        node_agent.FETCH_PATH,
        "https://api.example:8443/v1/node/agent.pyz",
        agent_artifact.sha256(),
        node_agent.AGENT_PATH,
        node_agent.CA_PATH,
    ]
    assert node_agent.unit_command(unit, "ExecStartPre") == unit_value(unit, "ExecStartPre")


def test_a_url_systemd_would_expand_reaches_the_agent_unchanged():
    url = 'https://api.example/p%41th?a=$HOME&b="q"\\x'
    assert unit_value(node_agent.unit(url, ca=False), "ExecStart")[6] == url


def registered_token(records: Records, api_url: str, vm: str = VM) -> str:
    records.record_vm(
        job="train-7b", node_index=0, attempt=1, vm=vm, provider="aws", region="r", zone=None
    )
    return records.mint_token(vm=vm, ttl=timedelta(minutes=5))


async def test_the_unit_checks_the_pin_then_registers_the_node_through_the_api(tmp_path: Path):
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    try:
        async with serving_api(records) as api_url:
            token = registered_token(records, api_url)
            spec = node_spec(bootstrap=NodeBootstrap(api_url=api_url, join_token=token))
            node = CloudInitNode.boot(
                compressed_user_data(spec, max_bytes=EC2_LIMIT, cloud="EC2") or b"",
                tmp_path / "node",
            )
            started = await node.start(gpu_path(tmp_path / "bin"))
            again = await node.start(gpu_path(tmp_path / "bin"))
        workers = records.workers_of_vms([VM])
    finally:
        records.db.dispose()

    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["worker_id"] == workers[VM].id
    # The spent token is refused for good: exit 2, which the unit does not restart.
    assert again.returncode == node_agent.EXIT_REFUSED and "used" in again.stderr
    assert len(workers[VM].capabilities["gpus"]) == 8
    credential = node.path(node_agent.STATE_DIR) / "worker-credential"
    assert credential.stat().st_mode & 0o777 == 0o600
    assert token not in started.stdout + started.stderr


@pytest.mark.parametrize("served", ["tampered", "truncated"])
async def test_an_agent_that_does_not_match_its_pin_never_runs_and_spends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: str
):
    good = agent_artifact.artifact()
    bad = good.replace(b"AGENT_VERSION = ", b"AGENT_VERSION = 'x' or ")
    monkeypatch.setattr(api_node, "agent_pyz", lambda: bad if served == "tampered" else good[:-99])
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    try:
        async with serving_api(records) as api_url:
            token = registered_token(records, api_url)
            spec = node_spec(bootstrap=NodeBootstrap(api_url=api_url, join_token=token))
            node = CloudInitNode.boot(
                user_data(spec, max_bytes=GCE_LIMIT, cloud="x") or "", tmp_path / "node"
            )
            path = gpu_path(tmp_path / "bin")
            refused = await node.start(path)
            registered_before = records.workers_of_vms([VM])
            agent = node.path(node_agent.AGENT_PATH)
            left = agent.exists()
            monkeypatch.setattr(api_node, "agent_pyz", lambda: good)  # the API serves the pinned
            started = await node.start(path)  # the unit's next try: the same token still works
            agent.write_bytes(bad)  # changed on the node after the fetch: fetched again
            again = await node.start(path)
        registered_after = records.workers_of_vms([VM])
    finally:
        records.db.dispose()

    assert refused.returncode == 1 and f"pinned {agent_artifact.sha256()}" in refused.stderr
    assert "refused" in refused.stderr and registered_before == {} and not left
    assert started.returncode == 0, started.stderr
    assert list(registered_after) == [VM]
    assert again.returncode == node_agent.EXIT_REFUSED and "used" in again.stderr
    assert agent.read_bytes() == good  # what ran the second time is the pinned archive


def test_the_agent_is_fetched_only_while_the_one_on_the_node_does_not_match(tmp_path: Path):
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(agent_artifact.artifact())
    unreachable = "http://127.0.0.1:9/v1/node/agent.pyz"
    fetch = [sys.executable, "-I", "-S", str(tmp_path / "fetch.py"), unreachable]
    (tmp_path / "fetch.py").write_bytes(agent_artifact.fetch_source())
    kept = subprocess.run([*fetch, agent_artifact.sha256(), str(agent)], capture_output=True)
    assert kept.returncode == 0  # the API down, the pinned agent there: it starts (a reboot)
    down = subprocess.run([*fetch, "0" * 64, str(agent)], capture_output=True, text=True)
    assert down.returncode == 1 and "cannot fetch" in down.stderr
    assert not agent.exists()  # not the pinned one: never left to run


async def test_over_https_the_node_pins_the_private_ca_it_was_given(tmp_path: Path):
    pki = Pki(tmp_path / "pki")
    tls = {
        "tls_cert_file": str(pki.path("server.pem")),
        "tls_key_file": str(pki.path("server.key")),
    }
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    try:
        async with serving_api(records, **tls) as api_url:
            token = registered_token(records, api_url)
            boot = NodeBootstrap(api_url=api_url, join_token=token, ca_pem=pki.ca.read_text())
            node = CloudInitNode.boot(
                user_data(node_spec(bootstrap=boot), max_bytes=GCE_LIMIT, cloud="x") or "",
                tmp_path / "node",
            )
            assert node.start_argv[-2:] == ["--ca-file", str(node.path(node_agent.CA_PATH))]
            started = await node.start(gpu_path(tmp_path / "bin"))
        workers = records.workers_of_vms([VM])
    finally:
        records.db.dispose()

    assert started.returncode == 0, started.stderr
    assert list(workers) == [VM]

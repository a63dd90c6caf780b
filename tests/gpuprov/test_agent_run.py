"""The node agent as a daemon (`agent.pyz run`): `nvidia-smi -q` parsed against captured outputs,
the heartbeat verdict against a stub nvidia-smi replaying them, and the real process against
the real API: it registers once, heartbeats at the interval the API answers, rides out an API
outage, resumes from its kept credential, and stops (exit 0, one line) once revoked. The join
token is never on its command line, in its environment or in its log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import WorkersSettings
from gpuprov.node import probe as node_probe
from gpuprov.node import smi as node_smi
from gpuprov.node.credentials import CREDENTIAL_FILE, NODE_FILE
from gpuprov.node.health import MAX_DETAIL, Health, check_health, parse_query, query_findings
from gpuprov.node.join_token import TOKEN_ENV
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records
from providers.base import InstanceSpec, NodeBootstrap
from providers.fake import node
from providers.userdata import JOIN_ENV_PATH, user_data
from tests.gpuprov.test_agent import FIXTURES, _python38, agent_pyz, install_agent
from tests.gpuprov.test_api import snapshot, vm_token

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

X8 = [
    line.split(", ")[3]
    for line in (FIXTURES / "query-h100-80gb-hbm3-x8.txt").read_text().splitlines()
]
LOST = "GPU 0000:A8:00.0 is lost (fallen off the bus, Xid 79)"
FAST = WorkersSettings(heartbeat_interval_seconds=0.2, lost_after_seconds=2)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture(autouse=True)
def hermetic(tmp_path, monkeypatch):
    """No real libcuda, kernel module or token of this machine leaks into a test."""
    monkeypatch.setattr(node_probe, "LIBCUDA", str(tmp_path / "no-libcuda.so"))
    monkeypatch.setattr(node_smi, "DRIVER_VERSION_FILE", str(tmp_path / "no-driver-version"))
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def install(bin_dir: Path, fault: str | None = None) -> Path:
    """The fake cloud's stub nvidia-smi in bin_dir: healthy, or broken by `fault` from now."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    stub = bin_dir / "nvidia-smi"
    broken = node.BROKEN.get(fault) if fault else None
    stub.write_text(node.stub_script(FIXTURES, node.HEALTHY, broken, time.time() - 1))
    stub.chmod(0o755)
    return bin_dir


@pytest.fixture
def smi(tmp_path, monkeypatch) -> Callable[[str | None], None]:
    def put(fault: str | None = None) -> None:
        bin_dir = install(tmp_path / "bin", fault)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return put


# ---------------------------------------------------------------- nvidia-smi -q


def test_query_parses_every_gpu_section_of_a_healthy_node():
    gpus = parse_query(fixture("q-h100-80gb-hbm3-x8.txt"))
    assert len(gpus) == 8
    fields = gpus["00000000:86:00.0"]
    assert fields[("Product Name",)] == "NVIDIA H100 80GB HBM3"
    assert fields[("ECC Errors", "Volatile", "DRAM Uncorrectable")] == "0"
    assert fields[("Remapped Rows", "Pending")] == "No"
    assert ("Retired Pages", "Double Bit ECC") not in fields  # N/A says nothing
    assert [fields[("GPU UUID",)] for fields in gpus.values()] == X8
    assert query_findings(fixture("q-h100-80gb-hbm3-x8.txt")) == []
    assert query_findings(fixture("q-h100-80gb-hbm3-x7.txt")) == []


@pytest.mark.parametrize(
    ("name", "findings"),
    [
        (
            "q-h100-80gb-hbm3-x8-xid48-dbe.txt",
            [
                "GPU 00000000:86:00.0: 1 uncorrectable ECC error(s) since the driver loaded "
                "(Xid 48)",
                "GPU 00000000:86:00.0: row remapping pending: reset the GPU",
            ],
        ),
        ("q-h100-80gb-hbm3-x8-xid79-lost.txt", [LOST]),
        ("query-gpu-lost.txt", [LOST]),
    ],
)  # fmt: skip
def test_query_findings_name_each_captured_fault(name, findings):
    assert query_findings(fixture(name)) == findings


def test_query_findings_read_older_and_newer_layouts():
    """Double Bit > Total (drivers before the SRAM/DRAM split), a GPU Recovery Action, and a
    handle lost under another wording; aggregate (lifetime) counts alone are no finding."""
    older = (
        "GPU 00000000:3B:00.0\n    ECC Errors\n        Volatile\n            Single Bit\n"
        "                Total                     : 4\n            Double Bit\n"
        "                Device Memory             : 2\n"
        "                Total                     : 2\n        Aggregate\n"
        "            Double Bit\n                Total                     : 7\n"
        "    GPU Recovery Action                   : Reset\n"
    )
    assert query_findings(older) == [
        "GPU 00000000:3B:00.0: 2 uncorrectable ECC error(s) since the driver loaded (Xid 48)",
        "GPU 00000000:3B:00.0: recovery action Reset",
    ]
    other = "Unable to determine the device handle for GPU3: 0000:5F:00.0: Unknown Error\n"
    assert query_findings(other) == ["GPU 0000:5F:00.0 is lost (fallen off the bus, Xid 79)"]
    assert query_findings("NVRM: GPU has fallen off the bus.\n") == [
        "a GPU is lost (Xid 79): NVRM: GPU has fallen off the bus."
    ]


# ---------------------------------------------------------------- the heartbeat's verdict


def test_a_healthy_node_is_healthy(smi):
    smi()
    assert check_health(X8) == Health(True)


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("ecc_error", ["1 uncorrectable ECC error(s)", "(Xid 48)", "row remapping pending"]),
        ("gpu_lost", ["nvidia-smi exited 15", "GPU is lost", "1 registered GPU(s) missing",
                      "GPU 0000:A8:00.0 is lost (fallen off the bus, Xid 79)"]),
        ("gpu_missing", ["1 registered GPU(s) missing from nvidia-smi's list (7 of 8 listed)",
                         "GPU-6a4c2e0d-8f7b-4a5c-9e3d-1b0f8d6c4a25"]),
        ("bad_runtime", ["Driver/library version mismatch"]),
    ],
)  # fmt: skip
def test_each_captured_fault_makes_the_node_unhealthy_in_nvidia_smis_words(smi, fault, words):
    smi(fault)
    health = check_health(X8)
    assert not health.healthy and health.detail is not None
    for word in words:
        assert word in health.detail, health.detail
    assert len(health.detail) <= MAX_DETAIL


def test_a_missing_gpu_is_only_seen_against_what_was_registered(smi):
    smi("gpu_missing")
    assert check_health([]) == Health(True)  # an older registration kept none


def test_nvidia_smi_gone_is_one_finding(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert check_health(X8) == Health(False, "nvidia-smi not found")


# ---------------------------------------------------------------- the daemon, for real


@asynccontextmanager
async def api_on(records: Records, port: int) -> AsyncIterator[str]:
    async with serving(create_app(records, workers=FAST), "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


async def until(predicate: Callable[[], object], what: str, timeout: float = 30) -> object:
    """Poll `predicate` until it returns something true, failing after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := predicate()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return value


@dataclass
class Daemon:
    """An agent process installed as on a node: the file alone, `-I -S`, a stub nvidia-smi."""

    root: Path
    process: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        return (self.root / "agent.log").read_text()

    @property
    def state_dir(self) -> Path:
        return self.root / node.STATE_DIR


def start(root: Path, python: str, *args: str) -> Daemon:
    installed = install_agent((root / node.AGENT_PATH).parent)
    bin_dir = root / "bin"
    argv = [python, "-I", "-S", str(installed), "run", "--state-dir", str(root / node.STATE_DIR),
            "--libcuda", "none", *args]  # fmt: skip
    with open(root / "agent.log", "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin"},
            start_new_session=True,
        )
    return Daemon(root, process)


def join_env(root: Path, api_url: str, token: str) -> Path:
    """join.env written as cloud-init writes it from the user data (providers/userdata.py)."""
    spec = InstanceSpec(vm="job1-a1-n0", job="job1", node_index=0, attempt=1)
    spec.bootstrap = NodeBootstrap(api_url=api_url, join_token=token)
    node.apply_write_files(root, user_data(spec, max_bytes=64 * 1024, cloud="test"))
    return root / JOIN_ENV_PATH.lstrip("/")


def stop(daemon: Daemon) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.process.pid, signal.SIGKILL)
    daemon.process.wait(timeout=10)


def heartbeats(records: Records, worker_id: str) -> int:
    worker = records.get_worker(worker_id)
    return worker.heartbeats if worker is not None else 0


# This interpreter, and the oldest the agent supports where the machine has it (pyenv).
PYTHONS = {"current": sys.executable, **({"3.8": found} if (found := _python38()) else {})}


@pytest.mark.parametrize("python", sorted(PYTHONS))
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # not about the database
async def test_run_registers_once_heartbeats_a_fault_and_stops_when_revoked(
    records, tmp_path, python
):
    interpreter = PYTHONS[python]
    root = tmp_path / "node"
    install(root / "bin")
    token = vm_token(records)
    async with api_on(records, free_port()) as url:
        token_file = join_env(root, url, token)
        daemon = start(root, interpreter, "--token-file", str(token_file), "--delete-token-file")
        try:
            worker = await until(lambda: records.workers_of_vms(["job1-a1-n0"]), "registration")
            [worker_id] = [row.id for row in worker.values()]
            await until(lambda: heartbeats(records, worker_id) >= 3, "heartbeats")

            proc = Path("/proc") / str(daemon.process.pid)
            cmdline, environ = (proc / "cmdline").read_bytes(), (proc / "environ").read_bytes()
            assert b"run" in cmdline and b"PATH=" in environ  # the right process
            assert token.encode() not in cmdline + environ
            assert not token_file.exists()  # deleted once registered
            kept = daemon.state_dir / CREDENTIAL_FILE
            assert kept.stat().st_mode & 0o777 == 0o600
            record = json.loads((daemon.state_dir / NODE_FILE).read_text())
            assert (record["api_url"], record["worker_id"], record["gpus"]) == (url, worker_id, X8)

            install(root / "bin", "ecc_error")  # a double-bit ECC error, now
            sick = await until(
                lambda: (w := records.get_worker(worker_id)) and w.health == "unhealthy" and w,
                "the unhealthy heartbeat",
            )
            assert (
                "(Xid 48)" in sick.health_detail and "row remapping pending" in sick.health_detail
            )

            Liveness(records.db).remove(worker_id)
            before = snapshot(records)
            assert await asyncio.to_thread(daemon.process.wait, 30) == 0
            assert snapshot(records) == before  # the refused heartbeat wrote nothing
        finally:
            stop(daemon)
    log = daemon.log
    assert (
        log.rstrip()
        .splitlines()[-1]
        .endswith(
            "heartbeat refused (401): unknown or revoked worker credential: "
            "this worker was removed or its machine released; stopping"
        )
    )
    assert token not in log and kept.read_text().strip() not in log
    assert "UNHEALTHY" in log and "registered as worker" in log


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_run_rides_out_an_api_outage_and_resumes_from_its_credential(records, tmp_path):
    root = tmp_path / "node"
    install(root / "bin")
    token, port = vm_token(records), free_port()
    async with api_on(records, port) as url:
        daemon = start(root, sys.executable, "--token-file", str(join_env(root, url, token)))
        worker = await until(lambda: records.workers_of_vms(["job1-a1-n0"]), "registration")
        [worker_id] = [row.id for row in worker.values()]
        await until(lambda: heartbeats(records, worker_id) >= 2, "heartbeats")
    try:
        # The API is down: the agent keeps trying, and keeps running.
        await until(lambda: "heartbeat failed" in daemon.log, "a failed heartbeat")
        assert daemon.process.poll() is None
        seen = heartbeats(records, worker_id)
        async with api_on(records, port):
            await until(lambda: heartbeats(records, worker_id) > seen + 2, "heartbeats again")
        assert "heartbeats accepted again after" in daemon.log
        daemon.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(daemon.process.wait, 30) == 0
        assert daemon.log.rstrip().endswith("stopped")

        # Started again (systemd would), it resumes from the kept credential: no token, no
        # second registration.
        seen = heartbeats(records, worker_id)
        async with api_on(records, port):
            again = start(root, sys.executable)
            try:
                await until(lambda: heartbeats(records, worker_id) > seen + 2, "resumed")
            finally:
                stop(again)
        assert len(records.workers()) == 1
        assert token not in daemon.log
    finally:
        stop(daemon)


def test_run_takes_no_token_from_its_environment(tmp_path):
    token = "tok-Zq8vJ3nX0aB4cD5eF6gH7iJ8kL9mN0pQ"
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(agent_pyz()), "run", "--url", "http://127.0.0.1:9",
         "--state-dir", str(tmp_path / "state"), "--libcuda", "none"],
        env={"PATH": "/usr/bin:/bin", TOKEN_ENV: token},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"ignoring ${TOKEN_ENV}" in result.stderr and "no join token" in result.stderr
    assert token not in result.stderr + result.stdout
    assert not (tmp_path / "state").exists()

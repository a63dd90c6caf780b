"""Booted machines for tests: a cloud-init machine that installs what its user data says and
starts the node agent the way the unit starts it, and the control-plane API it registers with.

- `CloudInitNode.boot(user_data, root)`: cloud-init's own reading of the user data
  (tests/cloudinit.py), its files written under `root` by cloud-init's write_files module, and
  the unit's ExecStartPre and ExecStart read back out of the unit file it wrote.
- `node.start(path)`: runs ExecStartPre (the pinned SHA-256 check) and then ExecStart, every
  node path (`/etc/gpuprov`, `/usr/local/lib/gpuprov`, `/var/lib/gpuprov`) moved under `root`,
  with `path` as PATH (put a fake nvidia-smi first). ExecStart's subcommand `run` (the daemon)
  becomes `register` (register once and exit), so a test sees the outcome.
- `serving_api(records)`: the real API (gpuprov/api/app.py) on a free loopback port.
- `booting_nodes(created, directory)`: plays the machines of a cloud whose fake keeps the
  create requests: each machine's user data booted as above, its agent started.
- `agent_stack(...)`: a worker plus the API its nodes register with (and the SSH bootstrap for
  the clouds that need it); `ssh_gpu_node(...)`: an SSH server standing in for a pod.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client

from activities.ssh_keys import KeyStore
from gpuprov.api.app import create_app, serving
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from gpuprov.store.ssh_records import SshRecords
from providers import node_agent
from providers.base import CloudProvider
from tests import cloudinit
from tests.gpuprov.test_agent import H100X8, install_nvidia_smi
from tests.sshd import TestServer, free_port, running_asyncssh_server

NODE_DIRS = ("/usr/local/lib/gpuprov", "/etc/gpuprov", "/var/lib/gpuprov")
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AGENT_TIMEOUT = 120
RUN_ONLY = ("--notices", "--metadata-url")  # `run`'s options, each with its value


@dataclass
class CloudInitNode:
    root: Path
    config: dict[str, Any]  # the merged cloud-config
    check: list[str]  # ExecStartPre
    start_argv: list[str]  # ExecStart

    @classmethod
    def boot(cls, user_data: str | bytes, root: Path) -> CloudInitNode:
        config = cloudinit.processed(user_data).config
        cloudinit.write_files(config, root)
        unit = (root / node_agent.UNIT_PATH.lstrip("/")).read_text()
        pre, start = unit_value(unit, "ExecStartPre"), unit_value(unit, "ExecStart")
        return cls(root, config, cls._rooted(root, pre), cls._rooted(root, start))

    @staticmethod
    def _rooted(root: Path, argv: list[str]) -> list[str]:
        moved = []
        for word in argv:
            for directory in NODE_DIRS:
                word = word.replace(directory, f"{root}{directory}")
            moved.append(word)
        return moved

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def register_argv(self) -> list[str]:
        """ExecStart with `register` (once) in place of the `run` daemon, without the options
        only the daemon has (the cloud's notices it watches)."""
        argv = list(self.start_argv)
        argv[argv.index("run")] = "register"
        for option in RUN_ONLY:
            if option in argv:
                del argv[argv.index(option) : argv.index(option) + 2]
        return argv

    async def start(self, path: str) -> subprocess.CompletedProcess[str]:
        """ExecStartPre, then (if it passed) ExecStart as `register`; the last one's outcome."""
        checked = await _run(self.check, path)
        if checked.returncode != 0:
            return checked
        return await _run(self.register_argv(), path)


def unit_value(unit: str, key: str) -> list[str]:
    """A unit's command line, split as systemd splits it: quoted words, `%%` and `$$`."""
    [line] = [line for line in unit.splitlines() if line.startswith(f"{key}=")]
    words = shlex.split(line.removeprefix(f"{key}="))
    return [word.replace("%%", "%").replace("$$", "$") for word in words]


def gpu_path(directory: Path, script: str = H100X8) -> str:
    """PATH with a fake nvidia-smi (eight H100s by default) in front of the system's."""
    return f"{install_nvidia_smi(directory, script)}:{SESSION_PATH}"


async def _run(argv: list[str], path: str) -> subprocess.CompletedProcess[str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": path},
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), AGENT_TIMEOUT)
    assert process.returncode is not None
    return subprocess.CompletedProcess(argv, process.returncode, stdout.decode(), stderr.decode())


@asynccontextmanager
async def serving_api(records: Records, **tls: str) -> AsyncIterator[str]:
    """The control-plane API over `records` on a free loopback port (HTTPS with
    `tls_cert_file` and `tls_key_file`); yields its URL."""
    port = free_port()
    async with serving(create_app(records), "127.0.0.1", port, **tls):
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"


@asynccontextmanager
async def booting_nodes(
    created: Callable[[], Mapping[str, str | bytes]], directory: Path, interval: float = 0.1
) -> AsyncIterator[list[subprocess.CompletedProcess[str]]]:
    """Plays every machine a cloud boots: `created()` gives the user data of each machine
    that exists now, by instance; each new one is booted under `directory` and its agent
    started. Yields the agents' outcomes, in order."""
    outcomes: list[subprocess.CompletedProcess[str]] = []
    path = gpu_path(directory / "bin")

    async def watch() -> None:
        booted: set[str] = set()
        while True:
            for instance, user_data in (await asyncio.to_thread(created)).items():
                if instance in booted:
                    continue
                booted.add(instance)
                try:
                    root = directory / f"node-{len(booted)}"
                    node = await asyncio.to_thread(CloudInitNode.boot, user_data, root)
                    outcomes.append(await node.start(path))
                except Exception as error:  # the test reads it in the outcomes
                    outcomes.append(subprocess.CompletedProcess([], 255, "", repr(error)))
            await asyncio.sleep(interval)

    task = asyncio.create_task(watch())
    try:
        yield outcomes
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@dataclass
class AgentStack:
    gpuprov: GpuprovClient
    records: Records
    api_url: str
    keys: KeyStore  # the worker's SSH keys: SSH-bootstrapped nodes authorize its client key


@asynccontextmanager
async def agent_stack(
    client: Client,
    task_queue: str,
    providers: dict[str, CloudProvider],
    directory: Path,
    ssh_bootstrap: Iterable[str] = (),
) -> AsyncIterator[AgentStack]:
    """A worker over `providers` with a fresh SQLite database and the real API its nodes
    register with, running the SSH bootstrap for the providers in `ssh_bootstrap` (what
    their sections say in production)."""
    records = open_records(f"sqlite:///{directory / 'gpuprov.db'}")
    keys = KeyStore(SshRecords(records.db), directory=directory / "worker-ssh")
    try:
        async with serving_api(records) as api_url:
            worker = build_worker(
                client,
                task_queue,
                providers,
                records,
                api_url=api_url,
                ssh_keys=keys,
                ssh_bootstrap=set(ssh_bootstrap),
            )
            async with worker:
                yield AgentStack(GpuprovClient(client, task_queue), records, api_url, keys)
    finally:
        records.db.dispose()


@asynccontextmanager
async def ssh_gpu_node(directory: Path, keys: KeyStore) -> AsyncIterator[TestServer]:
    """A real SSH server on loopback standing in for a pod: it lets the worker's client key
    in, and its sessions find a fake nvidia-smi (eight H100s) on PATH."""
    path = gpu_path(directory / "bin")
    async with running_asyncssh_server(
        directory / "ssh", authorized=[keys.client_key()], path=path
    ) as server:
        yield server

"""The k3s profile: node 0 runs the k3s server, every other node joins it as an agent.

setup_k3s(nodes), one activity for the whole cluster, because the cluster's join token must
never leave the worker:
1. on node 0, over SSH (host key verified, as in bootstrap): fetch the installer from
   `[jobs.k3s] installer_url` and run it as `server --node-name <vm> --data-dir ...
   --write-kubeconfig ...`;
2. read the server's node token (`<data_dir>/server/node-token`) over that SSH session;
3. on each other node: run the installer as `agent` with K3S_URL=https://<node 0>:<api_port> and
   K3S_TOKEN read from the command's stdin (never on a command line visible in `ps`, never in
   a log line, never in a result).
It returns where the kubeconfig is (`user@host:/path` on node 0), not its contents (it holds
cluster-admin credentials). The installer runs the same way on every cloud: tests point
installer_url at a stub script on the SSH host (`file://...`).
"""

from __future__ import annotations

import asyncio
import shlex

import asyncssh
from temporalio import activity

from activities.bootstrap import node_client_key, node_host_key_trust
from activities.errors import classified
from activities.heartbeat import Heartbeater
from activities.ssh_connect import Endpoint, HostKeyMismatch, connect_verified
from activities.ssh_keys import KeyStore
from gpuprov.config import K3sSettings
from providers.base import CloudProvider, Model, SshEndpoint
from providers.errors import ErrorKind, ProviderError
from providers.ssh_common import output_tail, output_text

CONNECT_TIMEOUT = 15.0


class K3sNode(Model):
    vm: str
    provider: str
    ssh: SshEndpoint


class K3sInput(Model):
    nodes: list[K3sNode]  # node 0 first: it runs the server


class K3sProgress(Model):
    step: str


class K3sResult(Model):
    server: str  # node 0's VM
    kubeconfig: str  # "user@host:/path" on node 0
    api_url: str  # https://<node 0>:<api_port>
    agents: list[str]


class K3sActivities:
    def __init__(
        self, providers: dict[str, CloudProvider], keys: KeyStore, settings: K3sSettings
    ) -> None:
        self._providers = providers
        self._keys = keys
        self._settings = settings

    def all(self) -> list[object]:
        return [self.setup_k3s]

    @activity.defn(name="setup_k3s")
    async def setup_k3s(self, request: K3sInput) -> K3sResult:
        server, *agents = request.nodes
        api_url = f"https://{server.ssh.host}:{self._settings.api_port}"
        with classified():
            async with Heartbeater(K3sProgress(step=f"server on {server.vm}")) as beat:
                async with await self._connect(server) as connection:
                    await self._install(connection, server, "server")
                    token = await self._node_token(connection, server)
                beat.update(K3sProgress(step=f"{len(agents)} agent(s) joining"))
                await asyncio.gather(*(self._join(node, api_url, token) for node in agents))
        return K3sResult(
            server=server.vm,
            kubeconfig=f"{server.ssh.user}@{server.ssh.host}:{self._settings.kubeconfig}",
            api_url=api_url,
            agents=[node.vm for node in agents],
        )

    async def _join(self, node: K3sNode, api_url: str, token: str) -> None:
        async with await self._connect(node) as connection:
            await self._install(connection, node, "agent", api_url=api_url, token=token)

    async def _connect(self, node: K3sNode) -> asyncssh.SSHClientConnection:
        key = await asyncio.to_thread(
            node_client_key, self._providers.get(node.provider), self._keys, node.vm
        )
        trust = await asyncio.to_thread(node_host_key_trust, self._keys, node.vm, node.ssh)
        if not trust.keys and not trust.fingerprints:
            raise ProviderError(
                ErrorKind.FAILED, f"{node.vm}: no verified host key (bootstrap pins it first)"
            )
        endpoint = Endpoint(node.ssh.host, node.ssh.port, node.ssh.user)
        try:
            connection, _ = await connect_verified(endpoint, key, trust, CONNECT_TIMEOUT)
        except HostKeyMismatch as mismatch:
            raise ProviderError(ErrorKind.FAILED, f"{node.vm}: {mismatch}") from None
        except (OSError, asyncssh.Error, TimeoutError) as error:
            raise ProviderError(ErrorKind.TRANSIENT, f"{node.vm}: SSH: {error}") from None
        return connection

    async def _install(
        self,
        connection: asyncssh.SSHClientConnection,
        node: K3sNode,
        role: str,
        *,
        api_url: str | None = None,
        token: str | None = None,
    ) -> None:
        settings = self._settings
        args = [role, "--node-name", node.vm, "--data-dir", settings.data_dir]
        if role == "server":
            args += ["--write-kubeconfig", settings.kubeconfig, "--write-kubeconfig-mode", "600"]
        command = install_command(settings.installer_url, args, api_url)
        try:
            result = await connection.run(
                command,
                input=f"{token or ''}\n",
                timeout=settings.install_timeout_seconds,
                check=False,
            )
        except (OSError, asyncssh.Error, TimeoutError) as error:
            raise ProviderError(
                ErrorKind.FAILED, f"k3s {role} on {node.vm}: {_scrub(str(error), token)}"
            ) from None
        if result.exit_status != 0:
            said = _scrub(
                output_tail(result.stderr) or output_tail(result.stdout) or "(no output)", token
            )
            raise ProviderError(
                ErrorKind.FAILED, f"k3s {role} on {node.vm} exited {result.exit_status}: {said}"
            )

    async def _node_token(self, connection: asyncssh.SSHClientConnection, node: K3sNode) -> str:
        path = shlex.quote(f"{self._settings.data_dir}/server/node-token")
        command = f'if [ "$(id -u)" = 0 ]; then cat {path}; else sudo -n cat {path}; fi'
        result = await connection.run(command, timeout=60, check=False)
        token = output_text(result.stdout).strip()
        if result.exit_status != 0 or not token:
            raise ProviderError(
                ErrorKind.FAILED,
                f"k3s server on {node.vm} wrote no node token: "
                f"{output_tail(result.stderr) or '(no output)'}",
            )
        return token


def install_command(installer_url: str, args: list[str], api_url: str | None) -> str:
    """Fetch the installer and run it with `args`. K3S_TOKEN is read from stdin inside the
    remote shell, so it is in no process's arguments; an agent also gets K3S_URL."""
    words = " ".join(shlex.quote(arg) for arg in args)
    url = shlex.quote(installer_url)
    join = f"export K3S_URL={shlex.quote(api_url)}; " if api_url else ""
    return (
        "set -e; IFS= read -r K3S_TOKEN || true; "
        'if [ -n "$K3S_TOKEN" ]; then export K3S_TOKEN; else unset K3S_TOKEN; fi; '
        f"{join}"
        "installer=$(mktemp); trap 'rm -f \"$installer\"' EXIT; "
        f'curl -sfL {url} -o "$installer"; '
        f'sh "$installer" {words}'
    )


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, "<token>") if token else text

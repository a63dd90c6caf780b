"""SSH bootstrap: reach a booted node over SSH, verify its host key, run the node agent.

One activity, `bootstrap`, meant to run right after `wait_running` for providers whose nodes
join over SSH:

1. wait until sshd answers, within the provider's boot timeout (heartbeating; the deadline
   travels in the heartbeat details, so a retry keeps it), logging in with the deployment's
   client key (activities/ssh_keys.py) or the key the provider names for that VM;
2. verify the host key, never skipping it (activities/ssh_connect.py): the key injected at
   create time or pinned earlier (by any worker, in the database), the input's key, and the
   fingerprint the cloud reported must all match; with none of them the first key seen is
   pinned before anything is sent;
3. mint a fresh join token for the VM (only its SHA-256 is stored; any earlier unused token of
   the VM stops working), upload agent.pyz (providers/agent_artifact.py, the bytes every path
   runs; and the API's CA, with `[api] ca_file`), check its SHA-256 on the node against the
   pin (a mismatch is refused before anything runs, the token unsent) and run `agent.pyz
   register` with the token written to its stdin over the SSH channel:
   never on a command line (`ps`), in the environment, a file, a log line, an activity input
   or result (Temporal history), nor in shell history (no interactive shell is involved);
4. once it registered, start `agent.pyz run` in the background in the same session (detached,
   output to agent.log beside it): the daemon that heartbeats with the credential `register`
   stored. It outlives the session, not a restart of the machine or container.

Failures are classified: a host key that does not match, a node that never lets us in before
its boot timeout, or an agent that fails are Failed (tear down, next offer); a connection lost
halfway is Transient (Temporal retries the activity, which re-mints the token).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import Literal, Protocol, runtime_checkable

import asyncssh
from pydantic import Field, field_validator
from temporalio import activity

from activities.errors import classified
from activities.heartbeat import Heartbeater
from activities.ssh_connect import Endpoint, HostKeyTrust, wait_for_sshd
from activities.ssh_keys import (
    KeyFileError,
    KeyStore,
    check_vm_name,
    fingerprint,
    parse_public_key,
)
from gpuprov.store.records import Records
from providers import agent_artifact
from providers.base import CloudProvider, Model, SshEndpoint
from providers.errors import ErrorKind, ProviderError
from providers.ssh_common import AGENT_FILE, output_tail, output_text, remote_dir
from providers.ssh_common import REMOTE_ROOT as REMOTE_ROOT  # re-exported (tests, demo_ssh)

# On the node, everything the agent needs lives in remote_dir(vm), "$HOME/.gpuprov/<vm>/" of the
# login user (providers/ssh_common.py); the ssh provider's cleanup removes exactly that.
CA_FILE = "api-ca.pem"  # beside the agent: the API's CA it pins (--ca-file)
AGENT_LOG = "agent.log"  # the heartbeat daemon's output
AGENT_TIMEOUT = 300.0  # seconds for the agent to probe and register (its own retries included)
INSTALL_TIMEOUT = 60.0
POLL_INTERVAL = 2.0
MAX_OUTPUT_CHARS = 500
EXIT_COMMAND_NOT_FOUND = 127

HostKeyTrustKind = Literal["expected", "fingerprint", "first-use"]


class BootstrapInput(Model):
    """Everything here enters history: public facts only, never a token or a private key."""

    provider: str
    vm: str
    ssh: SshEndpoint  # from Observed.ssh (host, port, user, the cloud's host key fingerprint)
    host_key: str | None = None  # OpenSSH public key line the node must present, if known
    boot_timeout: float = Field(gt=0)  # Capabilities.boot_timeout: how long sshd may take
    poll_interval: float = Field(default=POLL_INTERVAL, gt=0)

    @field_validator("vm")
    @classmethod
    def _usable_vm(cls, vm: str) -> str:
        return check_vm_name(vm)  # it names files here and a directory on the node


class BootstrapResult(Model):
    vm: str
    host_key_fingerprint: str | None = None  # SHA256:... of the key the node proved it holds
    host_key_trust: HostKeyTrustKind | None = None
    worker_id: str | None = None  # what the API answered the agent, if it said
    already_registered: bool = False  # an earlier attempt's agent registered: nothing done


class BootstrapProgress(Model):
    started_at: float  # the boot timeout's origin, kept across retries
    attempts: int = 0
    last_problem: str | None = None


class JoinTokens(Protocol):
    """Where bootstrap gets a node's join token: worker-side, never through history."""

    def mint(self, vm: str) -> str: ...

    def registered(self, vm: str) -> bool: ...


class RecordsJoinTokens:
    """Join tokens from the records database: a fresh single-use token per bootstrap."""

    def __init__(self, records: Records, ttl: timedelta) -> None:
        self._records = records
        self._ttl = ttl

    def mint(self, vm: str) -> str:
        return self._records.mint_token(vm=vm, ttl=self._ttl)

    def registered(self, vm: str) -> bool:
        """Whether a live worker of this VM exists (a retry after the agent got through)."""
        row = self._records.get_vm(vm)
        if row is None:
            return False
        return any(
            worker.vm == vm and worker.state != "revoked"
            for worker in self._records.workers_for_job(row.job)
        )


@runtime_checkable
class SshClientKeys(Protocol):
    """A provider whose nodes take a key of their own (machines you own list one per host)
    rather than the deployment's key."""

    def ssh_client_key_path(self, vm: str) -> str | None: ...


class BootstrapActivities:
    def __init__(
        self,
        providers: dict[str, CloudProvider],
        keys: KeyStore,
        tokens: JoinTokens,
        api_url: str,
        api_ca_pem: str | None = None,
        agent_timeout: float = AGENT_TIMEOUT,
    ) -> None:
        self._providers = providers
        self._keys = keys
        self._tokens = tokens
        self._api_url = api_url
        self._api_ca_pem = api_ca_pem  # the CA the agent pins for the API (`[api] ca_file`)
        self._agent_timeout = agent_timeout

    def all(self) -> list[object]:
        return [self.bootstrap]

    @activity.defn(name="bootstrap")
    async def bootstrap(self, request: BootstrapInput) -> BootstrapResult:
        progress = Heartbeater.resume(BootstrapProgress, BootstrapProgress(started_at=time.time()))
        with classified():
            async with Heartbeater(progress) as heartbeat:
                if await asyncio.to_thread(self._tokens.registered, request.vm):
                    return BootstrapResult(vm=request.vm, already_registered=True)
                client_key = await asyncio.to_thread(self._client_key, request)
                trust = await asyncio.to_thread(self._trust, request)

                def attempted(problem: str) -> None:
                    nonlocal progress
                    progress = progress.model_copy(
                        update={"attempts": progress.attempts + 1, "last_problem": problem}
                    )
                    heartbeat.update(progress)

                endpoint = Endpoint(request.ssh.host, request.ssh.port, request.ssh.user)
                connection, presented = await wait_for_sshd(
                    endpoint,
                    client_key,
                    trust,
                    deadline=progress.started_at + request.boot_timeout,
                    interval=request.poll_interval,
                    on_attempt=attempted,
                )
                async with connection:
                    await asyncio.to_thread(self._pin, request.vm, presented)
                    token = await asyncio.to_thread(self._mint, request.vm)
                    stdout = await _guarded(
                        upload_and_start_agent(
                            connection,
                            request.vm,
                            self._api_url,
                            token,
                            self._agent_timeout,
                            self._api_ca_pem,
                        ),
                        token,
                    )
        return BootstrapResult(
            vm=request.vm,
            host_key_fingerprint=fingerprint(presented),
            host_key_trust=_trust_kind(trust),
            worker_id=_worker_id(stdout),
        )

    # ------------------------------------------------------------------ worker-side lookups

    def _client_key(self, request: BootstrapInput) -> asyncssh.SSHKey:
        return node_client_key(self._providers.get(request.provider), self._keys, request.vm)

    def _trust(self, request: BootstrapInput) -> HostKeyTrust:
        return node_host_key_trust(self._keys, request.vm, request.ssh, request.host_key)

    def _pin(self, vm: str, presented: asyncssh.SSHKey) -> None:
        """Record the key the node proved it holds; a different key recorded meanwhile (a
        racing attempt saw another host) means we stop here."""
        pinned = self._keys.pin(vm, presented)
        if pinned.public_data != presented.public_data:
            raise ProviderError(
                ErrorKind.FAILED,
                f"{vm} presented {fingerprint(presented)} but {fingerprint(pinned)} is pinned",
            )

    def _mint(self, vm: str) -> str:
        try:
            return self._tokens.mint(vm)
        except KeyError as error:  # no VM row: the create step never recorded this VM
            raise ProviderError(ErrorKind.FAILED, f"cannot mint a join token: {error}") from None


# ---------------------------------------------------------------------- on the node


def agent_source() -> bytes:
    """The node agent as it is uploaded: agent.pyz, the bytes every delivery path runs."""
    return agent_artifact.artifact()


# Run on the node before anything else: the uploaded agent's SHA-256 against the pin, by the
# same python3 that is to run it (no sha256sum needed on the image). A mismatch exits
# EXIT_NOT_PINNED, and nothing after it runs: the token on stdin is never read.
PIN_CHECK = (
    "import hashlib, sys; "
    "got = hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest(); "
    "sys.exit(0 if got == sys.argv[2] else "
    "'agent.pyz has SHA-256 ' + got + ', pinned ' + sys.argv[2] + ': refused, not run')"
)
EXIT_NOT_PINNED = 1  # what sys.exit(<message>) exits with
PIN_MISMATCH = "refused, not run"


def install_command(vm: str, name: str = AGENT_FILE) -> str:
    """Receive a file on stdin into the VM's private directory (written aside, then renamed)."""
    directory = remote_dir(vm)
    return (
        f"umask 077 && mkdir -p {directory} && cat > {directory}/{name}.part"
        f" && mv -f {directory}/{name}.part {directory}/{name}"
    )


def start_command(vm: str, api_url: str, ca: bool = False, sha256: str | None = None) -> str:
    """Check the uploaded agent against its pin (`sha256`, default: this worker's build's),
    register (the agent reads its join token from stdin), then start the heartbeat daemon
    detached from the session. The command line holds no secret."""
    directory = remote_dir(vm)
    pinned = sha256 or agent_artifact.sha256()
    check = f"python3 -I -S -c {shlex.quote(PIN_CHECK)} {directory}/{AGENT_FILE} {pinned}"
    agent = f"python3 -I -S {directory}/{AGENT_FILE}"
    options = f"--url {shlex.quote(api_url)}" + (f" --ca-file {directory}/{CA_FILE}" if ca else "")
    daemon = f"{agent} run {options} --state-dir {directory}"
    detached = f"nohup {daemon} < /dev/null >> {directory}/{AGENT_LOG} 2>&1 &"
    setsid = "$(command -v setsid)"  # a session of its own where the image has setsid
    return f"{check} && {agent} register {options} && {{ {setsid} {detached} }}"


async def upload_and_start_agent(
    connection: asyncssh.SSHClientConnection,
    vm: str,
    api_url: str,
    token: str,
    timeout: float = AGENT_TIMEOUT,
    ca_pem: str | None = None,
) -> str:
    """Copy the agent (and the API's CA) to the node and run it with `token` on its stdin; its
    stdout on success.

    The one place that knows how the agent is installed and started: adjust it here when the
    agent's interface changes."""
    files = [(AGENT_FILE, agent_source())] + ([(CA_FILE, ca_pem.encode())] if ca_pem else [])
    for name, content in files:
        installed = await connection.run(
            install_command(vm, name), input=content, encoding=None, timeout=INSTALL_TIMEOUT
        )
        if installed.exit_status != 0:
            raise ProviderError(
                ErrorKind.FAILED,
                f"cannot install {name} on {vm} (exit {installed.exit_status}): "
                f"{_said(installed.stderr)}",
            )
    try:
        started = await connection.run(
            start_command(vm, api_url, ca_pem is not None), input=token + "\n", timeout=timeout
        )
    except asyncssh.TimeoutError:
        raise ProviderError(
            ErrorKind.FAILED, f"the agent on {vm} did not finish within {timeout:g}s"
        ) from None
    if started.exit_status == EXIT_COMMAND_NOT_FOUND:
        raise ProviderError(ErrorKind.FAILED, f"python3 not found on {vm}: the agent needs it")
    if started.exit_status == EXIT_NOT_PINNED and PIN_MISMATCH in output_text(started.stderr):
        raise ProviderError(
            ErrorKind.FAILED,
            f"the agent uploaded to {vm} does not match its pinned SHA-256: "
            f"{_said(started.stderr)}",
        )
    if started.exit_status != 0:
        raise ProviderError(
            ErrorKind.FAILED,
            f"the agent on {vm} exited {started.exit_status}: {_said(started.stderr)}",
        )
    return output_text(started.stdout)


async def _guarded(work: Awaitable[str], token: str) -> str:
    """Await the agent's run; a connection that breaks halfway is Transient (the retry mints a
    new token), and no message that leaves here can carry the token."""
    try:
        return await work
    except ProviderError as error:
        raise ProviderError(error.kind, error.message.replace(token, "<token>")) from None
    except (OSError, asyncssh.Error) as error:
        message = f"SSH session lost while starting the agent: {type(error).__name__}: {error}"
        raise ProviderError(ErrorKind.TRANSIENT, message.replace(token, "<token>")) from None


def _said(output: object) -> str:
    return output_tail(output, MAX_OUTPUT_CHARS) or "(no output)"


def _worker_id(stdout: str) -> str | None:
    try:
        answer = json.loads(stdout)
    except ValueError:
        return None
    worker_id = answer.get("worker_id") if isinstance(answer, dict) else None
    return str(worker_id)[:128] if worker_id is not None else None


def _trust_kind(trust: HostKeyTrust) -> HostKeyTrustKind:
    if trust.keys:
        return "expected"
    return "fingerprint" if trust.fingerprints else "first-use"


def node_client_key(provider: CloudProvider | None, keys: KeyStore, vm: str) -> asyncssh.SSHKey:
    """The key that logs in to `vm`: the provider's own for the host (machines you own), else
    the deployment's client key. Errors name the file, never the key."""
    path = provider.ssh_client_key_path(vm) if isinstance(provider, SshClientKeys) else None
    if path is None:
        try:
            return keys.client_key()
        except KeyFileError as error:
            raise ProviderError(ErrorKind.CREDENTIALS, str(error)) from None
    try:
        return asyncssh.read_private_key(path)
    except (OSError, asyncssh.KeyImportError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else type(error).__name__
        raise ProviderError(
            ErrorKind.CREDENTIALS, f"cannot use SSH key {path} for {vm}: {reason}"
        ) from None


def node_host_key_trust(
    keys: KeyStore, vm: str, ssh: SshEndpoint, host_key: str | None = None
) -> HostKeyTrust:
    """What `vm` must present: the given key, the key injected or pinned for it, and the
    fingerprint its cloud reports. Empty = first use."""
    expected = []
    try:
        if host_key is not None:
            expected.append(parse_public_key(host_key))
        recorded = keys.known_host_key(vm)
        if recorded is not None:
            expected.append(recorded)
        fingerprints = [ssh.host_key_fingerprint] if ssh.host_key_fingerprint else []
        return HostKeyTrust(keys=expected, fingerprints=fingerprints)
    except (ValueError, KeyFileError) as error:
        raise ProviderError(ErrorKind.FAILED, f"host key of {vm}: {error}") from None

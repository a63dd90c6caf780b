"""`gpuprov demo-ssh`: the SSH bootstrap end to end, over real SSH, on this machine.

1. OpenSSH's sshd starts on a free loopback port with its own throwaway config, host key,
   authorized_keys and PidFile in a temp dir (gpuprov/cli/local_sshd.py; needs root).
2. The embedded stack starts as for `gpuprov demo` (gpuprov/cli/dev.py: Temporal dev server, worker,
   control-plane API, SQLite) with `[providers.ssh]` listing that one host: its `key_path` is the
   generated client key and its `host_key_fingerprint` the sshd's ed25519 key, so nothing is
   trusted on first use. `ssh_bootstrap` is on (the ssh provider's default).
3. A 1-node job restricted to the ssh provider, needing no GPU (this machine may have none):
   launch (prepare + create) claims the host; wait_running sees sshd answer with that host
   key; the bootstrap step logs in, uploads agent.pyz and runs it with a fresh join
   token on its stdin; the agent probes this machine and registers through the API; the job
   is ready once that registration arrives and fits.
4. The demo prints the job's steps from its Temporal history, the host key the bootstrap
   verified, the node's reported capabilities and `gpuprov health` for it; releases the job;
   checks that cleanup removed the agent's directory from the node; stops everything, sshd
   last, and checks that sshd is gone. Exit status 0 only when every check holds.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from activities.bootstrap import AGENT_FILE, REMOTE_ROOT, BootstrapResult
from gpuprov.cli.common import Commands
from gpuprov.cli.demo import progress_printer
from gpuprov.cli.dev import dev_stack
from gpuprov.cli.local_sshd import LocalSshd, SshdUnavailable, running_sshd
from gpuprov.cli.render import health_text, status_text
from gpuprov.config import DatabaseSettings, ProvidersSettings, Settings, TemporalSettings
from gpuprov.models import HealthReport, JobSpec, JobState, JobStatus, Placement, Resources
from gpuprov.sdk.client import GpuprovClient
from providers.base import Verdict
from providers.ssh.config import SshConfig, SshHost

DEMO_JOB = "demo-ssh"
HOST_NAME = "this-machine"
TIMEOUT = 120.0
# The steps of the job's history worth showing, in the order they happen.
SHOWN_STEPS = {"plan", "prepare", "create", "launch", "wait_running", "bootstrap"}
REGISTRATION_WAIT = "await_registrations"


@dataclass
class SshDemoOutcome:
    """What the demo saw; `ok` when the whole story held."""

    status: JobStatus | None = None
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        completed = self.status is not None and self.status.state is JobState.COMPLETED
        return completed and bool(self.checks) and all(self.checks.values())


def ssh_pool(sshd: LocalSshd, data_dir: str) -> SshConfig:
    """`[providers.ssh]` with the one loopback host; short timings for a local machine."""
    return SshConfig(
        hosts=[
            SshHost(
                name=HOST_NAME,
                host=sshd.host,
                port=sshd.port,
                user=sshd.user,
                key_path=str(sshd.client_key_path),
                host_key_fingerprint=sshd.host_fingerprint,
            )
        ],
        claims_url=f"sqlite:///{data_dir}/ssh-claims.db",
        boot_timeout=30,
        delete_timeout=10,
        poll_interval=0.5,
        connect_timeout=3,
    )


def demo_job() -> JobSpec:
    return JobSpec(
        name=DEMO_JOB,
        nodes=1,
        resources=Resources(gpus_per_node=0),  # this machine may have no GPU: none required
        placement=Placement(providers=["ssh"]),
        provisioning_timeout_seconds=int(TIMEOUT),
    )


async def run_demo_ssh(
    out: Callable[[str], None] = print, hold: Callable[[], object] | None = None
) -> SshDemoOutcome:
    outcome = SshDemoOutcome()
    with tempfile.TemporaryDirectory(prefix="gpuprov-demo-ssh-") as data_dir:
        with running_sshd(Path(data_dir) / "sshd") as sshd:
            out(
                f"sshd (OpenSSH, pid {sshd.pid}) on {sshd.host}:{sshd.port}, its own config, "
                f"host key and authorized_keys in {sshd.directory}"
            )
            out(f"  host key {sshd.host_fingerprint}; sessions get HOME={sshd.home}")
            settings = Settings(
                temporal=TemporalSettings(data_dir=data_dir),
                database=DatabaseSettings(url=f"sqlite:///{data_dir}/gpuprov.db"),
                providers=ProvidersSettings(ssh=ssh_pool(sshd, data_dir)),
            )
            async with dev_stack(settings) as stack:
                out(f"Temporal dev server at {stack.address}, Web UI at {stack.ui_url}")
                out(f"control-plane API at {stack.api_url}; [providers.ssh] lists {HOST_NAME}")
                client = GpuprovClient(stack.client, settings.temporal.task_queue)
                await _story(client, stack.client, sshd, outcome, out)
                out(f"Temporal UI for this job: {stack.workflow_url(demo_job().workflow_id)}")
                if hold is not None:
                    hold()
        outcome.checks["sshd stopped"] = _stopped(sshd)
    out(f"sshd (pid {sshd.pid}), dev server and worker stopped; nothing left running.")
    failed = [name for name, held in outcome.checks.items() if not held]
    out(
        "all checks passed" if outcome.ok else f"FAILED: {', '.join(failed) or 'job not completed'}"
    )
    return outcome


async def _story(
    client: GpuprovClient,
    temporal: Client,
    sshd: LocalSshd,
    outcome: SshDemoOutcome,
    out: Callable[[str], None],
) -> None:
    spec = demo_job()
    handle = await client.submit(spec)
    out(f"submitted job {spec.name}: 1 node, no GPU required, providers = ssh")
    printer = progress_printer(out)
    status = await handle.wait_for(
        lambda s: s.state is JobState.READY, timeout=TIMEOUT, on_change=printer, poll_interval=0.2
    )
    if status.state is JobState.READY:
        [node] = status.live_nodes()
        out("the job's Temporal history, in order:")
        for line in await _timeline(temporal, spec.workflow_id):
            out(f"    {line}")
        booted = await _bootstrap_result(temporal, spec.workflow_id)
        verified = booted is not None and booted.host_key_fingerprint == sshd.host_fingerprint
        if booted is not None:
            out(
                f"bootstrap logged in to {node.ssh.user if node.ssh else '?'}@{sshd.host}:"
                f"{sshd.port}, verified host key {booted.host_key_fingerprint} "
                f"(trust: {booted.host_key_trust}; "
                f"{'matches' if verified else 'DOES NOT MATCH'} the configured fingerprint), "
                f"started the agent with the token on its stdin; worker {booted.worker_id}"
            )
        agent = sshd.home / REMOTE_ROOT / node.vm / AGENT_FILE
        out(f"agent installed on the node at {agent}: {agent.exists()}")
        reports = await client.health(spec.name)
        out(f"$ gpuprov health {spec.name}")
        out(health_text(reports))
        outcome.checks.update(
            {
                "registered over SSH": _registered(status, booted),
                "host key verified": verified and booted.host_key_trust == "fingerprint",
                "agent installed": agent.exists(),
                "healthy": _healthy(reports),
            }
        )
        out("releasing the job")
        await handle.release()
    status = await handle.wait_for(
        lambda s: False, timeout=TIMEOUT, on_change=printer, poll_interval=0.2
    )
    outcome.status = status
    out("")
    out(status_text(status))
    leftover = sshd.home / REMOTE_ROOT
    removed = not leftover.exists()
    out(f"agent directory {leftover} on the node: {'removed' if removed else 'STILL THERE'}")
    outcome.checks["agent directory removed"] = removed


def _registered(status: JobStatus, booted: BootstrapResult | None) -> bool:
    [node] = status.live_nodes()
    return (
        booted is not None
        and node.worker_id is not None
        and node.worker_id == booted.worker_id
        and node.capabilities is not None
    )


def _healthy(reports: list[HealthReport]) -> bool:
    return bool(reports) and all(
        report.verdict is Verdict.HEALTHY and any(f.code == "ssh_ok" for f in report.findings)
        for report in reports
    )


def _stopped(sshd: LocalSshd) -> bool:
    """sshd exited and nothing answers on its port any more."""
    exited = sshd._process is None or sshd._process.poll() is not None
    try:
        with socket.create_connection((sshd.host, sshd.port), timeout=0.5):
            return False
    except OSError:
        return exited


async def _history(temporal: Client, workflow_id: str) -> list[HistoryEvent]:
    history = await temporal.get_workflow_handle(workflow_id).fetch_history()
    return list(history.events)


async def _timeline(temporal: Client, workflow_id: str) -> list[str]:
    """The provisioning steps and the agent's registration, as the history recorded them."""
    events = await _history(temporal, workflow_id)
    start = events[0].event_time.ToDatetime()
    names: dict[int, str] = {}
    moments: list[tuple[float, str]] = []

    def at(event: HistoryEvent, what: str) -> None:
        moments.append(((event.event_time.ToDatetime() - start).total_seconds(), what))

    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            names[event.event_id] = name
        elif event.HasField("activity_task_started_event_attributes"):
            scheduled = event.activity_task_started_event_attributes.scheduled_event_id
            if names.get(scheduled) == "bootstrap":
                at(event, "bootstrap started: SSH login, upload the agent, run it")
        elif event.HasField("activity_task_completed_event_attributes"):
            scheduled = event.activity_task_completed_event_attributes.scheduled_event_id
            if names.get(scheduled) in SHOWN_STEPS:
                at(event, f"{names[scheduled]} done")
            elif names.get(scheduled) == REGISTRATION_WAIT:
                at(event, f"{REGISTRATION_WAIT} done: the job read the agent's registration")
    # A started event is written when its activity ends; its time says when it really began.
    return [f"+{elapsed:5.2f}s  {what}" for elapsed, what in sorted(moments, key=lambda m: m[0])]


async def _bootstrap_result(temporal: Client, workflow_id: str) -> BootstrapResult | None:
    """What the bootstrap step returned, read back from the job's history."""
    events = await _history(temporal, workflow_id)
    scheduled = {
        event.event_id
        for event in events
        if event.HasField("activity_task_scheduled_event_attributes")
        and event.activity_task_scheduled_event_attributes.activity_type.name == "bootstrap"
    }
    for event in events:
        completed = event.activity_task_completed_event_attributes
        if event.HasField("activity_task_completed_event_attributes") and (
            completed.scheduled_event_id in scheduled
        ):
            [result] = await temporal.data_converter.decode(
                completed.result.payloads, [BootstrapResult]
            )
            return result
    return None


def main(hold: bool = False) -> int:
    wait: Callable[[], object] | None = None
    if hold:

        def wait() -> object:
            return input("the UI and sshd stay up; press Enter to shut down... ")

    try:
        outcome = asyncio.run(run_demo_ssh(hold=wait))
    except SshdUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0 if outcome.ok else 1


def add_parser(commands: Commands) -> None:
    demo_ssh = commands.add_parser(
        "demo-ssh", help="a job bootstrapped over real SSH on this machine (a loopback sshd)"
    )
    demo_ssh.add_argument("--hold", action="store_true", help="keep the UI and sshd up until Enter")
    demo_ssh.set_defaults(standalone=lambda args: main(hold=args.hold))

"""Health of one machine: the provider's diagnosis plus an SSH probe of the node.

check_health(vm):
1. the VM row says where the machine is (provider, region, zone);
2. the provider's `diagnose` says what the cloud sees (findings info / warn / critical, e.g.
   scheduled maintenance, a failed status check, a spot interruption);
3. when the machine runs and reports an SSH endpoint, an SSH probe with the host key verified
   (the key pinned at bootstrap, or the fingerprint the cloud reports; never first use here):
   reachable? does the node agent answer (`agent.py probe`)? are the GPUs visible, and is the
   GPU runtime working?
The verdict: gone (nothing carries the identity) / unhealthy (any critical finding) / degraded
(any warning) / healthy. Read-only: it never changes the machine or the records. The report is
scrubbed of the provider's secrets (any run of 8 or more of their characters) before it leaves
the activity: a cloud's diagnosis is its own words.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncssh
from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.bootstrap import AGENT_FILE, node_client_key, node_host_key_trust, remote_dir
from activities.heartbeat import Heartbeater
from activities.redaction import clean, scrubbed
from activities.ssh_connect import Endpoint, HostKeyMismatch, connect_verified
from activities.ssh_keys import KeyStore
from gpuprov.contract import HealthInput
from gpuprov.models import HealthReport
from gpuprov.store.db import VmRecord
from gpuprov.store.records import Records
from providers.base import (
    CloudProvider,
    Diagnosis,
    Finding,
    InstanceStatus,
    Location,
    Model,
    Severity,
    SshEndpoint,
    Verdict,
)
from providers.errors import ProviderError
from providers.ssh_common import output_text

PROBE_TIMEOUT = 60.0  # seconds for `agent.py probe` (it bounds nvidia-smi itself)
CONNECT_TIMEOUT = 15.0
MAX_TEXT = 300


class NodesHealthInput(Model):
    checks: list[HealthInput] = Field(min_length=1)


class CheckProgress(Model):
    """What a job's health check heartbeats with: how many nodes it is checking."""

    nodes: int


MAX_PARALLEL_CHECKS = 16


class HealthActivities:
    def __init__(
        self, providers: dict[str, CloudProvider], records: Records, keys: KeyStore | None
    ) -> None:
        self._providers = providers
        self._records = records
        self._keys = keys  # None: this worker does not reach nodes over SSH

    def all(self) -> list[object]:
        return [self.check_health, self.check_nodes]

    @activity.defn(name="check_health")
    async def check_health(self, request: HealthInput) -> HealthReport:
        async with Heartbeater(CheckProgress(nodes=1), beat_at_start=False):
            row = await asyncio.to_thread(self._records.get_vm, request.vm)
            return await self._check(request, row)

    @activity.defn(name="check_nodes")
    async def check_nodes(self, request: NodesHealthInput) -> list[HealthReport]:
        """Every node of a job in one activity (a job's periodic check adds the same few events
        to its history whatever its node count), at most 16 probes at once. It heartbeats: a
        worker killed mid-check is noticed within the heartbeat timeout, not after the whole
        start-to-close (the job waits on this check before it looks at anything else)."""
        gate = asyncio.Semaphore(MAX_PARALLEL_CHECKS)
        rows = await asyncio.to_thread(self._records.get_vms, [c.vm for c in request.checks])

        async def one(check: HealthInput) -> HealthReport:
            async with gate:
                try:
                    return await self._check(check, rows.get(check.vm))
                except ApplicationError as failure:  # a check that cannot run says so
                    said = _finding(Severity.WARN, "check_failed", failure.message)
                    return HealthReport(vm=check.vm, verdict=Verdict.DEGRADED, findings=[said])

        async with Heartbeater(CheckProgress(nodes=len(request.checks)), beat_at_start=False):
            return list(await asyncio.gather(*(one(check) for check in request.checks)))

    async def _check(self, request: HealthInput, row: VmRecord | None) -> HealthReport:
        diagnosis = await self._diagnose(request.vm, row)
        findings = list(diagnosis.findings)
        instance = diagnosis.instance
        if instance is not None and instance.status is InstanceStatus.RUNNING:
            if instance.ssh is None:
                findings.append(_finding(Severity.INFO, "ssh_unknown", "no SSH endpoint reported"))
            else:
                findings += await self._probe(request, instance.ssh, row)
        report = Diagnosis(instance=instance, findings=findings)
        health = HealthReport(
            vm=request.vm, verdict=report.verdict, findings=findings, checked_at=datetime.now(UTC)
        )
        provider = self._providers.get(row.provider) if row is not None else None
        return clean(health, provider.secrets()) if provider is not None else health

    async def _diagnose(self, vm: str, row: VmRecord | None) -> Diagnosis:
        if row is None:
            missing = _finding(Severity.CRITICAL, "unknown_vm", f"no machine recorded as {vm}")
            return Diagnosis(instance=None, findings=[missing])
        provider = self._providers.get(row.provider)
        if provider is None:
            off = _finding(Severity.WARN, "provider_off", f"{row.provider} is not enabled here")
            return Diagnosis(instance=None, findings=[off])
        location = Location(provider=row.provider, region=row.region, zone=row.zone)
        with scrubbed(provider):
            return await provider.diagnose(location, vm)

    async def _probe(
        self, request: HealthInput, ssh: SshEndpoint, row: VmRecord | None
    ) -> list[Finding]:
        if self._keys is None:
            return [_finding(Severity.INFO, "ssh_not_probed", "this worker has no SSH keys")]
        vm = request.vm
        try:
            provider = self._providers.get(row.provider) if row is not None else None
            key = await asyncio.to_thread(node_client_key, provider, self._keys, vm)
            trust = await asyncio.to_thread(node_host_key_trust, self._keys, vm, ssh)
        except ProviderError as error:
            return [_finding(Severity.WARN, "ssh_not_probed", error.message)]
        if not trust.keys and not trust.fingerprints:
            reason = "no host key pinned or reported: not probed (bootstrap pins it)"
            return [_finding(Severity.WARN, "ssh_not_probed", reason)]
        endpoint = Endpoint(ssh.host, ssh.port, ssh.user)
        try:
            connection, _ = await connect_verified(endpoint, key, trust, CONNECT_TIMEOUT)
        except HostKeyMismatch as mismatch:
            return [_finding(Severity.CRITICAL, "host_key_mismatch", str(mismatch))]
        except (OSError, asyncssh.Error, TimeoutError) as error:
            where = f"{ssh.user}@{ssh.host}:{ssh.port}"
            return [_finding(Severity.CRITICAL, "ssh_unreachable", f"{where}: {error}")]
        async with connection:
            return await _agent_findings(connection, vm, request.expected_gpus)


async def _agent_findings(
    connection: asyncssh.SSHClientConnection, vm: str, expected_gpus: int | None
) -> list[Finding]:
    command = f"python3 {remote_dir(vm)}/{AGENT_FILE} probe"
    try:
        result = await connection.run(command, timeout=PROBE_TIMEOUT, check=False)
    except (asyncssh.Error, OSError, TimeoutError) as error:
        return [_finding(Severity.WARN, "agent_not_answering", f"{command}: {error}")]
    if result.exit_status != 0:
        said = _last(result.stderr) or _last(result.stdout) or f"exit {result.exit_status}"
        return [_finding(Severity.WARN, "agent_not_answering", said)]
    try:
        report = json.loads(output_text(result.stdout))
        capabilities = report.get("capabilities", report)
        gpus = list(capabilities.get("gpus") or [])
        runtime_ok = capabilities.get("gpu_runtime_ok")
        runtime_error = capabilities.get("gpu_runtime_error")
    except (ValueError, AttributeError, TypeError):
        return [_finding(Severity.WARN, "agent_not_answering", "unreadable probe output")]
    findings = []
    if runtime_ok is False and expected_gpus != 0:  # a GPU-less node was placed as such
        said = str(runtime_error or "the node reports a broken GPU runtime")[:MAX_TEXT]
        findings.append(_finding(Severity.CRITICAL, "gpu_runtime", said))
    if expected_gpus is not None and len(gpus) < expected_gpus:
        seen = f"{len(gpus)} GPU(s) visible, {expected_gpus} expected"
        findings.append(_finding(Severity.CRITICAL, "gpus_missing", seen))
    if not findings:
        well = f"reachable over SSH; the agent answers; {len(gpus)} GPU(s) visible"
        findings.append(_finding(Severity.INFO, "ssh_ok", well))
    return findings


def _finding(severity: Severity, code: str, message: str) -> Finding:
    return Finding(severity=severity, code=code, message=message[:MAX_TEXT])


def _last(output: object) -> str:
    return output_text(output).strip()[-MAX_TEXT:]

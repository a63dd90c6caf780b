"""Findings for `diagnose`, read from EC2 only (no call here changes anything):

- DescribeInstances `StateReason` (kept for terminated instances too, so a VM that is gone can
  still say why: spot interruption, capacity, an internal error, a shutdown);
- DescribeInstanceStatus (`IncludeAllInstances`): the instance and system status checks and
  scheduled events (retirement, stop, reboot, maintenance).
"""

from __future__ import annotations

from typing import Any

from providers.aws import parse
from providers.base import Finding, InstanceStatus, Observed, Severity

CRIT, WARN, INFO = Severity.CRITICAL, Severity.WARN, Severity.INFO

# StateReason code -> (severity, finding code).
STATE_REASONS: dict[str, tuple[Severity, str]] = {
    "Server.SpotInstanceTermination": (CRIT, "spot-interrupted"),
    "Server.SpotInstanceShutdown": (CRIT, "spot-interrupted"),
    "Server.InsufficientInstanceCapacity": (CRIT, "capacity"),
    "Server.InternalError": (CRIT, "internal-error"),
    "Server.ScheduledStop": (CRIT, "scheduled-stop"),
    "Client.InternalError": (CRIT, "client-error"),
    "Client.VolumeLimitExceeded": (CRIT, "volume-limit"),
    "Client.InvalidSnapshot.NotFound": (CRIT, "snapshot-not-found"),
    "Client.UserInitiatedShutdown": (INFO, "user-shutdown"),  # e.g. our own terminate
    "Client.InstanceInitiatedShutdown": (WARN, "instance-shutdown"),
    "Client.UserInitiatedHibernate": (WARN, "hibernated"),
}
# Scheduled event code -> severity (AWS will act on the machine).
EVENTS: dict[str, Severity] = {
    "instance-retirement": WARN,
    "instance-stop": WARN,
    "system-reboot": INFO,
    "instance-reboot": INFO,
    "system-maintenance": INFO,
}
CHECK_SEVERITY = {"impaired": CRIT, "initializing": INFO, "insufficient-data": INFO}


def state_reason_findings(instances: list[dict[str, Any]]) -> list[Finding]:
    """A finding per instance whose StateReason says something went wrong."""
    findings = []
    with parse.reading("DescribeInstances"):
        for instance in instances:
            reason = instance.get("StateReason") or {}
            code = reason.get("Code")
            if not code or code not in STATE_REASONS:
                continue
            severity, finding = STATE_REASONS[code]
            words = f"{instance['InstanceId']}: {parse.reason_words(reason)}"
            findings.append(Finding(severity=severity, code=finding, message=words))
    return findings


def status_findings(statuses: list[Any]) -> list[Finding]:
    """Findings from DescribeInstanceStatus' InstanceStatuses."""
    findings = []
    with parse.reading("DescribeInstanceStatus"):
        for status in statuses:
            instance_id = status["InstanceId"]
            for check, label in (("SystemStatus", "system"), ("InstanceStatus", "instance")):
                value = (status.get(check) or {}).get("Status")
                if value in CHECK_SEVERITY:
                    findings.append(
                        Finding(
                            severity=CHECK_SEVERITY[value],
                            code=f"{label}-status-{value}",
                            message=f"{instance_id}: {label} status check {value}",
                        )
                    )
            for event in status.get("Events") or []:
                findings.extend(_event_finding(instance_id, event))
    return findings


def _event_finding(instance_id: str, event: dict[str, Any]) -> list[Finding]:
    code = str(event["Code"])
    description = str(event.get("Description") or "")
    if description.startswith(("[Completed]", "[Canceled]")):
        return []
    when = event.get("NotBefore")
    words = f"{instance_id}: {code}" + (f" from {when}" if when else "")
    words += f": {description}" if description else ""
    return [Finding(severity=EVENTS.get(code, WARN), code=f"scheduled-{code}", message=words)]


def observed_findings(observed: list[Observed]) -> list[Finding]:
    """What the contract's default diagnosis says: duplicates, Failed, not yet running."""
    if not observed:
        return []
    findings = []
    if len(observed) > 1:
        ids = ", ".join(o.id for o in observed)
        findings.append(Finding(severity=WARN, code="duplicate", message=f"several: {ids}"))
    instance = observed[0]
    if instance.status is InstanceStatus.FAILED:
        words = instance.message or "EC2 reports the instance stopped"
        findings.append(Finding(severity=CRIT, code="failed", message=words))
    elif instance.status is not InstanceStatus.RUNNING:
        words = instance.message or f"instance is {instance.status.value}"
        findings.append(Finding(severity=WARN, code=instance.status.value.lower(), message=words))
    return findings

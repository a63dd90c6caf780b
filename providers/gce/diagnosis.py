"""diagnose: findings from the instance's maintenance status and its recent system events.

Calls (read-only):
- `GET zones/<z>/instances/<name>` -> `resourceStatus.upcomingMaintenance` (`type`,
  `maintenanceStatus` PENDING/ONGOING, `windowStartTime`); GPU VMs are stopped, not migrated,
  for host maintenance (onHostMaintenance TERMINATE), so it matters;
- `GET zones/<z>/operations?filter=targetLink = "<instance selfLink>"` -> system events on the
  instance: `compute.instances.preempted`, `.hostError`, `.guestTerminate`,
  `.automaticRestart`, `.terminateOnHostMaintenance`.
"""

from __future__ import annotations

from providers.base import Finding, Severity
from providers.gce.parse import Instance, Operation, UpcomingMaintenance

# operationType -> (severity, finding code, what it means)
EVENTS: dict[str, tuple[Severity, str, str]] = {
    "compute.instances.preempted": (
        Severity.CRITICAL,
        "preempted",
        "Compute Engine preempted the instance (Spot capacity reclaimed)",
    ),
    "compute.instances.hostError": (
        Severity.CRITICAL,
        "host_error",
        "the instance's host failed; the instance was stopped or restarted",
    ),
    "compute.instances.terminateOnHostMaintenance": (
        Severity.CRITICAL,
        "host_maintenance",
        "the instance was stopped for host maintenance (GPU VMs cannot live-migrate)",
    ),
    "compute.instances.guestTerminate": (
        Severity.WARN,
        "guest_terminate",
        "the guest OS shut the instance down",
    ),
    "compute.instances.automaticRestart": (
        Severity.WARN,
        "automatic_restart",
        "Compute Engine restarted the instance after a host event",
    ),
}
MAX_EVENTS = 5


def maintenance_finding(maintenance: UpcomingMaintenance | None) -> Finding | None:
    if maintenance is None:
        return None
    status = maintenance.maintenanceStatus or "PENDING"
    window = maintenance.windowStartTime or "an unannounced time"
    kind = maintenance.type or "maintenance"
    if status == "ONGOING":
        return Finding(
            severity=Severity.CRITICAL,
            code="maintenance_ongoing",
            message=f"{kind} host maintenance is under way (started {window})",
        )
    return Finding(
        severity=Severity.WARN,
        code="maintenance_scheduled",
        message=f"{kind} host maintenance {status.lower()}, window starts {window}; "
        "a GPU VM is stopped for it",
    )


def event_findings(operations: list[Operation], instance: Instance | None) -> list[Finding]:
    """Findings for the system events among `operations`, newest first."""
    link = instance.selfLink if instance else None
    events = [
        op
        for op in operations
        if op.operationType in EVENTS and (link is None or op.targetLink in (None, link))
    ]
    events.sort(key=lambda op: op.insertTime or "", reverse=True)
    findings = []
    for op in events[:MAX_EVENTS]:
        severity, code, meaning = EVENTS[op.operationType or ""]
        when = f" at {op.insertTime}" if op.insertTime else ""
        detail = f": {op.statusMessage}" if op.statusMessage else ""
        findings.append(Finding(severity=severity, code=code, message=f"{meaning}{when}{detail}"))
    return findings

"""Plain-text views of jobs and offers for the CLI and the demo."""

from __future__ import annotations

from datetime import datetime

from gpuprov.db import OrphanRecord
from gpuprov.models import HealthReport, JobStatus, WorkerCapabilities
from providers.base import Offer, Severity


def price_text(offer: Offer) -> str:
    if offer.price is None:
        return "no price"
    quote = offer.price
    return f"{quote.amount:.2f} {quote.currency}/{quote.unit} ({quote.source})"


def capabilities_text(capabilities: WorkerCapabilities) -> str:
    """One line: GPUs by model, driver/CUDA, CPUs, memory, disk, and the runtime verdict."""
    names = [gpu.name for gpu in capabilities.gpus]
    gpus = ", ".join(f"{names.count(name)} x {name}" for name in dict.fromkeys(names)) or "no GPU"
    parts = [gpus]
    if capabilities.driver_version:
        parts.append(f"driver {capabilities.driver_version}")
    if capabilities.cuda_version:
        parts.append(f"CUDA {capabilities.cuda_version}")
    for value, unit in (
        (capabilities.cpu_count, "CPUs"),
        (capabilities.memory_gb, "GiB memory"),
        (capabilities.disk_gb, "GiB disk"),
    ):
        if value is not None:
            parts.append(f"{value:g} {unit}")
    verdict = (
        "GPU runtime OK"
        if capabilities.gpu_runtime_ok
        else f"GPU runtime NOT OK: {capabilities.gpu_runtime_error}"
    )
    return f"{'; '.join(parts)}; {verdict}"


def progress_line(status: JobStatus) -> str:
    waiting = f" - waiting for {status.waiting_for}" if status.waiting_for else ""
    return f"[{status.state.value}]{waiting}"


def status_text(status: JobStatus) -> str:
    lines = [f"job {status.name}: {status.state.value}"]
    if status.waiting_for:
        lines.append(f"  waiting for: {status.waiting_for}")
    if status.hourly_cost is not None:
        cost = status.hourly_cost
        lines.append(f"  estimated cost: {cost.amount:.2f} {cost.currency}/{cost.unit}")
    if status.attempts:
        lines.append("  offers tried:")
        for attempt in status.attempts:
            lines.append(f"    {attempt.describe()}  [{price_text(attempt.offer)}]")
    if status.blocks:
        lines.append("  blocks:")
        for block in status.blocks:
            lines.append(
                f"    {block.scope.value} {block.key}: {block.kind.value}: {block.message}"
            )
    if status.nodes:
        lines.append("  instances:")
        for node in status.nodes:
            ids = ",".join(node.instance_ids) or "-"
            ssh = f" ssh {node.ssh.user}@{node.ssh.host}:{node.ssh.port}" if node.ssh else ""
            lines.append(
                f"    attempt {node.attempt} node {node.node_index} {node.vm} "
                f"[{node.provider}/{node.region}] {ids}: {node.status}{ssh}"
            )
            if node.worker_id and node.capabilities:
                lines.append(
                    f"      worker {node.worker_id}: {capabilities_text(node.capabilities)}"
                )
    if status.existing_workers:
        lines.append("  existing workers:")
        for worker in status.existing_workers:
            lines.append(
                f"    {worker.worker_id} ({worker.label or '-'}): "
                f"{capabilities_text(worker.capabilities)}"
            )
    if status.leaks:
        lines.append("  POSSIBLE LEAKS (teardown did not confirm):")
        lines += [f"    {leak}" for leak in status.leaks]
    if status.error:
        lines.append(f"  error: {status.error}")
    return "\n".join(lines)


def offers_text(offers: list[Offer]) -> str:
    if not offers:
        return "no compatible offers"
    rows = [f"{'offer':40} {'gpu':>10} {'vcpus':>6} {'mem GB':>7}  price"]
    for offer in offers:
        gpu = f"{offer.gpu_count}x{offer.gpu_name or '-'}"
        rows.append(
            f"{offer.id:40} {gpu:>10} {offer.vcpus or '-':>6} {offer.memory_gb or '-':>7}  "
            f"{price_text(offer)}"
        )
    return "\n".join(rows)


def orphans_text(orphans: list[OrphanRecord], *, include_resolved: bool = False) -> str:
    """Two lines per possible orphan: where and what, then the last error."""
    if not orphans:
        return "no orphans" if include_resolved else "no open orphans"
    lines = []
    for orphan in orphans:
        ids = ", ".join(orphan.instance_ids) or "no ids"
        state = f"resolved {_when(orphan.resolved_at)}" if orphan.resolved_at else "OPEN"
        lines.append(
            f"{orphan.provider}/{orphan.region} {orphan.vm} [{ids}] first seen "
            f"{_when(orphan.first_seen)}, attempts {orphan.attempts}, {state}"
        )
        lines.append(f"    last error: {orphan.last_error}")
    return "\n".join(lines)


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def health_text(reports: list[HealthReport]) -> str:
    """One line per machine with its verdict, then its findings (most severe first)."""
    order = {Severity.CRITICAL: 0, Severity.WARN: 1, Severity.INFO: 2}
    lines = []
    for report in reports:
        lines.append(f"{report.vm}: {report.verdict.value}")
        for finding in sorted(report.findings, key=lambda f: order[f.severity]):
            lines.append(f"    {finding.severity.value:8} {finding.code}: {finding.message}")
    return "\n".join(lines) or "no machines"

"""Billed idle: the seconds a rented machine is billed while the one being waited on is gpuprov,
not the cloud and not the work, from a scenario's call trace (bench/cloud.py) and clocks.

For a node:
- **up**: from the cloud's answer to its create (billing starts) to its work's start (for a
  job that only leases machines, to the job's ready: the machine is the user's from then), less
  the cloud's own boot (`boot_delay_seconds`);
- **down**: from the work's end (or the release) to gpuprov confirming it gone (the `cleanup`
  call, made once the machine is seen gone), less the cloud's own delete (the delete call
  itself and `delete_delay_seconds`).
Where the nodes run agents (bench/handover.py), up splits into **registration** (the cloud's
boot done to the node's agent registered), **placement** (registered to its work written:
waiting for the job's last node and the job's own steps) and **hand-over** (written to
started). GPU-seconds are node-seconds times the node's GPUs.

Nothing here asserts; the report turns these into tables (bench/billed_idle_report.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bench.cloud import CallRecord


@dataclass(frozen=True)
class NodeIdle:
    """One node's billed idle, seconds; phases None where the scenario has none."""

    vm: str
    up: float
    down: float | None
    registration: float | None = None
    placement: float | None = None
    handover: float | None = None

    @property
    def total(self) -> float:
        return self.up + (self.down or 0.0)


@dataclass(frozen=True)
class CloudCalls:
    """The calls on one VM that the definitions need (wall-clock seconds)."""

    created: float  # the successful create's end: the machine exists, billing starts
    delete_started: float | None
    delete_took: float  # the delete call itself: the cloud's, not gpuprov's
    confirmed: float | None  # the cleanup call's start: gone, seen by whoever drives it


def calls_of(calls: Iterable[CallRecord]) -> dict[str, CloudCalls]:
    """Each VM's create, first delete and cleanup, from a trace."""
    created: dict[str, float] = {}
    deletes: dict[str, CallRecord] = {}
    cleanups: dict[str, float] = {}
    for call in calls:
        if call.vm is None or call.error is not None:
            continue
        if call.primitive == "create":
            created[call.vm] = call.ended
        elif call.primitive == "delete" and call.vm not in deletes:
            deletes[call.vm] = call
        elif call.primitive == "cleanup" and call.vm not in cleanups:
            cleanups[call.vm] = call.started
    return {
        vm: CloudCalls(
            created=at,
            delete_started=deletes[vm].started if vm in deletes else None,
            delete_took=deletes[vm].ended - deletes[vm].started if vm in deletes else 0.0,
            confirmed=cleanups.get(vm),
        )
        for vm, at in created.items()
    }


def down_idle(calls: CloudCalls, work_ended: float | None, delete_delay: float) -> float | None:
    """From the work's end (or release) to confirmed gone, less the cloud's own delete."""
    if work_ended is None or calls.confirmed is None:
        return None
    return max(0.0, calls.confirmed - work_ended - calls.delete_took - delete_delay)


def lease_idle(
    ready: float | None,
    released: float | None,
    calls: CloudCalls,
    boot_delay: float,
    delete_delay: float,
    vm: str,
) -> NodeIdle | None:
    """A node of a job that leases it: up to the job's ready, down from its release."""
    if ready is None:
        return None
    up = max(0.0, ready - calls.created - boot_delay)
    return NodeIdle(vm=vm, up=up, down=down_idle(calls, released, delete_delay))


def worked_idle(
    calls: CloudCalls,
    registered: float,
    written: float,
    started: float,
    ended: float | None,
    boot_delay: float,
    delete_delay: float,
    vm: str,
) -> NodeIdle:
    """A node that ran work: up split at its registration and its work's writing."""
    booted = calls.created + boot_delay
    registration = max(0.0, registered - booted)
    placement = max(0.0, written - max(registered, booted))
    handover = max(0.0, started - max(written, booted))
    return NodeIdle(
        vm=vm,
        up=registration + placement + handover,
        down=down_idle(calls, ended, delete_delay),
        registration=registration,
        placement=placement,
        handover=handover,
    )

"""The billed-idle arithmetic (bench/billed_idle.py) on traces made by hand: what is the cloud's
is left out, what is gpuprov's is counted, and phases add up."""

from __future__ import annotations

import pytest

from bench.billed_idle import calls_of, lease_idle, worked_idle
from bench.cloud import CallRecord


def call(primitive: str, started: float, ended: float, vm: str = "j-a1-n0", error=None):
    return CallRecord(primitive, "r1", vm, started, ended, error)


TRACE = [
    call("create", 10.0, 10.5, error="capacity"),  # failed: billing never started there
    call("create", 11.0, 11.2),
    call("observe", 12.0, 12.1),
    call("delete", 20.0, 20.3),
    call("delete", 21.0, 21.1),  # a repeat: the first one counts
    call("cleanup", 22.0, 22.1),
    call("create", 11.0, 11.4, vm="other"),
]


def test_a_leased_node_is_billed_idle_from_boot_done_to_ready_and_from_release_to_gone():
    calls = calls_of(TRACE)["j-a1-n0"]
    assert (calls.created, calls.delete_started, calls.confirmed) == (11.2, 20.0, 22.0)
    node = lease_idle(13.7, 19.0, calls, boot_delay=2.0, delete_delay=1.0, vm="j-a1-n0")
    assert node is not None
    # up: ready 13.7 - (create answered 11.2 + boot 2.0); down: confirmed 22.0 - release
    # 19.0 - (delete call 0.3 + delete delay 1.0)
    assert node.up == pytest.approx(0.5) and node.down == pytest.approx(1.7)
    assert node.total == pytest.approx(2.2)
    assert lease_idle(None, None, calls, 2.0, 1.0, "j-a1-n0") is None  # never ready
    unconfirmed = calls_of(TRACE)["other"]
    assert lease_idle(12.0, 13.0, unconfirmed, 0.0, 0.0, "other").down is None  # type: ignore[union-attr]


def test_a_worked_node_splits_its_wait_into_registration_placement_and_hand_over():
    calls = calls_of(TRACE)["j-a1-n0"]
    node = worked_idle(
        calls, registered=14.0, written=15.5, started=15.75, ended=19.0,
        boot_delay=2.0, delete_delay=1.0, vm="j-a1-n0",
    )  # fmt: skip
    assert node.registration == pytest.approx(0.8)  # boot done at 13.2
    assert node.placement == pytest.approx(1.5) and node.handover == pytest.approx(0.25)
    assert node.up == pytest.approx(2.55) and node.down == pytest.approx(1.7)
    # an agent that registered before the cloud's boot would be done waits for nobody
    early = worked_idle(calls, 12.0, 13.0, 13.5, None, 2.0, 1.0, "j-a1-n0")
    assert (early.registration, early.placement) == (0.0, 0.0)
    assert early.handover == pytest.approx(0.3) and early.down is None

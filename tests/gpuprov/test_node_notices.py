"""The agent's watch of the cloud's notices (gpuprov/node/notices.py) against a metadata
server on loopback that answers with EC2's (IMDSv2) and GCE's documented paths and bodies
(tests/metadata.py): what each notice becomes, IMDSv2's token and its expiry, GCE's hanging
GET, and a metadata service that is down or says nonsense (no notice, never an exception)."""

from __future__ import annotations

import threading

import pytest

from gpuprov.cli.dev import free_port
from gpuprov.node.notices import NoticeWatcher, Unanswered
from gpuprov.node.work_runner import ends_the_machine
from tests.metadata import MetadataServer


@pytest.fixture
def metadata():
    with MetadataServer() as server:
        yield server


def test_no_notice_is_no_notice(metadata: MetadataServer):
    assert NoticeWatcher("ec2", metadata.url).check() == []
    assert NoticeWatcher("gce", metadata.url).check() == []


def test_an_ec2_spot_interruption_is_a_reclaim_with_its_deadline(metadata: MetadataServer):
    metadata.set_ec2(
        "spot/instance-action", {"action": "terminate", "time": "2026-12-02T12:02:00Z"}
    )
    metadata.set_ec2("events/recommendations/rebalance", {"noticeTime": "2026-12-02T11:50:00Z"})
    [reclaim, rebalance] = NoticeWatcher("ec2", metadata.url).check()  # most urgent first
    assert reclaim == {
        "kind": "reclaim",
        "source": "ec2",
        "action": "terminate",
        "deadline": "2026-12-02T12:02:00Z",
        "detail": "EC2 spot instance-action: terminate at 2026-12-02T12:02:00Z",
    }
    assert (rebalance["kind"], rebalance["deadline"]) == ("rebalance", None)
    assert ends_the_machine(reclaim) and not ends_the_machine(rebalance)


def test_an_ec2_scheduled_event_is_maintenance_and_a_completed_one_is_nothing(
    metadata: MetadataServer,
):
    metadata.set_ec2(
        "events/maintenance/scheduled",
        [
            {"Code": "system-reboot", "NotBefore": "21 Jan 2027 09:00:43 GMT", "State": "active"},
            {"Code": "instance-stop", "NotBefore": "1 Jan 2026 09:00:00 GMT", "State": "completed"},
        ],
    )
    [event] = NoticeWatcher("ec2", metadata.url).check()
    assert (event["kind"], event["action"], event["deadline"]) == (
        "maintenance",
        "system-reboot",
        "2027-01-21T09:00:43Z",
    )
    assert not ends_the_machine(event)


def test_imdsv2_gets_a_token_first_and_a_new_one_when_it_expires(metadata: MetadataServer):
    watcher = NoticeWatcher("ec2", metadata.url)
    watcher.check()
    assert metadata.requests["/latest/api/token"] == 1
    watcher.check()
    assert metadata.requests["/latest/api/token"] == 1  # kept while it lives
    metadata.tokens.clear()  # expired: every GET with it is 401 now
    metadata.set_ec2("spot/instance-action", {"action": "stop", "time": "2026-12-02T12:02:00Z"})
    [notice] = watcher.check()
    assert notice["action"] == "stop" and metadata.requests["/latest/api/token"] == 2


def test_a_gce_preemption_arrives_through_the_hanging_get_within_a_poll(
    metadata: MetadataServer,
):
    watcher = NoticeWatcher("gce", metadata.url, poll_seconds=3600)  # no poll could see it
    heard: list[list] = []
    arrived, stop = threading.Event(), threading.Event()

    asked: list[int] = []  # the flag's GETs so far, when each change was heard

    def on_notice(notices: list) -> None:
        heard.append(notices)
        asked.append(metadata.requests["/computeMetadata/v1/instance/preempted"])
        arrived.set()

    thread = threading.Thread(target=watcher.watch, args=(on_notice, stop), daemon=True)
    thread.start()
    try:
        # the first look, then a hanging GET on the flag
        while metadata.requests["/computeMetadata/v1/instance/preempted"] < 2:
            threading.Event().wait(0.05)
        metadata.set_gce("preempted", "TRUE")
        assert arrived.wait(10), "the preemption never arrived"
    finally:
        stop.set()
        metadata.set_gce("preempted", "FALSE")  # the hanging GET answers: the watch ends
        thread.join(10)
    [notice] = heard[0]
    assert (notice["kind"], notice["source"], notice["action"]) == ("reclaim", "gce", "preempted")
    assert notice["deadline"] is not None
    assert asked[0] == 2  # the hanging GET itself answered: no third ask
    assert not thread.is_alive()


def test_a_gce_maintenance_that_stops_the_machine_ends_it_and_a_migration_does_not(
    metadata: MetadataServer,
):
    watcher = NoticeWatcher("gce", metadata.url)
    metadata.set_gce("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    [stops] = watcher.check()
    metadata.set_gce("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    [migrates] = watcher.check()
    assert (stops["kind"], ends_the_machine(stops)) == ("maintenance", True)
    assert (migrates["kind"], ends_the_machine(migrates)) == ("maintenance", False)


def test_a_metadata_service_that_is_down_or_talks_nonsense_gives_no_notice():
    down = NoticeWatcher("ec2", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(Unanswered):
        down.check()
    stop = threading.Event()
    stop.set()
    down.watch(lambda notices: pytest.fail("no notice"), stop)  # ends at once, raises nothing
    with MetadataServer() as metadata:
        metadata.ec2["spot/instance-action"] = "{not json"
        metadata.ec2["events/maintenance/scheduled"] = '"a string"'
        assert NoticeWatcher("ec2", metadata.url).check() == []
    with pytest.raises(ValueError, match="ec2 or gce"):
        NoticeWatcher("azure")

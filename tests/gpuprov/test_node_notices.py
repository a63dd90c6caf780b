"""The agent's notice watcher against a loopback metadata server that answers each cloud's
documented paths and bodies: IMDSv2's session token (401 without a valid one), GCE's
Metadata-Flavor header and its hanging get (wait_for_change, last_etag, timeout_sec)."""

from __future__ import annotations

import datetime
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuprov.node import notices
from gpuprov.node.cli import _parser
from gpuprov.node.notices import NoticeWatcher

TOKEN_PREFIX = "AQAEAsecret-imds-token-"
TERMINATE = {"action": "terminate", "time": "2026-03-01T08:22:00Z"}  # the documented shape


class Metadata:
    """What the fake metadata service says, changed by the test while the watcher runs."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.closing = False
        self.tokens: set[str] = set()
        self.issued = 0
        self.ec2: dict[str, tuple[int, str]] = {}  # path -> (status, body); missing: 404
        self.gce: dict[str, tuple[str, int]] = {  # path -> (value, etag generation)
            notices.GCE_PREEMPTED: ("FALSE", 1),
            notices.GCE_MAINTENANCE: ("NONE", 1),
        }
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, query)
        self.hanging = 0  # GCE hanging gets waiting now

    def set_ec2(self, path: str, body: object, status: int = 200) -> None:
        with self.changed:
            self.ec2[path] = (status, body if isinstance(body, str) else json.dumps(body))

    def set_gce(self, path: str, value: str) -> None:
        with self.changed:
            self.gce[path] = (value, self.gce[path][1] + 1)
            self.changed.notify_all()

    def expire_tokens(self) -> None:
        with self.changed:
            self.tokens.clear()

    def asked(self, path: str, method: str = "GET") -> list[dict]:
        with self.changed:
            return [query for m, p, query in self.requests if p == path and m == method]

    def close(self) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()


def _handler(metadata: Metadata) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, body: str, etag: str | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            if etag:
                self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(data)

        def _record(self) -> tuple[str, dict]:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            with metadata.changed:
                metadata.requests.append((self.command, url.path, query))
            return url.path, query

        def do_PUT(self) -> None:
            path, _ = self._record()
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if path != notices.EC2_TOKEN or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return self._answer(400, "")
            with metadata.changed:
                metadata.issued += 1
                token = f"{TOKEN_PREFIX}{metadata.issued}"
                metadata.tokens.add(token)
            self._answer(200, token)

        def do_GET(self) -> None:
            path, query = self._record()
            if path.startswith("/computeMetadata/"):
                return self._gce(path, query)
            with metadata.changed:
                valid = self.headers.get("X-aws-ec2-metadata-token") in metadata.tokens
                status, body = metadata.ec2.get(path, (404, "Not Found"))
            self._answer(status if valid else 401, body if valid else "")

        def _gce(self, path: str, query: dict) -> None:
            if self.headers.get("Metadata-Flavor") != "Google" or path not in metadata.gce:
                return self._answer(403 if path in metadata.gce else 404, "")
            with metadata.changed:
                value, generation = metadata.gce[path]
                if query.get("wait_for_change") == "true" and query.get("last_etag") == str(
                    generation
                ):
                    metadata.hanging += 1
                    metadata.changed.notify_all()
                    metadata.changed.wait_for(
                        lambda: metadata.closing or metadata.gce[path][1] != generation,
                        timeout=float(query.get("timeout_sec", "60")),
                    )
                    metadata.hanging -= 1
                value, generation = metadata.gce[path]
            self._answer(200, value, etag=str(generation))

    return Handler


@pytest.fixture
def metadata() -> Iterator[tuple[Metadata, str]]:
    """The fake service on 127.0.0.1 (a free port) and its URL; stopped after the test, every
    hanging get let go."""
    state = Metadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), name="fake-metadata")
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        state.close()
        server.shutdown()
        server.server_close()
        thread.join(5)
        assert not thread.is_alive()


@pytest.fixture
def watching() -> Iterator:
    """start(watcher, metadata) runs watcher.watch in a thread; the notices it reports arrive
    in a list. After the test the thread is stopped (its hanging get let go), and found so."""
    started: list[tuple[threading.Thread, threading.Event, Metadata | None]] = []

    def start(
        watcher: NoticeWatcher, state: Metadata | None = None
    ) -> tuple[list[list[dict]], threading.Event]:
        seen: list[list[dict]] = []
        stop = threading.Event()
        thread = threading.Thread(target=watcher.watch, args=(seen.append, stop), name="watch")
        thread.start()
        started.append((thread, stop, state))
        return seen, stop

    yield start
    for _, stop, state in started:
        stop.set()
        if state is not None:
            state.close()
    for thread, _, _ in started:
        thread.join(5)
        assert not thread.is_alive(), "watch() did not stop"


def _until(condition, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def _seconds_from_now(iso: str) -> float:
    moment = datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    return (moment - now).total_seconds()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------- EC2 (IMDSv2)


def test_ec2_without_any_notice_has_none_and_keeps_its_token(metadata):
    state, url = metadata
    watcher = NoticeWatcher("ec2", url)
    assert watcher.check() == [] and watcher.check() == []
    assert len(state.asked(notices.EC2_TOKEN, "PUT")) == 1  # one session token, reused
    assert len(state.asked(notices.EC2_INSTANCE_ACTION)) == 2


def test_ec2_spot_terminate_is_a_reclaim_with_the_clouds_time(metadata):
    state, url = metadata
    state.set_ec2(notices.EC2_INSTANCE_ACTION, TERMINATE)
    assert NoticeWatcher("ec2", url).check() == [
        {
            "kind": "reclaim",
            "source": "ec2",
            "action": "terminate",
            "deadline": "2026-03-01T08:22:00Z",
            "detail": "EC2 spot instance-action: terminate at 2026-03-01T08:22:00Z",
        }
    ]


def test_ec2_rebalance_recommendation_has_no_deadline(metadata):
    state, url = metadata
    state.set_ec2(notices.EC2_REBALANCE, {"noticeTime": "2026-03-01T08:17:00Z"})
    [notice] = NoticeWatcher("ec2", url).check()
    assert notice["kind"] == "rebalance" and notice["source"] == "ec2"
    assert notice["action"] == "rebalance" and notice["deadline"] is None
    assert "2026-03-01T08:17:00Z" in notice["detail"]


def test_ec2_scheduled_maintenance_counts_only_active_events(metadata):
    state, url = metadata
    event = {
        "Code": "system-reboot",
        "Description": "scheduled reboot",
        "EventId": "instance-event-0d59937288b749b32",
        "NotBefore": "21 Jan 2027 09:00:43 GMT",
        "NotAfter": "21 Jan 2027 09:17:23 GMT",
        "State": "active",
    }
    done = {**event, "Code": "instance-stop", "State": "completed", "Description": "[Completed]"}
    state.set_ec2(notices.EC2_SCHEDULED, [done, event])
    [notice] = NoticeWatcher("ec2", url).check()
    assert (notice["kind"], notice["action"]) == ("maintenance", "system-reboot")
    assert notice["deadline"] == "2027-01-21T09:00:43Z"
    assert "scheduled reboot" in notice["detail"]


def test_ec2_notices_come_most_urgent_first(metadata):
    state, url = metadata
    state.set_ec2(notices.EC2_REBALANCE, {"noticeTime": "2026-03-01T08:17:00Z"})
    state.set_ec2(
        notices.EC2_SCHEDULED,
        [{"Code": "instance-reboot", "NotBefore": "21 Jan 2027 09:00:43 GMT", "State": "active"}],
    )
    state.set_ec2(notices.EC2_INSTANCE_ACTION, {"action": "stop", "time": "2026-03-01T08:22:00Z"})
    kinds = [notice["kind"] for notice in NoticeWatcher("ec2", url).check()]
    assert kinds == ["reclaim", "maintenance", "rebalance"]


def test_ec2_token_that_expires_mid_watch_is_fetched_again(metadata, watching, caplog):
    caplog.set_level(logging.DEBUG)
    state, url = metadata
    seen, _ = watching(NoticeWatcher("ec2", url, poll_seconds=0.02), state)
    _until(lambda: len(state.asked(notices.EC2_INSTANCE_ACTION)) >= 2)
    state.expire_tokens()  # every GET now answers 401 until a new token is asked for
    state.set_ec2(notices.EC2_INSTANCE_ACTION, {**TERMINATE, "action": "hibernate"})
    _until(lambda: seen)
    assert [notice["action"] for notice in seen[0]] == ["hibernate"]
    assert len(state.asked(notices.EC2_TOKEN, "PUT")) == 2
    assert TOKEN_PREFIX not in caplog.text


def test_ec2_watch_reports_a_notice_and_its_end(metadata, watching):
    state, url = metadata
    seen, _ = watching(NoticeWatcher("ec2", url, poll_seconds=0.02), state)
    _until(lambda: len(state.asked(notices.EC2_REBALANCE)) >= 2)
    assert seen == []  # the first, empty set is not a change
    state.set_ec2(notices.EC2_REBALANCE, {"noticeTime": "2026-03-01T08:17:00Z"})
    _until(lambda: len(seen) == 1)
    state.set_ec2(notices.EC2_REBALANCE, "Not Found", status=404)
    _until(lambda: len(seen) == 2)
    assert [notice["kind"] for notice in seen[0]] == ["rebalance"] and seen[1] == []
    time.sleep(0.1)
    assert len(seen) == 2  # the same notices again are not reported again


@pytest.mark.parametrize(
    "path, body",
    [
        (notices.EC2_INSTANCE_ACTION, "<html>captive portal</html>"),
        (notices.EC2_INSTANCE_ACTION, {"time": "2026-03-01T08:22:00Z"}),
        (notices.EC2_INSTANCE_ACTION, ["terminate"]),
        (notices.EC2_REBALANCE, "not json"),
        (notices.EC2_SCHEDULED, {"Code": "system-reboot"}),
        (notices.EC2_SCHEDULED, [42, {"State": "active"}, {"Code": 7, "State": "active"}]),
    ],
)
def test_ec2_malformed_bodies_give_no_notice_and_no_exception(metadata, caplog, path, body):
    state, url = metadata
    state.set_ec2(path, body)
    assert NoticeWatcher("ec2", url).check() == []


def test_ec2_unreadable_time_keeps_the_action_without_a_deadline(metadata):
    state, url = metadata
    state.set_ec2(notices.EC2_INSTANCE_ACTION, {"action": "terminate", "time": "soon"})
    [notice] = NoticeWatcher("ec2", url).check()
    assert (notice["kind"], notice["action"], notice["deadline"]) == ("reclaim", "terminate", None)


def test_a_notice_outlives_a_metadata_outage(metadata):
    state, url = metadata
    state.set_ec2(notices.EC2_INSTANCE_ACTION, TERMINATE)
    watcher = NoticeWatcher("ec2", url)
    first = watcher.check()
    state.set_ec2(notices.EC2_INSTANCE_ACTION, "", status=503)
    assert watcher.check() == first  # what it said last still counts


# ---------------------------------------------------------------- GCE


def test_gce_without_any_notice_has_none(metadata):
    state, url = metadata
    assert NoticeWatcher("gce", url).check() == []
    assert state.asked(notices.GCE_PREEMPTED) and state.asked(notices.GCE_MAINTENANCE)


def test_gce_preemption_arrives_through_the_hanging_get(metadata, watching):
    state, url = metadata
    # a poll interval far longer than the test: only the hang can bring the notice in time
    seen, _ = watching(NoticeWatcher("gce", url, poll_seconds=30), state)
    _until(lambda: state.hanging == 1)
    hangs = state.asked(notices.GCE_PREEMPTED)
    assert hangs[1] == {"wait_for_change": "true", "timeout_sec": "30", "last_etag": "1"}
    state.set_gce(notices.GCE_PREEMPTED, "TRUE")
    _until(lambda: seen, seconds=1.5)
    assert len(state.asked(notices.GCE_PREEMPTED)) in (2, 3)  # the plain read, the hang (, next)
    [notice] = seen[0]
    assert notice["kind"] == "reclaim" and notice["source"] == "gce"
    assert notice["action"] == "preempted"
    assert 25 <= _seconds_from_now(notice["deadline"]) <= 31  # GCE's ~30 s: now + 30 s


def test_gce_preemption_deadline_is_fixed_when_first_seen(metadata, monkeypatch):
    state, url = metadata
    state.set_gce(notices.GCE_PREEMPTED, "TRUE")
    watcher = NoticeWatcher("gce", url)
    first = watcher.check()
    monkeypatch.setattr(notices, "GCE_RECLAIM_NOTICE", 3600.0)  # a new deadline would move
    assert watcher.check() == first


def test_gce_terminate_maintenance_is_a_maintenance_in_the_clouds_words(metadata):
    state, url = metadata
    state.set_gce(notices.GCE_MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE")
    [notice] = NoticeWatcher("gce", url).check()
    assert notice["kind"] == "maintenance" and notice["source"] == "gce"
    assert notice["action"] == "TERMINATE_ON_HOST_MAINTENANCE" and notice["deadline"] is None


def test_gce_migrate_maintenance_and_a_preemption_together(metadata):
    state, url = metadata
    state.set_gce(notices.GCE_MAINTENANCE, "MIGRATE_ON_HOST_MAINTENANCE")
    state.set_gce(notices.GCE_PREEMPTED, "TRUE")
    found = NoticeWatcher("gce", url).check()
    assert [(n["kind"], n["action"]) for n in found] == [
        ("reclaim", "preempted"),
        ("maintenance", "MIGRATE_ON_HOST_MAINTENANCE"),
    ]


@pytest.mark.parametrize(
    "path, value",
    [
        (notices.GCE_PREEMPTED, "maybe"),
        (notices.GCE_PREEMPTED, ""),
        (notices.GCE_MAINTENANCE, "<html>not the metadata server</html>"),
    ],
)
def test_gce_malformed_values_give_no_notice_and_no_exception(metadata, path, value):
    state, url = metadata
    state.set_gce(path, value)
    assert NoticeWatcher("gce", url).check() == []


def test_gce_without_the_google_header_is_refused(metadata):
    _, url = metadata  # the fake refuses it, as GCE does: the watcher always sends it
    status, _, _ = NoticeWatcher("gce", url)._request(notices.GCE_PREEMPTED, {})
    assert status == 403


# ---------------------------------------------------------------- no metadata at all


@pytest.mark.parametrize("source", ["ec2", "gce"])
def test_metadata_down_gives_no_notice_and_logs_once(source, caplog):
    caplog.set_level(logging.INFO, logger=notices.__name__)
    watcher = NoticeWatcher(source, f"http://127.0.0.1:{_free_port()}")
    assert [watcher.check() for _ in range(3)] == [[], [], []]
    warned = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == (1 if source == "ec2" else 2)  # once an endpoint: EC2's token, GCE's two


def test_metadata_that_never_answers_times_out(monkeypatch):
    monkeypatch.setattr(notices, "HTTP_TIMEOUT", 0.2)
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        started = time.monotonic()
        assert NoticeWatcher("ec2", f"http://127.0.0.1:{silent.getsockname()[1]}").check() == []
        assert time.monotonic() - started < 1.5


def test_watch_on_a_machine_without_metadata_stops_cleanly(watching):
    seen, stop = watching(NoticeWatcher("gce", f"http://127.0.0.1:{_free_port()}", 0.02))
    time.sleep(0.1)
    stop.set()
    assert seen == []


def test_source_none_never_asks_anything():
    watcher = NoticeWatcher("none")
    assert watcher.check() == []
    stop = threading.Event()
    stop.set()
    watcher.watch(lambda found: pytest.fail("no notices without a source"), stop)


def test_a_failing_handler_is_called_again_next_round(metadata, watching, caplog):
    state, url = metadata
    state.set_ec2(notices.EC2_REBALANCE, {"noticeTime": "2026-03-01T08:17:00Z"})
    calls: list[list[dict]] = []

    def handler(found: list[dict]) -> None:
        calls.append(found)
        if len(calls) == 1:
            raise RuntimeError("heartbeat busy")

    watcher = NoticeWatcher("ec2", url, poll_seconds=0.02)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.watch, args=(handler, stop))
    thread.start()
    try:
        _until(lambda: len(calls) >= 2)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive() and calls[0] == calls[1]
    assert "notice handler failed" in caplog.text


def test_a_source_or_url_it_cannot_use_is_refused():
    with pytest.raises(ValueError, match="one of ec2, gce, none"):
        NoticeWatcher("azure")
    with pytest.raises(ValueError, match="http"):
        NoticeWatcher("ec2", "169.254.169.254")


# ---------------------------------------------------------------- the command line


def test_run_takes_the_notice_source_and_the_metadata_url():
    args = _parser().parse_args(["run"])
    assert (args.notices, args.metadata_url) == ("none", None)
    args = _parser().parse_args(["run", "--notices", "gce", "--metadata-url", "http://10.0.0.9"])
    assert (args.notices, args.metadata_url) == ("gce", "http://10.0.0.9")
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--notices", "azure"])

"""`WorkRunner`, the thread beside the heartbeats that runs the node's part of a job: reads the
assignment, reports the start before starting it, ships the output, reports the end once all of
it is through and the work's processes are gone, and follows a work again after a restart.

Its second thread watches the node's lease (lease.py): a work whose node has been cut off from
the API for longer is stopped (SIGTERM, the grace period, SIGKILL), and no work starts while
the lease is over; the end is reported, with `lease_lapsed`, once the API can be reached again.

The cloud's notices (notices.py, on a thread of their own) reach it through `noticed`: the
heartbeats carry the most urgent one, and one that says the machine goes away is written to the
work's notice file ($GPUPROV_NOTICE_FILE) before the work gets SIGTERM, with the time left
before the cloud acts as its grace period; no work starts on such a machine.
"""

from __future__ import annotations

import calendar
import contextlib
import datetime
import logging
import os
import shutil
import threading
import time

from .errors import AgentError
from .http_client import MAX_PAUSE, backoff, until_through
from .lease import Lease
from .notices import ends_the_machine
from .work import TAIL_CHARS, Work
from .workdir import ASSIGNMENT_FILE, WORK_SUBDIR, read_json, write_json

log = logging.getLogger(__name__)

WORK_POLL = 5.0  # seconds between reads of the assignment while busy or running
# While reserved with no work: each read is a long poll the API holds this long, answered the
# moment the work is written (gpuprov/api/work_waits.py), then the next begins at once.
LONG_POLL = 25.0
SHIP_EVERY = 1.0  # seconds between sends of new output
WORK_HTTP_TIMEOUT = 15.0
LEASE_CHECK = 0.5  # seconds between looks at the lease while a work runs


class WorkRunner:
    """The node's work, on a thread beside the heartbeats: pulls the assignment, starts it
    through `supervise` (never one work twice), sends its output, stops it when asked and
    reports its end. A report the control plane does not take is retried until it does."""

    def __init__(self, call: object, state_dir: str) -> None:
        self.call = call  # (path, body or None, what) -> the answer; AgentError on failure
        self.root = os.path.join(state_dir, WORK_SUBDIR)
        self.work: Work | None = None
        self.watching = False  # the worker is reserved or busy: work may come
        self.poll_every, self.next_poll = WORK_POLL, 0.0
        self.again = False  # a long poll ended empty: the next one begins without a pause
        self.named: str | None = None  # the work the latest heartbeat named
        self.wake, self.revoked = threading.Event(), threading.Event()
        self.lease = Lease(state_dir)
        self.notice: dict | None = None  # the cloud's most urgent notice now, for heartbeats
        self.news = threading.Event()  # a heartbeat should go now: a notice came or changed

    def heard(self, answer: dict, interval: float, sent_at: float) -> None:
        """A heartbeat's answer (the heartbeat thread), to the heartbeat sent at `sent_at`
        (time.monotonic()): it renews the lease, and a stop request reaches the work now."""
        self.lease.renew(sent_at, answer.get("lease_seconds"))
        self.watching = answer.get("state") in ("reserved", "busy")
        self.poll_every = min(WORK_POLL, interval)
        work, work_id = self.work, answer.get("work_id")
        self.named = work_id
        if work is not None and work_id == work.id and answer.get("stop_requested"):
            work.stop()
        elif work is None and work_id:
            self.next_poll = 0.0
            self.wake.set()

    def loop(self) -> None:
        failures = 0
        while not self.revoked.is_set():
            try:
                self._step()
                failures = 0
            except AgentError as error:
                if error.status == 401:
                    return self.shut_down()
                failures += 1
                if failures % 10 == 1:
                    log.warning("%s; retrying", error)
                # Backing off on 429 and 5xx, never sooner than the answer's Retry-After.
                time.sleep(max(backoff(failures, MAX_PAUSE), error.retry_after or 0.0))
            if self.again:
                self.again = False
                continue
            self.wake.wait(SHIP_EVERY)
            self.wake.clear()

    def noticed(self, notices: list) -> None:
        """The cloud's notices changed (most urgent first; the notice watcher's thread)."""
        self.notice = notices[0] if notices else None
        self.news.set()
        work = self.work
        if work is not None and work.spawned and ends_the_machine(self.notice):
            self._hand_notice(work)

    def _hand_notice(self, work: Work) -> None:
        notice = self.notice
        if notice is None or not work.running():
            return
        log.warning("work %s: %s: stopping it", work.id, notice.get("detail") or notice)
        work.hear_notice(notice, seconds_until(notice.get("deadline")))

    def watch_lease(self) -> None:
        """The lease's watch (a thread of its own: the work runner may be stuck on a call to an
        API that does not answer): a running work whose lease is over is stopped."""
        while not self.revoked.wait(LEASE_CHECK):
            work = self.work
            if work is None or not work.spawned or work.lease_lapsed or not self.lease.lapsed():
                continue
            if work.running():
                log.warning("work %s: no answer from the API within the lease: stopping it",
                            work.id)  # fmt: skip
                work.note_lease_lapsed()
                work.stop()

    def shut_down(self) -> None:
        """The credential was refused: whatever still runs is stopped (nobody hears of it)."""
        self.revoked.set()
        work = self.work
        if work is not None:
            work.stop()
            deadline = time.monotonic() + work.grace + 5
            while work.running() and time.monotonic() < deadline:
                time.sleep(0.2)
            work.end()

    def _step(self) -> None:
        work = self.work = self.work or self._unfinished()
        if work is None:
            assignment = None
            if self.watching and not self.named:  # reserved, its work not written yet
                assignment = self._long_poll()
            elif self.watching or not self.next_poll:
                assignment = self._poll()
            if not assignment:
                return
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            os.mkdir(os.path.join(self.root, assignment["id"]), 0o700)
            work = self.work = Work(os.path.join(self.root, assignment["id"]), assignment)
            write_json(work.file(ASSIGNMENT_FILE), assignment)  # known before any start
        if not work.spawned:
            self._start(work)
        elif not work.running():
            self._finish(work)
        else:
            self._ship(work, final=False)
            assignment = self._poll()
            if assignment is not None and (
                assignment.get("id") != work.id or assignment["state"] == "stop_requested"
            ):
                work.stop()  # asked to, or its epoch was given up

    def _poll(self) -> dict | None:
        """The current assignment ({}: none) when a read is due; None when not due."""
        if time.monotonic() < self.next_poll:
            return None
        self.next_poll = time.monotonic() + self.poll_every
        return self.call("/v1/work", None, "reading the work")

    def _long_poll(self) -> dict | None:
        """The assignment, asked for with a long poll: the API answers once it is written, or
        with none ({}) after LONG_POLL seconds; the next poll then begins at once. An API that
        answers none at once (one without long polls) is asked again only after the usual
        pause, so the agent never spins."""
        if time.monotonic() < self.next_poll:
            return None
        began = time.monotonic()
        path = f"/v1/work?wait={LONG_POLL:g}"
        answer = self.call(path, None, "waiting for the work", LONG_POLL + WORK_HTTP_TIMEOUT)
        if not answer and time.monotonic() - began < LONG_POLL / 2:
            self.next_poll = time.monotonic() + self.poll_every
        elif not answer:
            self.again = True
        return answer

    def _unfinished(self) -> Work | None:
        """Work known from before a restart of this agent, whose end it has not reported."""
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(self.root)):
                assignment = read_json(os.path.join(self.root, name, ASSIGNMENT_FILE))
                if assignment:
                    log.info("work %s: known from before a restart; following it", name)
                    return Work(os.path.join(self.root, name), assignment)
        return None

    def _start(self, work: Work) -> None:
        """Report the start, then start it, only within the lease (else: the next step tries
        again). A refusal (stopped or given up before it started) means it never starts."""
        if not self.lease.may_start() or ends_the_machine(self.notice):
            return  # (on a machine the cloud takes back, the job starts its work elsewhere)
        try:
            self._through(f"/v1/work/{work.id}/started", {}, "reporting the start")
        except AgentError as refused:
            return self._done(work, refused)
        if not self.lease.may_start():  # the report took a while: a repeat of it is fine
            return
        log.info("work %s: job %s rank %s: starting", work.id, work.assignment.get("job"),
                 work.assignment.get("rank"))  # fmt: skip
        work.spawn()

    def _ship(self, work: Work, final: bool) -> None:
        """Send what the work printed; `final`: all of it, however long it takes."""
        chunk = work.next_chunk(final)
        while chunk is not None:
            path = f"/v1/work/{work.id}/logs"
            try:
                (self._through if final else self.call)(path, chunk, "sending output")
            except AgentError as error:
                if error.transient or error.status == 401:
                    raise
                log.warning("work %s: %s", work.id, error)  # refused for good: skipped
            work.sent(chunk["data"])
            chunk = work.next_chunk(final)

    def _finish(self, work: Work) -> None:
        work.end()  # what the work left behind ends with it, before anyone hears of the end
        self._ship(work, final=True)
        code, note = work.outcome()
        log.info("work %s: ended with %s", work.id, code)
        body = {"code": code, "tail": (work.tail + (f"\n{note}\n" if note else ""))[-TAIL_CHARS:]}
        if work.lease_lapsed:
            body["lease_lapsed"] = True
        try:
            self._through(f"/v1/work/{work.id}/exit", body, "reporting the end")
        except AgentError as refused:
            return self._done(work, refused)
        self._done(work)

    def _done(self, work: Work, refused: AgentError | None = None) -> None:
        """Its end is reported (or its start refused): the row is over and never handed out
        again, so its directory can go."""
        if refused is not None:
            if refused.status == 401:
                raise refused
            log.warning("work %s: %s", work.id, refused)
        shutil.rmtree(work.directory, ignore_errors=True)
        self.work = None

    def _through(self, path: str, body: dict, what: str) -> dict:
        return until_through(lambda: self.call(path, body, what), what)


def seconds_until(deadline: object) -> float | None:
    """Seconds from now until an ISO-8601 time (None: none, or unreadable)."""
    if not isinstance(deadline, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(deadline.replace("Z", "+00:00"))
    except ValueError:
        return None
    # a time without an offset is UTC (calendar.timegm reads it so on every Python the agent
    # runs on)
    at = calendar.timegm(when.timetuple()) if when.tzinfo is None else when.timestamp()
    return at - time.time()

"""The node's lease (`Lease`): how long its work may go on without an answer from the API.

Each heartbeat the API answers renews it for the `lease_seconds` the answer names, counted from
when that heartbeat was sent (never from its answer: the API counts from its arrival, so the
node's lease always ends first). A node cut off from the API for longer stops its work (the
work runner's watch: SIGTERM, the grace period, SIGKILL) and starts none, so that the control
plane can start the work elsewhere once the lease and the grace period are over, with no two
attempts running at once. An API that grants no lease (an older one) leaves the work alone.

The deadline is kept in <state dir>/lease.json (as wall-clock time), so an agent restarted
while cut off does not grant itself a new lease.
"""

from __future__ import annotations

import os
import threading
import time

from .workdir import read_json, write_json

LEASE_FILE = "lease.json"


class Lease:
    """The lease as this agent last heard it; safe to use from every thread."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LEASE_FILE)
        self._lock = threading.Lock()
        self.known = False  # an answer (or a kept lease) said what the lease is
        self.until: float | None = None  # time.monotonic() deadline; None: no lease granted
        kept = read_json(self.path)
        if kept is not None:
            ends = kept.get("until_wall")
            self.known = True
            if isinstance(ends, (int, float)) and not isinstance(ends, bool):
                self.until = time.monotonic() + (float(ends) - time.time())

    def renew(self, sent_at: float, seconds: object) -> None:
        """A heartbeat sent at `sent_at` (time.monotonic()) was answered, granting `seconds`
        (None or not a number: no lease)."""
        granted = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        until = sent_at + float(seconds) if granted and seconds > 0 else None  # type: ignore[operator]
        with self._lock:
            self.known, self.until = True, until
            wall = time.time() + (until - time.monotonic()) if until is not None else None
        write_json(self.path, {"until_wall": wall})

    def lapsed(self) -> bool:
        """The API granted a lease and it is over: the work must stop."""
        with self._lock:
            return self.until is not None and time.monotonic() >= self.until

    def may_start(self) -> bool:
        """Work may start now: the lease is known and not over."""
        with self._lock:
            return self.known and (self.until is None or time.monotonic() < self.until)

    def left(self) -> float | None:
        """Seconds until it lapses (None: no lease granted, or none known yet)."""
        with self._lock:
            return None if self.until is None else self.until - time.monotonic()

"""One assignment on this node (`Work`): its directory, its supervisor (started in a session and
cgroup of its own), its stop (SIGTERM, the grace period, SIGKILL), its outcome, and its output
cut into chunks that are recorded before they are sent.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import signal
import subprocess
import threading

from .location import self_argv
from .processes import WORK_MARK, new_cgroup, sweep, work_env
from .workdir import (
    CGROUP_FILE,
    CURSOR_FILE,
    EXIT_FILE,
    LEASE_LAPSED_FILE,
    NOTICE_FILE,
    PID_FILE,
    SPAWNING_FILE,
    STREAMS,
    put,
    read_file,
    read_json,
    write_json,
)

log = logging.getLogger(__name__)

CHUNK_BYTES = 32 * 1024  # per log call: well inside the API's 64 KiB body, JSON-escaped
STOP_GRACE = 30.0  # SIGTERM, this long, SIGKILL (the assignment says how long)
UNKNOWN_EXIT = -1  # the work ended, and nobody saw how
NOTICE_ENV = "GPUPROV_NOTICE_FILE"  # in the work's environment: where the cloud's notice goes
TAIL_CHARS = 4000


def _complete_utf8(data: bytes) -> int:
    """The length of the longest prefix of `data` that does not end inside a UTF-8 character
    (the bytes an incremental decoder keeps back, waiting for the rest)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data)
    return len(data) - len(decoder.getstate()[0])


class Work:
    """One assignment on this node: its directory, its process group and cgroup, its output.

    The output is sent in order per stream, a chunk per call, taking turns between the two.
    The chunk about to be sent is recorded first (shipped.json), so an agent restarted
    mid-send sends the same bytes under the same seq again, and the API keeps one of them."""

    def __init__(self, directory: str, assignment: dict) -> None:
        self.directory, self.assignment = directory, assignment
        self.id = str(assignment["id"])
        self.grace = float(assignment.get("stop_grace_seconds", STOP_GRACE))
        self.process: subprocess.Popen | None = None  # the supervisor, if this agent started it
        self.spawned = os.path.exists(self.file(SPAWNING_FILE))
        self.stopping = self.killed = False
        # Held to poll the supervisor and to begin a stop: the heartbeat thread (a stop), the
        # timer (the SIGKILL) and the runner all ask. Unheld, Popen.poll answers "running" to
        # the second caller while the first is waiting on it, and two stops send two SIGTERMs.
        self.lock = threading.RLock()
        self.cursor = read_json(self.file(CURSOR_FILE)) or {"seq": 0, "stdout": 0, "stderr": 0}
        self.tail = ""
        self.cgroup = read_file(self.file(CGROUP_FILE))
        self.pgid: int | None = int(read_file(self.file(PID_FILE)) or 0) or None

    def file(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def lease_lapsed(self) -> bool:
        """This agent stopped the work because the node's lease lapsed."""
        return os.path.exists(self.file(LEASE_LAPSED_FILE))

    def note_lease_lapsed(self) -> None:
        put(self.file(LEASE_LAPSED_FILE), "", os.O_CREAT)

    def hear_notice(self, notice: dict, seconds_left: float | None) -> None:
        """The cloud takes the machine back: the notice goes where the work reads it
        ($GPUPROV_NOTICE_FILE), then SIGTERM, with the time left before the cloud acts (if it
        said, and if longer) as the grace period before SIGKILL."""
        write_json(self.file(NOTICE_FILE), notice)
        if seconds_left is not None and seconds_left > self.grace:
            self.grace = seconds_left
        self.stop()

    def spawn(self) -> None:
        """The supervisor, leading a new session (so a process group of its own) in a cgroup of
        its own, with the work's environment and mark; noted before (spawning) and after
        (pid)."""
        put(self.file(SPAWNING_FILE), "", os.O_CREAT)
        self.spawned = True
        self.cgroup = new_cgroup("gpuprov-" + self.id)
        put(self.file(CGROUP_FILE), self.cgroup, os.O_CREAT)
        env = work_env(
            {
                **(self.assignment["command"].get("env") or {}),
                WORK_MARK: self.id,
                NOTICE_ENV: self.file(NOTICE_FILE),  # written only once a notice comes
            }
        )
        argv = [*self_argv(), "supervise"]
        put(self.file("supervisor.log"), "", os.O_CREAT)  # 0600 before it is opened
        with open(self.file("supervisor.log"), "ab") as output:
            self.process = subprocess.Popen(
                [*argv, self.directory], stdin=subprocess.DEVNULL, stdout=output,
                stderr=output, cwd=env["HOME"] if os.path.isdir(env.get("HOME", "")) else "/",
                env=env, start_new_session=True,
            )  # fmt: skip
        self.pgid = self.process.pid
        put(self.file(PID_FILE), str(self.pgid), os.O_CREAT)

    def running(self) -> bool:
        if self.process is not None:
            with self.lock:
                return self.process.poll() is None
        if self.killed or self.pgid is None or os.path.exists(self.file(EXIT_FILE)):
            return False
        try:
            os.killpg(self.pgid, 0)  # not this agent's child (it restarted): its group is there
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def end(self) -> None:
        """Every process the work started killed: its group, its cgroup, its mark."""
        self.signal(signal.SIGKILL)
        sweep(self.id, self.cgroup)

    def signal(self, signum: int) -> None:
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signum)

    def stop(self) -> None:
        """SIGTERM to the process group; SIGKILL once the grace period has passed."""
        with self.lock:
            if self.stopping or not self.running():
                return
            self.stopping = True
        log.info("work %s: stop requested: SIGTERM, SIGKILL in %gs", self.id, self.grace)
        self.signal(signal.SIGTERM)
        timer = threading.Timer(self.grace, self._kill)
        timer.daemon = True
        timer.start()

    def _kill(self) -> None:
        if self.running():
            log.warning("work %s: still running after %gs: SIGKILL", self.id, self.grace)
            self.killed = True  # first: the runner reads the outcome once the group is gone
            self.end()

    def outcome(self) -> tuple:
        """(exit code, a line for the tail or "") once the work has ended."""
        ended = read_json(self.file(EXIT_FILE))
        if ended is not None:
            code = int(ended.get("code", UNKNOWN_EXIT))
            setup = code and ended.get("phase") == "setup"
            return code, f"gpuprov-agent: setup exited {code}; run did not start" if setup else ""
        if self.killed:
            return -signal.SIGKILL, f"gpuprov-agent: killed after the {self.grace:g}s grace period"
        signalled = self.process.returncode if self.process is not None else None
        if signalled is not None and signalled < 0:  # a stop while the supervisor was starting
            return signalled, "gpuprov-agent: stopped before the work started"
        return UNKNOWN_EXIT, "gpuprov-agent: the work ended without an exit status"

    def next_chunk(self, final: bool) -> dict | None:
        """The chunk to send now ({seq, stream, data}), or None: all sent so far. `final`: the
        work has ended, nothing grows any more."""
        cursor = self.cursor
        if cursor.get("pending") is None:
            for stream in sorted(STREAMS, key=lambda name: name == cursor.get("last")):
                data = self._read(stream, cursor[stream], CHUNK_BYTES)
                size = len(data) if final and len(data) < CHUNK_BYTES else _complete_utf8(data)
                if size:  # never part of a character, unless the work ended with it
                    start = cursor[stream]
                    cursor["pending"] = {"seq": cursor["seq"], "stream": stream,
                                         "start": start, "end": start + size}  # fmt: skip
                    write_json(self.file(CURSOR_FILE), cursor)
                    break
            else:
                return None
        chunk = cursor["pending"]
        data = self._read(chunk["stream"], chunk["start"], chunk["end"] - chunk["start"])
        text = data.decode("utf-8", "replace")
        return {"seq": chunk["seq"], "stream": chunk["stream"], "data": text}

    def sent(self, text: str) -> None:
        """The pending chunk went through (or was refused for good): the next one."""
        chunk = self.cursor.pop("pending")
        stream = chunk["stream"]
        self.cursor.update({"seq": chunk["seq"] + 1, stream: chunk["end"], "last": stream})
        self.tail = (self.tail + text)[-TAIL_CHARS:]
        write_json(self.file(CURSOR_FILE), self.cursor)

    def _read(self, stream: str, start: int, size: int) -> bytes:
        try:
            with open(self.file(stream), "rb") as handle:
                handle.seek(start)
                return handle.read(size)
        except OSError:
            return b""

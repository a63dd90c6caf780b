"""The processes the harness owns: a Temporal dev server and gpuprov workers (and, with
`--database postgresql`, a PostgreSQL server: chaos/postgres.py).

Both run in their own session (a Ctrl-C in the terminal reaches only the harness, which then
stops them in order) and, on Linux, die with the harness even if it is SIGKILLed itself
(PR_SET_PDEATHSIG). `stop()` is idempotent and always ends with SIGKILL if SIGTERM is not
enough, so nothing the harness started outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from temporalio.client import Client

from gpuprov import contract
from gpuprov.engine.binaries import temporal_binary
from gpuprov.sdk.codec import data_converter

REPO = Path(__file__).resolve().parents[1]
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL on a normal stop
_PR_SET_PDEATHSIG = 1


def _child_setup(user: pwd.struct_passwd | None = None) -> None:
    """In the child before exec: the harness blocks its stop signals (chaos/__main__.py) and
    the mask is inherited, so unblock them; become `user` if given (PostgreSQL refuses root);
    and get SIGKILL when the harness dies (Linux; set after the user change, which clears it)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if user is not None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def preexec(user: pwd.struct_passwd | None = None) -> Callable[[], None] | None:
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return lambda: _child_setup(user)


class Child:
    """One subprocess with its log file; restartable."""

    def __init__(
        self,
        name: str,
        args: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        user: pwd.struct_passwd | None = None,
    ):
        self.name = name
        self.args = args
        self.log = log
        self.env = env
        self.user = user  # run as this system user (the harness is root)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.pids: list[int] = []  # one per start

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start it. Call from the event loop's thread, never from asyncio.to_thread: the
        death signal is tied to the thread that forked the child, not to the process."""
        assert not self.running, f"{self.name} already running"
        with self.log.open("ab") as log:
            log.write(f"\n==== chaos: start {self.name} #{self.starts + 1} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                preexec_fn=preexec(self.user),  # must run on the loop thread: see start()
            )
        self.starts += 1
        self.pids.append(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL and reap (a crash, as far as the process can tell)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class DevServer(Child):
    """`temporal server start-dev` on a SQLite file, a fixed port, the four search attributes."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.db_file = data_dir / "temporal.db"
        self.port = port
        args = [
            temporal_binary(),
            "server",
            "start-dev",
            "--db-filename",
            str(self.db_file),
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--headless",
            "--log-level",
            "error",
            *contract.dev_server_args(),
        ]
        super().__init__("temporal dev server", args, data_dir / "temporal.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def wait_ready(self, client: Client | None, timeout: float = 60.0) -> Client:
        """Until the frontend answers (connecting a client the first time)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"the dev server exited:\n{self.log_tail()}")
            try:
                if client is None:
                    client = await Client.connect(self.address, data_converter=data_converter(None))
                if await client.service_client.check_health():
                    # The namespace and search attributes are usable once describe answers.
                    await client.workflow_service.get_system_info(_system_info_request())
                    return client
            except Exception as error:  # any failure here means "not yet"
                last = error
            await asyncio.sleep(0.2)
        raise RuntimeError(f"the dev server did not answer within {timeout}s: {last}")


def _system_info_request():  # type: ignore[no-untyped-def]
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    return GetSystemInfoRequest()


class WorkerProcess(Child):
    """`python worker.py --config <toml>`; the config file can be rewritten between starts.

    With `data_dir`, the worker keeps its own `[temporal] data_dir` there, as a worker on
    another host would (nothing on disk shared with the other workers)."""

    def __init__(
        self, config: Path, log: Path, name: str = "gpuprov worker", data_dir: Path | None = None
    ) -> None:
        env = dict(os.environ)
        env.pop("GPUPROV_CONFIG", None)
        # The harness's environment must not override the worker's config file.
        for variable in list(env):
            if variable.startswith("GPUPROV_"):
                env.pop(variable)
        env["PYTHONUNBUFFERED"] = "1"
        if data_dir is not None:
            env["GPUPROV_TEMPORAL__DATA_DIR"] = str(data_dir)
        args = [sys.executable, str(REPO / "worker.py"), "--config", str(config)]
        super().__init__(name, args, log, env)

    def use_config(self, config: Path) -> None:
        """The config file the next start reads."""
        self.args[-1] = str(config)

"""`run`, the daemon: register once unless a credential is kept (retrying for as long as the
API is out of reach), then heartbeat at the interval the API answers, each with a fresh
verdict and the cloud's latest notice about the machine (notices.py, where `--notices` names a
cloud), and run the node's work beside it (work_runner.py) until the credential is refused
(exit 0) or SIGTERM (systemd stopping the unit).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass

from .connections import KeptConnections
from .credentials import (
    NODE_FILE,
    default_state_dir,
    has_credential,
    keep_credential,
    prepare_state_dir,
    read_credential,
    read_node,
)
from .errors import AgentError
from .health import check_health
from .http_client import (
    HTTP_TIMEOUT,
    MAX_PAUSE,
    backoff,
    call_api,
    masked_url,
    register,
    until_through,
)
from .join_token import TOKEN_ENV, URL_ENV, JoinSecret, read_join_secret
from .notices import NoticeWatcher
from .probe import capabilities_of, check_gpu_runtime
from .smi import SMI_TIMEOUT
from .work_runner import WORK_HTTP_TIMEOUT, WorkRunner

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 30.0  # until the API says otherwise
MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0  # what is taken from the API's answer


class Stopped(Exception):
    """SIGTERM (systemd stopping the service): leave the loop, exit 0."""


def stop_on_sigterm(signum: int, frame: object) -> None:
    raise Stopped


@dataclass
class ProbeOptions:
    disk_path: str = "/"
    smi_timeout: float = SMI_TIMEOUT
    libcuda: str | None = None  # None: LIBCUDA; "": no CUDA check


def register_until_accepted(
    url: str, secret: JoinSecret, probe: ProbeOptions, state_dir: str, ca_file: str | None
) -> dict:
    """Probe, then register, retrying connection errors and 5xx for as long as it takes; keeps
    the credential and the node record. A refusal (4xx) is final: AgentError."""
    runtime = check_gpu_runtime(probe.smi_timeout, probe.libcuda)
    log.info("GPU runtime: %s: %s", runtime.verdict, runtime.message or "GPUs usable")
    capabilities = capabilities_of(runtime, probe.disk_path)
    identity = {"vm": secret.vm[:128]} if secret.vm else None
    response = until_through(
        lambda: register(url, secret.token, capabilities, identity, 1, ca_file=ca_file),
        "registration",
    )
    return keep_credential(state_dir, response, url, capabilities)


def _interval(answered: object, current: float) -> float:
    if isinstance(answered, (int, float)) and not isinstance(answered, bool):
        return min(max(float(answered), MIN_INTERVAL), MAX_INTERVAL)
    return current


def heartbeat_forever(
    url: str,
    credential: str,
    ca_file: str | None,
    registered: list,
    probe: ProbeOptions,
    runner: WorkRunner | None = None,
    connections: KeptConnections | None = None,
) -> int:
    """Heartbeat with a fresh verdict at the interval the API answers, until the credential is
    refused (exit status 0; work still running is stopped first). Every other failure is
    retried with backoff, logged when it starts, every tenth time, and when it ends. Each
    answer goes to `runner`: the worker's state and its work's stop request."""
    interval, failures, draining = HEARTBEAT_INTERVAL, 0, False
    last = None
    while True:
        started = time.monotonic()
        health = check_health(registered, probe.smi_timeout, probe.libcuda)
        if health != last:
            log.info("health: %s", "healthy" if health.healthy else f"UNHEALTHY: {health.detail}")
            last = health
        body = {"healthy": health.healthy, "detail": health.detail}
        if runner is not None and runner.notice is not None:
            body["notice"] = runner.notice
        try:
            answer = call_api(
                url,
                "/v1/workers/heartbeat",
                body,
                credential,
                ca_file,
                tries=1,
                what="heartbeat",
                timeout=min(HTTP_TIMEOUT, max(interval, 5.0)),
                connections=connections,
            )
        except AgentError as error:
            if error.status == 401:
                log.warning("%s: this worker was removed or its machine released; stopping", error)
                if runner is not None:
                    runner.shut_down()
                return 0
            failures += 1
            if failures == 1 or failures % 10 == 0:
                log.warning("heartbeat failed (%d in a row): %s; retrying", failures, error)
            time.sleep(max(backoff(failures, min(interval, MAX_PAUSE)), error.retry_after or 0.0))
            continue
        if failures:
            log.info("heartbeats accepted again after %d failed", failures)
            failures = 0
        interval = _interval(answer.get("interval_seconds"), interval)
        if runner is not None:
            runner.heard(answer, interval, sent_at=started)
        if bool(answer.get("draining")) != draining:
            draining = not draining
            log.info("draining: no new job will be placed here" if draining else "not draining")
        pause = max(0.0, started + interval - time.monotonic())
        if runner is None:
            time.sleep(pause)
        elif runner.news.wait(pause):  # a notice came: the control plane hears of it now
            runner.news.clear()


def run(args: argparse.Namespace) -> int:
    """`agent.py run`: register unless a credential is kept, then heartbeat until revoked."""
    state_dir = args.state_dir or default_state_dir()
    probe = ProbeOptions(args.disk_path, args.smi_timeout, args.libcuda)
    if has_credential(state_dir):
        os.environ.pop(TOKEN_ENV, None)  # never passed on to a child, even unused
        url = args.url or read_node(state_dir).get("api_url")
    else:
        secret = read_join_secret(args.token_file, args.token_fd, allow_env=False)
        url = args.url or secret.api_url
        if not url:
            raise AgentError(f"no API URL: pass --url (or {URL_ENV}= in the token file)")
        prepare_state_dir(state_dir)
        shown = register_until_accepted(url, secret, probe, state_dir, args.ca_file)
        log.info("registered as worker %s (%s)", shown.get("worker_id"), shown.get("origin"))
        if args.delete_token_file and args.token_file:
            with contextlib.suppress(OSError):
                os.unlink(args.token_file)
    if not url:
        raise AgentError(f"no API URL: pass --url ({os.path.join(state_dir, NODE_FILE)} has none)")
    credential = read_credential(state_dir)
    registered = read_node(state_dir).get("gpus") or []
    api_url = url
    connections = KeptConnections()  # one open connection per thread: heartbeats, work, lease

    def call(path: str, body: dict | None, what: str, timeout: float = WORK_HTTP_TIMEOUT) -> dict:
        return call_api(api_url, path, body, credential, args.ca_file, tries=1, what=what,
                        timeout=timeout, connections=connections)  # fmt: skip

    runner = WorkRunner(call, state_dir)
    threading.Thread(target=runner.loop, name="work", daemon=True).start()
    threading.Thread(target=runner.watch_lease, name="lease", daemon=True).start()
    source = args.notices
    if source != "none":
        watcher = NoticeWatcher(source, args.metadata_url)
        watching = threading.Thread(
            target=watcher.watch, args=(runner.noticed, runner.revoked), name="notices"
        )
        watching.daemon = True
        watching.start()
        log.info("watching %s's notices about this machine", source)
    log.info("heartbeating to %s", masked_url(url))
    return heartbeat_forever(url, credential, args.ca_file, registered, probe, runner, connections)

"""nginx in front of several API processes on loopback: one address for the agents, as an
operator runs gpuprov behind a load balancer (and the runner of any nginx configuration the
suite needs: tests/tls.py).

`api_front(directory, upstream_ports)` balances HTTP/1.1 over the API processes with
connections kept open both ways, passes a request that met a dead process (refused, reset, 502)
on to the next, and logs every request as `<end time> <request seconds> <status>
<upstream(s)>` to `directory/access.log`, so a run can tell which process answered what.
`running_nginx(directory, config, ports)` runs `nginx -g 'daemon off;'` on any configuration and
waits until it listens on `ports`. nginx must be installed (`make test` and `make bench` do).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuprov.cli.dev import free_port

NGINX = "/usr/sbin/nginx"
READY_SECONDS = 30.0

_API_FRONT = """\
daemon off;
{user}
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_rlimit_nofile 16384;
events {{ worker_connections 16000; }}
http {{
  log_format balanced '$msec $request_time $status $upstream_addr';
  access_log {dir}/access.log balanced;
  client_body_temp_path {dir}/tmp;
  proxy_temp_path {dir}/tmp;
  fastcgi_temp_path {dir}/tmp;
  uwsgi_temp_path {dir}/tmp;
  scgi_temp_path {dir}/tmp;
  keepalive_timeout 300s;
  keepalive_requests 1000000;
  upstream api {{
{servers}
    keepalive 256;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://api;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_read_timeout 300s;
      # a heartbeat is safe to send again: one that met a dead process goes to the other
      proxy_next_upstream error timeout http_502 non_idempotent;
      proxy_connect_timeout 2s;
    }}
  }}
}}
"""


class NginxMissing(RuntimeError):
    """nginx is not installed here."""


@dataclass(frozen=True)
class Front:
    port: int
    directory: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.directory / "access.log"


def nginx_binary() -> str:
    if os.access(NGINX, os.X_OK):
        return NGINX
    found = shutil.which("nginx")
    if not found:
        raise NginxMissing(f"{NGINX} is missing: install nginx (make test and make bench do)")
    return found


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


def user_line() -> str:
    """As root, nginx's workers would drop to `nobody`, who cannot enter a private temp dir."""
    return "user root;" if os.geteuid() == 0 else ""


@contextlib.contextmanager
def running_nginx(
    directory: Path, config: str, ports: list[int]
) -> Iterator[subprocess.Popen[bytes]]:
    """nginx on `config` (written to directory/nginx.conf), once it listens on every port;
    RuntimeError with its error log when it does not start. Stopped on leaving."""
    binary = nginx_binary()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tmp").mkdir(exist_ok=True)
    path = directory / "nginx.conf"
    path.write_text(config)
    process = subprocess.Popen(
        [binary, "-p", str(directory), "-c", str(path), "-e", str(directory / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # -e: startup errors go to error.log too
    )
    try:
        # a readiness wait for a process we started: nginx binds its ports at once, or exits
        deadline = time.monotonic() + READY_SECONDS
        while not all(_listening(port) for port in ports):
            if process.poll() is not None or time.monotonic() > deadline:
                error_log = directory / "error.log"
                log = error_log.read_text() if error_log.exists() else ""
                raise RuntimeError(f"nginx did not start: {log[-2000:]}")
            time.sleep(0.02)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextlib.contextmanager
def api_front(directory: Path, upstream_ports: list[int]) -> Iterator[Front]:
    """nginx balancing one loopback address over the API processes on `upstream_ports`."""
    port = free_port()
    servers = "\n".join(
        f"    server 127.0.0.1:{upstream} max_fails=1 fail_timeout=30s;"
        for upstream in upstream_ports
    )
    config = _API_FRONT.format(user=user_line(), dir=directory, port=port, servers=servers)
    with running_nginx(directory, config, [port]) as process:
        yield Front(port, directory, process)

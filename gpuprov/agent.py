"""The node agent: probe this machine's GPUs and register it with the control plane.

    python -m gpuprov.agent probe                      print the capabilities JSON
    python -m gpuprov.agent register --url URL         probe, then POST /v1/workers/register

The join token comes from $GPUPROV_JOIN_TOKEN, `--token-file FILE`, or stdin — never from the
command line (`ps` shows every process's argv to every user) — and is never logged or printed.

This file must stay STANDARD LIBRARY ONLY and self-contained (Python 3.8+): bootstrap copies it
alone onto a bare Ubuntu image and runs it with the system Python (`python3 agent.py register
...`), where neither gpuprov nor pydantic nor httpx is installed; tests/gpuprov/test_agent.py
enforces this. Its JSON has the shape of gpuprov.models.WorkerCapabilities: keep them in step.

The GPU runtime check never hides a failure: a missing, failing, hanging or GPU-less nvidia-smi
sets gpu_runtime_ok False with the reason (nvidia-smi's own words where it has any).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

AGENT_VERSION = "0.1.0"
TOKEN_ENV = "GPUPROV_JOIN_TOKEN"
SMI_TIMEOUT = 10.0  # seconds per nvidia-smi call; a wedged driver can hang it indefinitely
HTTP_TIMEOUT = 30.0
MAX_PAUSE = 30.0
GPU_QUERY = ("--query-gpu=name,memory.total,driver_version,uuid", "--format=csv,noheader,nounits")
CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*([0-9]+(?:\.[0-9]+)*)")

log = logging.getLogger("gpuprov.agent")


class AgentError(Exception):
    """Registration failed. `status`: the HTTP status of a refusal; `transient`: we gave up
    retrying something that might work later (API down, 5xx)."""

    def __init__(self, message: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient


class _SmiFailed(Exception):
    """nvidia-smi could not answer; the message is the reason reported as gpu_runtime_error."""


def _nvidia_smi(*args: str) -> str:
    """nvidia-smi's stdout, or _SmiFailed with the reason."""
    try:
        process = subprocess.Popen(
            ["nvidia-smi", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group, so a timeout kills all of it
        )
    except FileNotFoundError:
        raise _SmiFailed("nvidia-smi not found") from None
    except OSError as error:
        raise _SmiFailed(f"nvidia-smi cannot run: {error.strerror}") from None
    try:
        stdout, stderr = process.communicate(timeout=SMI_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        # A process stuck in the driver (D state) outlives SIGKILL; do not wait on it forever.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=1)
        raise _SmiFailed(f"nvidia-smi timed out after {SMI_TIMEOUT:g}s") from None
    if process.returncode != 0:
        # NVML errors ("Failed to initialize NVML: Driver/library version mismatch") go to
        # stdout on most drivers; take stderr first in case a wrapper put them there.
        lines = [line.strip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
        reason = lines[0][:500] if lines else "(no output)"
        raise _SmiFailed(f"nvidia-smi exited {process.returncode}: {reason}")
    return stdout


def _field(raw: str) -> str | None:
    value = raw.strip()
    return None if not value or value.startswith("[") else value  # [N/A], [Not Supported]


def parse_gpus(csv_text: str) -> list[dict]:
    """Rows of `--query-gpu=name,memory.total,driver_version,uuid --format=csv,noheader,nounits`.

    Raises _SmiFailed on a line that is not such a row: better no GPU than a wrong one.
    """
    gpus = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        fields = line.split(",")
        name = _field(fields[0]) if len(fields) == 4 else None
        if name is None:
            raise _SmiFailed(f"unparsable nvidia-smi output: {line.strip()[:200]!r}")
        memory = re.match(r"\s*(\d+)\s*(MiB)?\s*$", fields[1])  # MiB; "[N/A]" -> None
        memory_mb = int(memory.group(1)) if memory else None
        driver, uuid = _field(fields[2]), _field(fields[3])
        gpus.append(
            {"name": name[:256], "memory_mb": memory_mb, "driver_version": driver, "uuid": uuid}
        )
    return gpus


def _cuda_version() -> str | None:
    """From the `nvidia-smi` banner ("CUDA Version: 12.4"), else `nvidia-smi --version`
    ("CUDA Version : 12.4", newer drivers). Informational: a miss is not a runtime failure."""
    for args in ((), ("--version",)):
        with contextlib.suppress(_SmiFailed):
            match = CUDA_VERSION.search(_nvidia_smi(*args))
            if match:
                return match.group(1)
    return None


def _memory_gb() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)  # kB -> GiB
    return None


def _disk_gb() -> float | None:
    with contextlib.suppress(OSError):
        return round(shutil.disk_usage("/").total / 1024**3, 1)
    return None


def probe() -> dict:
    """This machine's capabilities, shaped like gpuprov.models.WorkerCapabilities."""
    capabilities: dict = {
        "gpus": [],
        "driver_version": None,
        "cuda_version": None,
        "cpu_count": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "disk_gb": _disk_gb(),
        "gpu_runtime_ok": False,
        "gpu_runtime_error": None,
        "agent_version": AGENT_VERSION,
    }
    try:
        gpus = parse_gpus(_nvidia_smi(*GPU_QUERY))
    except _SmiFailed as failed:
        capabilities["gpu_runtime_error"] = str(failed)
        return capabilities
    if not gpus:
        capabilities["gpu_runtime_error"] = "no GPU visible"
        return capabilities
    capabilities["gpus"] = gpus[:64]
    capabilities["driver_version"] = gpus[0]["driver_version"]
    capabilities["cuda_version"] = _cuda_version()
    capabilities["gpu_runtime_ok"] = True
    return capabilities


def _server_message(body: bytes) -> str:
    """FastAPI's {"detail": ...}; for validation errors only loc and msg, never the "input"
    (which may echo the token back)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        detail = json.loads(text)["detail"]
    except (ValueError, KeyError, TypeError):
        return text[:500] or "(empty response)"
    if isinstance(detail, list):
        parts = []
        for problem in detail:
            if isinstance(problem, dict):
                where = ".".join(str(part) for part in problem.get("loc", []))
                parts.append(f"{where}: {problem.get('msg', '?')}")
        return "; ".join(parts)[:500] or "(invalid request)"
    return str(detail)[:500]


def register(
    api_url: str,
    token: str,
    capabilities: dict,
    identity: dict | None = None,
    tries: int = 10,
    pause: float = 1.0,
) -> dict:
    """POST {api_url}/v1/workers/register; the response JSON on 200.

    A 4xx (unknown, used or expired token; refused by the job; too large; bad body) is final:
    AgentError with the server's message and `status`. 5xx and connection errors are retried
    with exponential backoff from `pause` (capped at 30 s) for `tries` attempts in all.
    """
    body = {"token": token, "capabilities": capabilities}
    if identity is not None:
        body["identity"] = identity
    data = json.dumps(body).encode()
    url = api_url.rstrip("/") + "/v1/workers/register"
    if not url.startswith(("http://", "https://")):
        raise AgentError(f"bad API URL {api_url!r}: expected http(s)://host:port")
    tries, problem = max(tries, 1), ""
    for attempt in range(1, tries + 1):
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            message = "(no body)"
            with contextlib.suppress(OSError):
                message = _server_message(error.read()).replace(token, "<token>")
            if error.code < 500:
                refusal = f"registration refused ({error.code}): {message}"
                raise AgentError(refusal, error.code) from None
            problem = f"HTTP {error.code}: {message}"
        except ValueError as error:  # a 200 whose body is not JSON
            raise AgentError(f"unreadable response from {url}: {error}") from None
        except OSError as error:  # URLError, refused, reset, timed out
            problem = f"cannot reach {url}: {getattr(error, 'reason', error)}"
        if attempt < tries:
            delay = min(pause * 2 ** (attempt - 1), MAX_PAUSE)
            log.warning("attempt %d/%d: %s; retrying in %.1fs", attempt, tries, problem, delay)
            time.sleep(delay)
    raise AgentError(f"registration failed after {tries} attempts: {problem}", transient=True)


def read_token(token_file: str | None = None) -> str:
    """The join token from --token-file, else $GPUPROV_JOIN_TOKEN, else stdin (not a tty)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token_file:
        try:
            with open(token_file) as handle:
                token = handle.read().strip()
        except OSError as error:
            raise AgentError(f"cannot read token file {token_file}: {error.strerror}") from None
    elif not token and sys.stdin is not None and not sys.stdin.isatty():
        token = sys.stdin.readline().strip()
    if not token:
        raise AgentError(f"no join token: set {TOKEN_ENV}, pass --token-file, or pipe it on stdin")
    return token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuprov-agent", description="gpuprov node agent")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("probe", help="print this machine's capabilities as JSON")
    reg = commands.add_parser("register", help=f"probe, then register (token: ${TOKEN_ENV})")
    reg.add_argument("--url", required=True, help="control-plane API, e.g. http://10.0.0.1:8080")
    reg.add_argument("--token-file", help=f"file holding the join token (else ${TOKEN_ENV}/stdin)")
    reg.add_argument("--tries", type=int, default=10)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="gpuprov-agent: %(message)s")
    if args.command == "probe":
        print(json.dumps(probe(), indent=2))
        return 0
    try:
        token = read_token(args.token_file)  # first: a missing token fails before the probe
        capabilities = probe()
        if not capabilities["gpu_runtime_ok"]:
            log.warning("GPU runtime not OK: %s", capabilities["gpu_runtime_error"])
        response = register(args.url, token, capabilities, tries=args.tries)
    except AgentError as error:
        log.error("%s", error)
        return 1 if error.transient else 2
    print(json.dumps(response, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

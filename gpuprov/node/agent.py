"""The node agent: probe this machine's GPUs, register it with the control plane, keep it alive.

    python3 agent.py probe [--disk-path /data]          print the capabilities JSON
    python3 agent.py register --url URL < token-file    probe, then POST /v1/workers/register
    python3 agent.py run [--url URL] [--token-file F]   register once, then heartbeat until revoked
    python3 agent.py whoami --url URL                   what the API knows of this worker
    python3 agent.py supervise DIR                      (started by `run`) leads a job's work

`run` is the daemon (a systemd service on a node): without a credential in its state dir it
registers first (the join token as `register` reads it, never from argv or the environment);
then it heartbeats (POST /v1/workers/heartbeat) at the interval the API answers, each with a
fresh verdict: the registration probe, the GPUs registered that nvidia-smi no longer lists, and
what `nvidia-smi -q` says of lost GPUs and uncorrectable memory errors (`query_findings`).
Connection errors, 5xx and 429 are retried with backoff for as long as it takes (never sooner
than the answer's Retry-After): an API outage, or the API throttling this address, never stops
it. A refused credential (401: the worker was removed, or its machine released) stops it with
exit 0 and one log line, once any work still running is stopped.

Beside the heartbeats, `run` runs the node's part of a job (`WorkRunner`, a thread): it reads
its assignment (GET /v1/work, every few seconds while the worker is reserved or busy, at once
when a heartbeat's answer names one), keeps it in <state dir>/work/<id>/ (0600 files in a 0700
directory) before it reports the start (POST .../started; a refusal means it never starts),
then starts `agent.py supervise` in a session of its own: the leader of the work's process
group, which runs `setup` then `run` with `/bin/sh -c`, their output appended to files beside
the assignment, and writes the exit status last. The supervisor first moves into the work's
cgroup: a cgroup v2 directory gpuprov-<id> the agent makes under its own (the systemd unit's,
with Delegate=yes), where it can. The environment is the agent's own basics (PATH, HOME, the
locale, ...; never its credential or a token) plus the assignment's env and the work's mark,
GPUPROV_WORK_ID=<id>. The output goes to the API in chunks (POST .../logs, at most 32 KiB a
chunk, every second; each chunk is recorded before it is sent, so a resend after a restart
repeats its seq and the API keeps one); the end (POST .../exit: the code, negative for a
signal, and the last lines) once all of it is through. The work's end is its main process's
(the supervisor's): whatever it leaves running is killed then, before the end is reported and
its directory removed, in whatever session or process group it moved to (`setsid`, a double
fork): the process group, everything in its cgroup (frozen, then cgroup.kill) and every process
whose environment carries its mark, round after round until none is left. Where no cgroup can
be made (cgroup v1 alone, a read-only cgroup filesystem, a cgroup not delegated to the agent's
user) the group and the mark find them, and a process that drops the mark from its environment
and leaves the group escapes. A stop (the heartbeat's answer, or the assignment read again) is
SIGTERM to the process group, the grace period the assignment names, then SIGKILL to all of
the work. A restarted agent finds the work in its state dir and follows it again (it outlives
the agent: its own session and cgroup, and the systemd unit's KillMode=process), never starting
it twice; a report the control plane does not take is retried until it does, and the work goes
on meanwhile. The work runs as the agent's user: the directory keeps other users out, not the
work itself.

Registration exchanges the join token for this worker's credential, which the agent keeps in
<state dir>/worker-credential (mode 0600, in a 0700 directory): never on a command line, in
the environment, on stdout or in a log. Beside it, <state dir>/worker.json (no secret) keeps
the API's URL, the worker id and the UUIDs of the GPUs it registered with. `--state-dir`
defaults to the directory this file was installed in alone (bootstrap's private per-VM
directory), or ~/.gpuprov/worker when it runs from the gpuprov package (`gpuprov join`). Every
later call presents the credential (`Authorization: Bearer`). Over HTTPS, `--ca-file` pins the
CA that signed the API's certificate (default: the system's CAs); a certificate that does not
verify is refused at once, not retried.

The join token is never on a command line (`ps` shows argv to every user; shells keep history):
stdin (a pipe or file: its first line; a terminal: a prompt without echo), `--token-fd N`, or
`--token-file FILE` (mode 0600: the bare token, or an env file whose GPUPROV_JOIN_TOKEN= is the
token and GPUPROV_API_URL= stands in for --url; `--delete-token-file` removes it once read).
$GPUPROV_JOIN_TOKEN still works, with a warning (`ps e` and /proc/PID/environ show it to the user
and root); it is dropped from the environment at once, so no child inherits it. Never logged.

Probe -> gpuprov.models.WorkerCapabilities (keep them in step): gpus and driver_version from
`nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv,noheader,nounits`;
cuda_version from `nvidia-smi --version` ("CUDA Version : 12.4"), else the banner ("CUDA Version:
12.4", "CUDA UMD Version: 13.3" from driver 610); cpu_count os.cpu_count(); memory_gb MemTotal of
/proc/meminfo; disk_gb shutil.disk_usage(--disk-path).total (GiB). gpu_runtime_ok is True only
for the verdict `ok`; otherwise gpu_runtime_error says why, in nvidia-smi's or CUDA's own words:
  ok                  GPUs listed, and cuInit(0) through libcuda.so.1 succeeds (in a child
                      process; a libcuda that cannot be loaded skips that check)
  no_gpu              nvidia-smi lists no GPU ("No devices were found", exit 6)
  driver_mismatch     "Failed to initialize NVML: Driver/library version mismatch" (exit 18), or
                      CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
  nvidia_smi_failed   anything else: driver not loaded (exit 9), no libnvidia-ml (exit 12), a GPU
                      fallen off the bus, a hung driver (timeout), unparsable output
  nvidia_smi_missing  no nvidia-smi on PATH
  cuda_init_failed    nvidia-smi is fine but cuInit fails or hangs (802 "system not yet
                      initialized": an NVSwitch box whose nvidia-fabricmanager is not running)
Every nvidia-smi call and the CUDA check run under a timeout: a wedged driver hangs them.

Heartbeat findings from `nvidia-smi -q` (per GPU section; "N/A" fields say nothing), each named
by the Xid the driver logs for it:
  lost                "Unable to determine the device handle ... GPU is lost" or "fallen off
                      the bus" (Xid 79), the GPU's section missing with it
  uncorrectable ECC   ECC Errors > Volatile: any "... Uncorrectable ..." count, or "Double Bit"
                      > "Total" on older drivers, above 0 since the driver loaded (Xid 48)
  needs a reset       Remapped Rows > Pending or Remapping Failure Occurred; Retired Pages >
                      Pending Page Blacklist; GPU Reset Status > Reset Required / Drain and
                      Reset Recommended; a GPU Recovery Action other than None

STANDARD LIBRARY ONLY, one self-contained file, Python 3.8+: bootstrap copies it alone onto a bare
Ubuntu image and runs it with the system python3. tests/gpuprov/test_agent.py enforces this.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import getpass
import json
import logging
import os
import pwd
import random
import re
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

AGENT_VERSION = "0.2.0"
TOKEN_ENV = "GPUPROV_JOIN_TOKEN"  # deprecated: visible to `ps e`
URL_ENV = "GPUPROV_API_URL"  # read from an env-style --token-file only
SMI_TIMEOUT = 10.0  # seconds per nvidia-smi call
CUDA_TIMEOUT = 30.0  # cuInit initialises every GPU: seconds on a big box without persistence
TOKEN_WAIT = 30.0  # seconds to wait for the token on stdin / --token-fd
HTTP_TIMEOUT = 30.0
CREDENTIAL_FILE = "worker-credential"
NODE_FILE = "worker.json"  # api_url, worker_id, the registered GPUs' UUIDs: no secret
HEARTBEAT_INTERVAL = 30.0  # until the API says otherwise
MIN_INTERVAL, MAX_INTERVAL = 0.05, 3600.0  # what is taken from the API's answer
MAX_DETAIL = 500  # the API's limit on a heartbeat's detail
PACKAGE_STATE_DIR = "~/.gpuprov/worker"
MAX_PAUSE = 30.0
MAX_RETRY_AFTER = 300.0  # seconds: the longest Retry-After honoured
LIBCUDA = "libcuda.so.1"
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
GPU_QUERY = ("--query-gpu=name,memory.total,driver_version,uuid", "--format=csv,noheader,nounits")
MAX_GPUS = 64  # WorkerCapabilities.gpus
MAX_TEXT = 256  # WorkerCapabilities' short text fields
MAX_ERROR = 2000  # WorkerCapabilities.gpu_runtime_error

OK, NO_GPU, DRIVER_MISMATCH = "ok", "no_gpu", "driver_mismatch"
SMI_FAILED, SMI_MISSING, CUDA_FAILED = "nvidia_smi_failed", "nvidia_smi_missing", "cuda_init_failed"
MISMATCH_TEXT = "Driver/library version mismatch"
NO_DEVICES_TEXT = "No devices were found"
SMI_NOT_FOUND_EXIT = 6  # nvidia-smi's documented return code: no GPU found
CUDA_ERROR_SYSTEM_NOT_READY, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 802, 803
CUDA_HINTS = {
    CUDA_ERROR_SYSTEM_NOT_READY: "on an NVSwitch system, is nvidia-fabricmanager running?",
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: "libcuda does not match the kernel driver: cuda-compat?",
}
CUDA_VERSION = re.compile(r"CUDA (?:UMD )?Version\s*:\s*([0-9]+(?:\.[0-9]+)*)")
KERNEL_MODULE = re.compile(r"Kernel Module\s+([0-9][0-9.]*)")
MEMORY_MIB = re.compile(r"([0-9]+)(?:\s*MiB)?")

# Runs in a child interpreter (`python3 -I -S -c CUDA_CHECK <libcuda>`): a crash or a hang in the
# driver costs the child, not the agent. Prints one JSON line; "loaded": false skips the check.
CUDA_CHECK = r"""
import ctypes, json, sys
try:
    cuda = ctypes.CDLL(sys.argv[1])
except OSError as error:
    print(json.dumps({"loaded": False, "error": str(error)}))
    sys.exit()
count, name, text = ctypes.c_int(0), ctypes.c_char_p(), ctypes.c_char_p()
code = cuda.cuInit(0) or cuda.cuDeviceGetCount(ctypes.byref(count))
if code:
    cuda.cuGetErrorName(code, ctypes.byref(name))
    cuda.cuGetErrorString(code, ctypes.byref(text))
words = [(value or b"").decode("utf-8", "replace") for value in (name.value, text.value)]
print(json.dumps({"loaded": True, "code": code, "devices": count.value, "words": words}))
"""

log = logging.getLogger("gpuprov.agent")


class AgentError(Exception):
    """Registration failed. `status`: the HTTP status of a refusal; `transient`: we gave up
    retrying something that might work later (API down, 5xx, 429); `retry_after`: the seconds
    the API asked us to wait before the next try (a 429's or 503's Retry-After)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        transient: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.retry_after = retry_after


class _SmiFailed(Exception):
    """nvidia-smi could not answer: the verdict, the message, and whatever it printed."""

    def __init__(self, message: str, verdict: str = SMI_FAILED, output: str = "") -> None:
        super().__init__(message)
        self.verdict = verdict
        self.output = output


class _TimedOut(Exception):
    pass


@dataclass
class GpuRuntime:
    """The GPU runtime verdict and what was read on the way."""

    verdict: str
    message: str | None = None
    gpus: list = field(default_factory=list)  # GpuInfo-shaped dicts
    cuda_version: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == OK


# ---------------------------------------------------------------- running nvidia-smi and CUDA


def _run(argv: list, timeout: float, env: dict | None = None) -> tuple:
    """(exit status, stdout, stderr) of argv, started without $GPUPROV_JOIN_TOKEN; _TimedOut after
    `timeout` seconds, once its process group is killed (a process stuck in the driver can
    outlive SIGKILL: it is not waited on)."""
    env = {name: value for name, value in (env or os.environ).items() if name != TOKEN_ENV}
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
        env=env,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=1)
        raise _TimedOut from None
    return process.returncode, stdout, stderr


def _nvidia_smi(args: tuple, timeout: float) -> str:
    """nvidia-smi's stdout, or _SmiFailed with the verdict and reason."""
    try:
        code, stdout, stderr = _run(["nvidia-smi", *args], timeout)
    except FileNotFoundError:
        raise _SmiFailed("nvidia-smi not found", SMI_MISSING) from None
    except OSError as error:
        raise _SmiFailed(f"nvidia-smi cannot run: {error.strerror}") from None
    except _TimedOut:
        raise _SmiFailed(f"nvidia-smi timed out after {timeout:g}s") from None
    if code != 0:
        verdict, message = classify_smi_failure(code, stderr + "\n" + stdout)
        raise _SmiFailed(message, verdict, stdout)
    return stdout


def classify_smi_failure(returncode: int, output: str) -> tuple:
    """(verdict, message) for an nvidia-smi that exited non-zero. The message quotes what it
    said (NVML errors go to stdout on most drivers), leaving out any GPU rows it printed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = "; ".join(line for line in lines if _gpu_row(line) is None)[:500]
    message = f"nvidia-smi exited {returncode}: {said or '(no output)'}"
    if MISMATCH_TEXT.lower() in output.lower():
        return DRIVER_MISMATCH, message
    if returncode == SMI_NOT_FOUND_EXIT or NO_DEVICES_TEXT in output:
        return NO_GPU, message
    return SMI_FAILED, message


def _field(raw: str) -> str | None:
    value = raw.strip()
    return None if not value or value.startswith("[") else value[:MAX_TEXT]  # [N/A]


def _gpu_row(line: str) -> dict | None:
    """One `name, memory.total, driver_version, uuid` row, or None if the line is not one."""
    fields = line.split(",")
    if len(fields) != 4:
        return None
    name, memory, driver, uuid = (_field(value) for value in fields)
    memory_mib = MEMORY_MIB.fullmatch(memory) if memory else None
    if name is None or (memory is not None and memory_mib is None):
        return None  # prose, not a row: a row's memory is MiB or [N/A]
    return {
        "name": name,
        "memory_mb": int(memory_mib.group(1)) if memory_mib else None,
        "driver_version": driver,
        "uuid": uuid,
    }


def parse_gpus(csv_text: str) -> list:
    """The rows of GPU_QUERY's output. Raises _SmiFailed on a line that is not such a row:
    better no GPU than a wrong one."""
    gpus = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        row = _gpu_row(line)
        if row is None:
            raise _SmiFailed(f"unparsable nvidia-smi output: {line.strip()[:200]!r}")
        gpus.append(row)
    return gpus


def parse_cuda_version(text: str) -> str | None:
    match = CUDA_VERSION.search(text)
    return match.group(1) if match else None


def _cuda_version(timeout: float) -> str | None:
    """From `nvidia-smi --version` (drivers from 535 or so), else from the banner. Informational:
    a miss is not a runtime failure."""
    for args in (("--version",), ()):
        with contextlib.suppress(_SmiFailed):
            version = parse_cuda_version(_nvidia_smi(args, timeout))
            if version:
                return version
    return None


def kernel_module_version(path: str | None = None) -> str | None:
    """The loaded NVIDIA kernel module's version ("NVRM version: ... Kernel Module  550.54.15")."""
    try:
        with open(path or DRIVER_VERSION_FILE) as version_file:
            match = KERNEL_MODULE.search(version_file.read(4096))
    except (OSError, UnicodeDecodeError):
        return None
    return match.group(1) if match else None


def _cuda_init(libcuda: str, timeout: float) -> tuple | None:
    """None if CUDA initialises (or the check cannot run here); else (verdict, message)."""
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the whole machine, whatever this shell was given
    argv = [sys.executable or "python3", "-I", "-S", "-c", CUDA_CHECK, libcuda]
    try:
        code, stdout, stderr = _run(argv, timeout, env)
    except _TimedOut:
        return CUDA_FAILED, f"CUDA init (cuInit) timed out after {timeout:g}s"
    except OSError as error:
        log.warning("CUDA check skipped: cannot start %s: %s", argv[0], error.strerror)
        return None
    if code < 0:  # killed by a signal: a crash inside libcuda
        return CUDA_FAILED, f"CUDA init (cuInit) crashed: signal {-code}"
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
        loaded, status, devices = result["loaded"], result.get("code"), result.get("devices")
    except (ValueError, IndexError, KeyError, TypeError):
        log.warning("CUDA check skipped: it failed (exit %s): %s", code, stderr.strip()[-300:])
        return None
    if not loaded:
        log.warning("CUDA check skipped: cannot load %s: %s", libcuda, result.get("error"))
        return None
    if status == 0:
        return None if devices else (CUDA_FAILED, "CUDA init: cuDeviceGetCount found no device")
    described = ": ".join(str(part) for part in result.get("words") or () if part)
    message = f"CUDA init (cuInit) failed with {status}" + (f" {described}" if described else "")
    if status in CUDA_HINTS:
        message += f" ({CUDA_HINTS[status]})"
    mismatch = status == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
    return (DRIVER_MISMATCH if mismatch else CUDA_FAILED), message


# ---------------------------------------------------------------- the probe


def check_gpu_runtime(
    smi_timeout: float | None = None, libcuda: str | None = None, cuda_version: bool = True
) -> GpuRuntime:
    """List the GPUs with nvidia-smi, read the CUDA version (unless `cuda_version` is False:
    a heartbeat does not report it), and initialise CUDA.

    `libcuda`: the library cuInit is called through (default LIBCUDA; "" skips the CUDA check).
    """
    timeout = SMI_TIMEOUT if smi_timeout is None else smi_timeout
    try:
        output = _nvidia_smi(GPU_QUERY, timeout)
        gpus = [] if NO_DEVICES_TEXT in output else parse_gpus(output)  # said with exit 0
    except _SmiFailed as failed:
        message, module = str(failed), kernel_module_version()
        if failed.verdict == DRIVER_MISMATCH and module:
            message += f"; kernel module {module}"
        # A lost GPU still leaves the others' rows: report what could be read, as not OK.
        readable = [row for row in map(_gpu_row, failed.output.splitlines()) if row]
        return GpuRuntime(failed.verdict, message[:MAX_ERROR], readable[:MAX_GPUS])
    if not gpus:
        return GpuRuntime(NO_GPU, "no GPU visible")
    gpus = gpus[:MAX_GPUS]
    version = _cuda_version(timeout) if cuda_version else None
    library = LIBCUDA if libcuda is None else libcuda
    problem = _cuda_init(library, CUDA_TIMEOUT) if library else None
    if problem is not None:
        return GpuRuntime(problem[0], problem[1][:MAX_ERROR], gpus, version)
    return GpuRuntime(OK, None, gpus, version)


def _memory_gb() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)  # kB -> GiB
    return None


def _disk_gb(path: str) -> float | None:
    try:
        return round(shutil.disk_usage(path).total / 1024**3, 1)
    except OSError as error:
        log.warning("disk size unknown: %s: %s", path, error.strerror)
        return None


def capabilities_of(runtime: GpuRuntime, disk_path: str = "/") -> dict:
    """The registration payload (WorkerCapabilities) for `runtime` and this machine."""
    drivers = [gpu["driver_version"] for gpu in runtime.gpus if gpu["driver_version"]]
    return {
        "gpus": runtime.gpus,
        "driver_version": drivers[0] if drivers else kernel_module_version(),
        "cuda_version": runtime.cuda_version,
        "cpu_count": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "disk_gb": _disk_gb(disk_path),
        "gpu_runtime_ok": runtime.ok,
        "gpu_runtime_error": runtime.message,
        "agent_version": AGENT_VERSION,
        "address": primary_address(),
    }


def primary_address() -> str | None:
    """The address this machine's peers reach it at: the local end of a UDP socket pointed at
    a documentation address (connecting a UDP socket sends nothing); None without a route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
            probe_socket.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): never reached
            return str(probe_socket.getsockname()[0])
    except OSError:
        return None


def probe(
    disk_path: str = "/", smi_timeout: float | None = None, libcuda: str | None = None
) -> dict:
    """This machine's capabilities, shaped like gpuprov.models.WorkerCapabilities."""
    return capabilities_of(check_gpu_runtime(smi_timeout, libcuda), disk_path)


# ---------------------------------------------------------------- health: nvidia-smi -q

BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
QUERY_GPU = re.compile(rf"^GPU ({BUS_ID})\s*$")
LOST_HANDLE = re.compile(rf"Unable to determine the device handle for GPU\s*(?:\d+:\s*)?({BUS_ID})")
LOST_TEXT = re.compile(r"GPU is lost|fallen off the bus", re.IGNORECASE)
COUNT = re.compile(r"\d+")
YES = "Yes"
# (section, field) of `nvidia-smi -q` that say the GPU must be reset (or drained and reset).
RESET_FLAGS = (
    (("Remapped Rows", "Pending"), "row remapping pending: reset the GPU"),
    (("Remapped Rows", "Remapping Failure Occurred"), "row remapping failed"),
    (("Retired Pages", "Pending Page Blacklist"), "page retirement pending: reset the GPU"),
    (("Retired Pages", "Pending Page Retirement"), "page retirement pending: reset the GPU"),
    (("GPU Reset Status", "Reset Required"), "reset required"),
    (("GPU Reset Status", "Drain and Reset Recommended"), "drain and reset recommended"),
)


def parse_query(text: str) -> dict:
    """`nvidia-smi -q` as {bus id: {(section, ..., field): value}}, one entry per GPU section;
    nesting comes from the indentation (four spaces a level), "N/A" values are left out."""
    gpus: dict = {}
    fields: dict | None = None
    path: list = []
    for line in text.splitlines():
        header = QUERY_GPU.match(line)
        if header:
            fields = gpus.setdefault(header.group(1), {})
            path = []
            continue
        if fields is None or not line.strip():
            continue
        if not line.startswith(" "):  # back at the top level (a unit, the end)
            fields = None
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 4
        key, colon, value = line.strip().partition(":")
        path = path[: max(depth - 1, 0)]
        if not colon:
            path.append(key.strip())
            continue
        value = value.strip()
        if value and value != "N/A":
            fields[(*path, key.strip())] = value
    return gpus


def _count(value: str | None) -> int:
    match = COUNT.match(value or "")
    return int(match.group()) if match else 0


def gpu_findings(fields: dict) -> list:
    """What one GPU's `-q` section says is wrong with it (empty: nothing)."""
    uncorrectable = sum(
        _count(value)
        for path, value in fields.items()
        if path[:2] == ("ECC Errors", "Volatile")
        and ("Uncorrectable" in path[-1] or (path[-1] == "Total" and "Double Bit" in path))
    )
    problems = []
    if uncorrectable:
        problems.append(
            f"{uncorrectable} uncorrectable ECC error(s) since the driver loaded (Xid 48)"
        )
    problems += [problem for key, problem in RESET_FLAGS if fields.get(key) == YES]
    action = fields.get(("GPU Recovery Action",))
    if action and action != "None":
        problems.append(f"recovery action {action}")
    return list(dict.fromkeys(problems))


def query_findings(text: str) -> list:
    """Every problem `nvidia-smi -q` output (stdout and stderr) shows, one line each."""
    findings = []
    lost = dict.fromkeys(match.group(1) for match in LOST_HANDLE.finditer(text))
    for bus in lost:
        findings.append(f"GPU {bus} is lost (fallen off the bus, Xid 79)")
    if not lost and LOST_TEXT.search(text):
        said = next(line.strip() for line in text.splitlines() if LOST_TEXT.search(line))
        findings.append(f"a GPU is lost (Xid 79): {said[:200]}")
    for bus, fields in parse_query(text).items():
        findings += [f"GPU {bus}: {problem}" for problem in gpu_findings(fields)]
    return findings


def _query_health(timeout: float) -> list:
    """Findings of one `nvidia-smi -q`; a run that fails without a finding is one itself."""
    try:
        code, stdout, stderr = _run(["nvidia-smi", "-q"], timeout)
    except _TimedOut:
        return [f"nvidia-smi -q timed out after {timeout:g}s (a hung driver?)"]
    except OSError as error:
        return [f"nvidia-smi -q cannot run: {error.strerror}"]
    findings = query_findings(stdout + "\n" + stderr)
    if code != 0 and not findings:
        said = "; ".join(line.strip() for line in (stderr or stdout).splitlines() if line.strip())
        findings.append(f"nvidia-smi -q exited {code}: {said[:300] or '(no output)'}")
    return findings


@dataclass
class Health:
    """A heartbeat's verdict: healthy, or why not (in nvidia-smi's or CUDA's words)."""

    healthy: bool
    detail: str | None = None


def check_health(
    registered: list | None = None, smi_timeout: float | None = None, libcuda: str | None = None
) -> Health:
    """The registration probe, the registered GPUs (UUIDs) nvidia-smi no longer lists, and
    `nvidia-smi -q`'s findings."""
    timeout = SMI_TIMEOUT if smi_timeout is None else smi_timeout
    runtime = check_gpu_runtime(timeout, libcuda, cuda_version=False)
    problems = [] if runtime.ok else [runtime.message or runtime.verdict]
    listed = {gpu["uuid"] for gpu in runtime.gpus if gpu.get("uuid")}
    missing = [uuid for uuid in registered or () if uuid not in listed]
    if missing and (runtime.ok or runtime.gpus):  # not when nvidia-smi listed nothing at all
        shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
        problems.append(
            f"{len(missing)} registered GPU(s) missing from nvidia-smi's list "
            f"({len(listed)} of {len(registered or ())} listed): {shown}"
        )
    if runtime.verdict != SMI_MISSING:
        problems += _query_health(timeout)
    if not problems:
        return Health(True)
    return Health(False, "; ".join(dict.fromkeys(problems))[:MAX_DETAIL])


# ---------------------------------------------------------------- registration


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


def _context(url: str, ca_file: str | None) -> ssl.SSLContext | None:
    """The TLS context for an https URL: only `ca_file`'s CAs when given, else the system's."""
    if not url.startswith("https://"):
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise AgentError(f"cannot use --ca-file {ca_file}: {error}") from None


def _untrusted(error: OSError) -> ssl.SSLCertVerificationError | None:
    """The certificate failure inside urllib's error, if that is what it is."""
    reason = getattr(error, "reason", error)
    return reason if isinstance(reason, ssl.SSLCertVerificationError) else None


def retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (the API sends whole seconds), capped at MAX_RETRY_AFTER
    so a wrong header cannot park the agent; None when absent or not a number."""
    try:
        seconds = float((value or "").strip())
    except ValueError:
        return None
    return min(seconds, MAX_RETRY_AFTER) if seconds >= 0 else None


def _has_credentials(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.username is not None or parts.password is not None
    except ValueError:
        return "@" in url.partition("//")[2].partition("/")[0]


def masked_url(url: str) -> str:
    """`url` with anything before an @ in its authority (user, password) shown as ***."""
    scheme, slashes, rest = url.partition("//")
    authority, slash, tail = rest.partition("/")
    if not slashes or "@" not in authority:
        return url
    return f"{scheme}//***@{authority.rpartition('@')[2]}{slash}{tail}"


def call_api(
    api_url: str,
    path: str,
    body: dict | None = None,
    credential: str | None = None,
    ca_file: str | None = None,
    tries: int = 10,
    pause: float = 1.0,
    secret: str | None = None,
    what: str | None = None,
    timeout: float = HTTP_TIMEOUT,
) -> dict:
    """POST `body` (GET without one) to {api_url}{path}; the response JSON on 2xx. Messages
    call the request `what` (default: the path); `timeout` bounds each attempt.

    A 4xx is final: AgentError with the server's message and `status`; so is a certificate
    that does not verify. 5xx, 429 and connection errors are retried with exponential backoff
    from `pause` (capped at 30 s), never sooner than the answer's Retry-After, for `tries`
    attempts in all. `secret` (and the credential) never appear in a message, nor does a
    password in the URL: a URL with credentials is refused before any call.
    """
    url = api_url.rstrip("/") + path
    if not url.startswith(("http://", "https://")):
        raise AgentError(f"bad API URL {masked_url(api_url)!r}: expected http(s)://host:port")
    if _has_credentials(url):
        raise AgentError(
            f"bad API URL {masked_url(api_url)!r}: credentials (user:password@) do not belong "
            "in it; the API takes none there"
        )
    context = _context(url, ca_file)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    data = json.dumps(body).encode() if body is not None else None
    hidden = {value: name for value, name in ((secret, "<token>"), (credential, "<credential>"))}
    tries, problem, wait = max(tries, 1), "", None
    for attempt in range(1, tries + 1):
        request = urllib.request.Request(
            url, data=data, method="POST" if data is not None else "GET", headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
                content = answer.read()
                return json.loads(content) if content.strip() else {}  # 204: nothing
        except urllib.error.HTTPError as error:
            message = "(no body)"
            with contextlib.suppress(OSError):
                message = _hide(_server_message(error.read()), hidden)
            if error.code < 500 and error.code != 429:  # 429: too busy for us now
                refusal = f"{what or path} refused ({error.code}): {message}"
                raise AgentError(refusal, error.code) from None
            problem = f"HTTP {error.code}: {message}"
            wait = retry_after(error.headers.get("Retry-After")) if error.headers else None
        except ValueError as error:  # a 200 whose body is not JSON
            raise AgentError(f"unreadable response from {url}: {error}") from None
        except OSError as error:  # URLError, refused, reset, timed out, TLS
            untrusted = _untrusted(error)
            if untrusted is not None:
                raise AgentError(
                    f"the API's certificate at {url} is not trusted "
                    f"({untrusted.verify_message}): pass --ca-file with the CA that signed it"
                ) from None
            problem, wait = f"cannot reach {url}: {getattr(error, 'reason', error)}", None
        if attempt < tries:
            delay = max(min(pause * 2 ** (attempt - 1), MAX_PAUSE), wait or 0.0)
            log.warning("attempt %d/%d: %s; retrying in %.1fs", attempt, tries, problem, delay)
            time.sleep(delay)
    raise AgentError(
        f"{what or path} failed after {tries} attempts: {problem}", transient=True, retry_after=wait
    )


def _hide(text: str, secrets: dict) -> str:
    """`text` with each secret replaced by its placeholder ({secret: "<token>"})."""
    for secret, placeholder in secrets.items():
        if secret:
            text = text.replace(secret, placeholder)
    return text


def register(
    api_url: str,
    token: str,
    capabilities: dict,
    identity: dict | None = None,
    tries: int = 10,
    pause: float = 1.0,
    ca_file: str | None = None,
) -> dict:
    """POST {api_url}/v1/workers/register; the response JSON on 200, with the worker's
    `credential` (save it with save_credential; never print it).

    A 4xx (unknown, used or expired token; refused by the job; too large; bad body) is final:
    AgentError with the server's message and `status`. 5xx and connection errors are retried
    with exponential backoff from `pause` (capped at 30 s) for `tries` attempts in all.
    """
    body = {"token": token, "capabilities": capabilities}
    if identity is not None:
        body["identity"] = identity
    return call_api(
        api_url,
        "/v1/workers/register",
        body,
        ca_file=ca_file,
        tries=tries,
        pause=pause,
        secret=token,
        what="registration",
    )


# ---------------------------------------------------------------- the worker credential


def default_state_dir() -> str:
    """Where the credential lives unless --state-dir says otherwise: beside this file when it
    was installed alone (bootstrap's private per-VM directory), else ~/.gpuprov/worker (run
    from the gpuprov package: `gpuprov join`, `python -m gpuprov.agent`, a source checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if __package__ or os.path.exists(os.path.join(here, "__init__.py")):
        return os.path.expanduser(PACKAGE_STATE_DIR)
    return here


def prepare_state_dir(state_dir: str) -> str:
    """Create the state directory (0700) and prove it writable, before the join token is
    spent: a credential that cannot be kept would strand the registration."""
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        probe = os.path.join(state_dir, f".write-test-{os.getpid()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.unlink(probe)
        mode = os.stat(state_dir).st_mode & 0o777
    except OSError as error:
        raise AgentError(f"state dir {state_dir} is not usable: {error.strerror}") from None
    if mode & 0o077:
        log.warning(
            "state dir %s is open to other users (mode %03o): chmod 700 it", state_dir, mode
        )
    return os.path.join(state_dir, CREDENTIAL_FILE)


def save_credential(state_dir: str, credential: str) -> str:
    """Write the credential to <state_dir>/worker-credential, mode 0600 from its first byte
    (written aside, then renamed over any earlier one); returns the path."""
    path = prepare_state_dir(state_dir)
    part = f"{path}.{os.getpid()}.part"
    try:
        descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(credential + "\n")
        os.replace(part, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise AgentError(f"cannot save the worker credential in {path}: {error.strerror}") from None
    return path


def read_credential(state_dir: str) -> str:
    path = os.path.join(state_dir, CREDENTIAL_FILE)
    try:
        with open(path) as handle:
            credential = handle.readline().strip()
    except OSError as error:
        raise AgentError(
            f"no worker credential at {path} ({error.strerror}): register first"
        ) from None
    if not credential:
        raise AgentError(f"the worker credential file {path} is empty: register again")
    return credential


def keep_credential(
    state_dir: str, response: dict, api_url: str | None = None, capabilities: dict | None = None
) -> dict:
    """Save the registration's credential (and, given the API's URL, the node record `run`
    starts from); the response to show, without the credential."""
    shown = {name: value for name, value in response.items() if name != "credential"}
    credential = response.get("credential")
    if isinstance(credential, str) and credential:
        shown["credential_file"] = save_credential(state_dir, credential)
    else:
        log.warning("the API returned no worker credential (an older control plane?)")
    if api_url is not None:
        gpus = (capabilities or {}).get("gpus") or []
        uuids = [gpu["uuid"] for gpu in gpus if isinstance(gpu, dict) and gpu.get("uuid")]
        save_node(state_dir, api_url, response.get("worker_id"), uuids)
    return shown


def save_node(state_dir: str, api_url: str, worker_id: object, gpus: list) -> None:
    """<state_dir>/worker.json: where the API is, who this worker is, the GPUs it registered
    with (no secret; written aside, then renamed)."""
    path = os.path.join(state_dir, NODE_FILE)
    try:
        _write_json(path, {"api_url": api_url, "worker_id": worker_id, "gpus": gpus})
    except OSError as error:
        log.warning("cannot keep %s: %s", path, error.strerror)


def read_node(state_dir: str) -> dict:
    """The node record, or {} where there is none (a registration by an older agent)."""
    try:
        with open(os.path.join(state_dir, NODE_FILE)) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def has_credential(state_dir: str) -> bool:
    try:
        with open(os.path.join(state_dir, CREDENTIAL_FILE)) as handle:
            return bool(handle.readline().strip())
    except OSError:
        return False


# ---------------------------------------------------------------- the join token


@dataclass
class JoinSecret:
    """The token, and what an env-style token file says besides (API URL, VM name)."""

    token: str
    api_url: str | None = None
    vm: str | None = None


def _read_line(fd: int, what: str, timeout: float) -> str:
    """The first line readable from `fd` (up to EOF), waiting at most `timeout` seconds."""
    deadline, data = time.monotonic() + timeout, b""
    try:
        while b"\n" not in data and len(data) < 4096:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentError(f"no join token on {what} within {timeout:g}s")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
    except OSError as error:
        raise AgentError(f"cannot read the join token from {what}: {error.strerror}") from None
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def _env_value(text: str, name: str) -> str | None:
    """NAME=value from env-file text (`export ` and quotes allowed), else None."""
    match = re.search(rf"^[ \t]*(?:export[ \t]+)?{name}[ \t]*=[ \t]*(.*?)[ \t]*$", text, re.M)
    return match.group(1).strip("'\"") if match else None


def _read_token_file(path: str, delete: bool) -> JoinSecret:
    """A bare token (first line), or an env file holding GPUPROV_JOIN_TOKEN=."""
    try:
        mode = os.stat(path).st_mode & 0o777
        with open(path, "rb") as handle:
            text = handle.read(65536).decode("utf-8", "replace")
    except OSError as error:
        raise AgentError(f"cannot read token file {path}: {error.strerror}") from None
    if mode & 0o077:
        log.warning("token file %s is open to other users (mode %03o): chmod 600 it", path, mode)
    if delete:
        try:
            os.unlink(path)
        except OSError as error:
            log.warning("cannot delete token file %s: %s", path, error.strerror)
    token = _env_value(text, TOKEN_ENV)
    if token is not None:
        return JoinSecret(token, _env_value(text, URL_ENV), _env_value(text, "GPUPROV_VM"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return JoinSecret(lines[0] if lines else "")


def read_join_secret(
    token_file: str | None = None,
    token_fd: int | None = None,
    delete_file: bool = False,
    wait: float | None = None,
    allow_env: bool = True,
) -> JoinSecret:
    """The join token from --token-file, else --token-fd, else $GPUPROV_JOIN_TOKEN (unless
    `allow_env` is False: `run` never takes it), else stdin.

    $GPUPROV_JOIN_TOKEN is removed from this process's environment whichever source is used,
    so no child (nvidia-smi, the CUDA check) inherits it.
    """
    from_env = os.environ.pop(TOKEN_ENV, "").strip()
    if from_env and not allow_env:
        log.warning("ignoring $%s: pass the token on stdin or with --token-file", TOKEN_ENV)
        from_env = ""
    wait = TOKEN_WAIT if wait is None else wait
    if token_file:
        secret = _read_token_file(token_file, delete_file)
    elif token_fd is not None:
        secret = JoinSecret(_read_line(token_fd, f"descriptor {token_fd}", wait))
        with contextlib.suppress(OSError):
            os.close(token_fd)
    elif from_env:
        log.warning(
            "reading the join token from $%s: `ps e` and /proc/PID/environ show it to this "
            "user and root; pipe it on stdin or use --token-file instead",
            TOKEN_ENV,
        )
        secret = JoinSecret(from_env)
    elif os.isatty(0):
        secret = JoinSecret(getpass.getpass("join token: ").strip())
    else:
        secret = JoinSecret(_read_line(0, "stdin", wait))
    if not secret.token:
        raise AgentError("no join token: pipe it on stdin, or pass --token-file or --token-fd")
    if not 16 <= len(secret.token) <= 256 or any(
        character.isspace() or not character.isprintable() for character in secret.token
    ):  # never quote it: it may be a wrong file's content, or the token itself
        raise AgentError(
            f"the join token read does not look like one ({len(secret.token)} characters; "
            "expected one line of 16-256 printable characters)"
        )
    return secret


def read_token(
    token_file: str | None = None, token_fd: int | None = None, delete_file: bool = False
) -> str:
    """The join token alone (see read_join_secret)."""
    return read_join_secret(token_file, token_fd, delete_file).token


# ---------------------------------------------------------------- run: register, then heartbeat


class _Stopped(Exception):
    """SIGTERM (systemd stopping the service): leave the loop, exit 0."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def _backoff(failures: int, cap: float) -> float:
    """Seconds before retry number `failures`: 1, 2, 4, ... up to `cap`, less a random part of
    up to half, so a fleet that lost the API at once does not come back at once."""
    return min(cap, 2.0 ** (failures - 1)) * random.uniform(0.5, 1.0)


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


def until_through(call: Callable, what: str) -> Any:
    """`call()`, retried with backoff for as long as the control plane is out of reach or
    failing (a transient AgentError: no connection, 5xx, 429); a refusal (4xx) is raised.
    Logged when failures start and every tenth time."""
    failures = 0
    while True:
        try:
            return call()
        except AgentError as error:
            if not error.transient:
                raise
            failures += 1
            if failures % 10 == 1:
                log.warning("%s failed (%d in a row): %s; retrying", what, failures, error)
            time.sleep(max(_backoff(failures, MAX_PAUSE), error.retry_after or 0.0))


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
            time.sleep(max(_backoff(failures, min(interval, MAX_PAUSE)), error.retry_after or 0.0))
            continue
        if failures:
            log.info("heartbeats accepted again after %d failed", failures)
            failures = 0
        interval = _interval(answer.get("interval_seconds"), interval)
        if runner is not None:
            runner.heard(answer, interval)
        if bool(answer.get("draining")) != draining:
            draining = not draining
            log.info("draining: no new job will be placed here" if draining else "not draining")
        time.sleep(max(0.0, started + interval - time.monotonic()))


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

    def call(path: str, body: dict | None, what: str) -> dict:
        return call_api(api_url, path, body, credential, args.ca_file, tries=1, what=what,
                        timeout=WORK_HTTP_TIMEOUT)  # fmt: skip

    runner = WorkRunner(call, state_dir)
    threading.Thread(target=runner.loop, name="work", daemon=True).start()
    log.info("heartbeating to %s", masked_url(url))
    return heartbeat_forever(url, credential, args.ca_file, registered, probe, runner)


# ---------------------------------------------------------------- the work: run, ship, report

WORK_SUBDIR = "work"  # <state dir>/work/<work id>/, removed once the end is reported
ASSIGNMENT_FILE = "assignment.json"  # written before the start is reported
SPAWNING_FILE = "spawning"  # written just before the supervisor starts: never started again
PID_FILE = "pid"  # the supervisor's, which is the work's process group
CGROUP_FILE = "cgroup"  # the work's own cgroup v2 directory ("" where none could be made)
WORK_MARK = "GPUPROV_WORK_ID"  # in the work's environment: its processes found by it in /proc
EXIT_FILE = "exit.json"  # the supervisor's last word: {"code", "phase"}
CURSOR_FILE = "shipped.json"  # how far the output was sent, and the chunk being sent
STREAMS = ("stdout", "stderr")  # and the files in the directory the work's output goes to
CHUNK_BYTES = 32 * 1024  # per log call: well inside the API's 64 KiB body, JSON-escaped
WORK_POLL = 5.0  # seconds between reads of the assignment while reserved, busy or running
SHIP_EVERY = 1.0  # seconds between sends of new output
WORK_HTTP_TIMEOUT = 15.0
STOP_GRACE = 30.0  # SIGTERM, this long, SIGKILL (the assignment says how long)
UNKNOWN_EXIT = -1  # the work ended, and nobody saw how
TAIL_CHARS = 4000
WORK_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _write_json(path: str, value: object) -> None:
    """Written aside (0600), then renamed over: a reader sees the old file or the new one."""
    part = f"{path}.{os.getpid()}.part"
    descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(value, handle, indent=1)
    os.replace(part, path)


def _put(path: str, text: str, new: int = 0) -> None:
    """`text` written to `path` (`new`: os.O_CREAT, a 0600 file) where that can be; a cgroup's
    file that is not there is never created in its place."""
    flags = os.O_WRONLY | new
    with contextlib.suppress(OSError), os.fdopen(os.open(path, flags, 0o600), "w") as handle:
        handle.write(text)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def new_cgroup(name: str) -> str:
    """A cgroup v2 directory `name` under the agent's own, for one work; "" where there is no
    cgroup v2 the agent may write (cgroup v1 alone, a cgroup not delegated to its user): the
    work's processes are then found by its mark alone."""
    own = re.findall(r"^0::(/\S*)", _read("/proc/self/cgroup"), re.M)
    for mount in _read("/proc/mounts").splitlines():
        if own and " cgroup2 " in mount:
            path = mount.split()[1] + own[0].rstrip("/") + "/" + name
            with contextlib.suppress(OSError):
                os.mkdir(path)
                return path
    return ""


def sweep(mark: str, cgroup: str = "") -> None:
    """Every process of one work killed, whatever session or group it moved to (`setsid`, a
    double fork): those in its cgroup (frozen, then cgroup.kill where the kernel has it) and
    those whose environment carries its mark, round after round until none is left (one forked
    meanwhile is caught next round); then its cgroup is removed. /proc/self never carries a
    work's mark: the agent's own environment has none."""
    tag = f"\0{WORK_MARK}={mark}\0"
    _put(cgroup + "/cgroup.freeze", "1")  # frozen, nothing forks meanwhile
    _put(cgroup + "/cgroup.kill", "1")  # from Linux 5.14; before it, each pid below
    for _ in range(99):
        pids = _read(cgroup + "/cgroup.procs").split()
        pids += [pid for pid in os.listdir("/proc") if tag in "\0" + _read(f"/proc/{pid}/environ")]
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
        if not pids:
            break
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.rmdir(cgroup)


def _read_json(path: str) -> dict | None:
    try:
        value = json.loads(_read(path))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def work_env(extra: dict) -> dict:
    """The agent's own basics (never its credential or a token), and the assignment's env."""
    env = {key: value for key, value in os.environ.items() if key in WORK_ENV or key[:3] == "LC_"}
    env.setdefault("PATH", DEFAULT_PATH)
    if "HOME" not in env:
        with contextlib.suppress(KeyError):
            env["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
    env.update({str(key): str(value) for key, value in extra.items()})
    return env


def supervise(work_dir: str) -> int:
    """`agent.py supervise DIR`, which the agent starts (never a person): the leader of the
    work's process group. setup, then run, each `/bin/sh -c` (a non-login shell), their output
    appended to DIR/stdout and DIR/stderr, and the exit status written last, so an agent
    restarted meanwhile learns how the work ended. A stop (SIGTERM to the group) reaches the
    shells, and no phase starts after it. It first moves into the work's cgroup, so that all
    the work starts is in it."""
    _put(_read(os.path.join(work_dir, CGROUP_FILE)) + "/cgroup.procs", str(os.getpid()))
    stops: list = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: stops.append(number))
    command = (_read_json(os.path.join(work_dir, ASSIGNMENT_FILE)) or {}).get("command") or {}
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out, err = (os.open(os.path.join(work_dir, stream), flags, 0o600) for stream in STREAMS)
    code, phase = 0, "run"
    for phase in ("setup", "run"):
        if command.get(phase) and not stops:
            shell = ["/bin/sh", "-c", command[phase]]
            code = subprocess.call(shell, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        if stops and not code:
            code = -stops[0]
        if code:
            break
    _write_json(os.path.join(work_dir, EXIT_FILE), {"code": code, "phase": phase})
    return 0


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
        self.cursor = _read_json(self.file(CURSOR_FILE)) or {"seq": 0, "stdout": 0, "stderr": 0}
        self.tail = ""
        self.cgroup = _read(self.file(CGROUP_FILE))
        self.pgid: int | None = int(_read(self.file(PID_FILE)) or 0) or None

    def file(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def spawn(self) -> None:
        """The supervisor, leading a new session (so a process group of its own) in a cgroup of
        its own, with the work's environment and mark; noted before (spawning) and after
        (pid)."""
        _put(self.file(SPAWNING_FILE), "", os.O_CREAT)
        self.spawned = True
        self.cgroup = new_cgroup("gpuprov-" + self.id)
        _put(self.file(CGROUP_FILE), self.cgroup, os.O_CREAT)
        env = work_env({**(self.assignment["command"].get("env") or {}), WORK_MARK: self.id})
        argv = [sys.executable or "python3", "-I", "-S", os.path.abspath(__file__), "supervise"]
        _put(self.file("supervisor.log"), "", os.O_CREAT)  # 0600 before it is opened
        with open(self.file("supervisor.log"), "ab") as output:
            self.process = subprocess.Popen(
                [*argv, self.directory], stdin=subprocess.DEVNULL, stdout=output,
                stderr=output, cwd=env["HOME"] if os.path.isdir(env.get("HOME", "")) else "/",
                env=env, start_new_session=True,
            )  # fmt: skip
        self.pgid = self.process.pid
        _put(self.file(PID_FILE), str(self.pgid), os.O_CREAT)

    def running(self) -> bool:
        if self.process is not None:
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
            self.end()
            self.killed = True

    def outcome(self) -> tuple:
        """(exit code, a line for the tail or "") once the work has ended."""
        ended = _read_json(self.file(EXIT_FILE))
        if ended is not None:
            code = int(ended.get("code", UNKNOWN_EXIT))
            setup = code and ended.get("phase") == "setup"
            return code, f"gpuprov-agent: setup exited {code}; run did not start" if setup else ""
        if self.killed:
            return -signal.SIGKILL, f"gpuprov-agent: killed after the {self.grace:g}s grace period"
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
                    _write_json(self.file(CURSOR_FILE), cursor)
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
        _write_json(self.file(CURSOR_FILE), self.cursor)

    def _read(self, stream: str, start: int, size: int) -> bytes:
        try:
            with open(self.file(stream), "rb") as handle:
                handle.seek(start)
                return handle.read(size)
        except OSError:
            return b""


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
        self.wake, self.revoked = threading.Event(), threading.Event()

    def heard(self, answer: dict, interval: float) -> None:
        """A heartbeat's answer (the heartbeat thread): a stop request reaches the work now."""
        self.watching = answer.get("state") in ("reserved", "busy")
        self.poll_every = min(WORK_POLL, interval)
        work, work_id = self.work, answer.get("work_id")
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
                time.sleep(_backoff(failures, MAX_PAUSE))
            self.wake.wait(SHIP_EVERY)
            self.wake.clear()

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
            assignment = self._poll() if self.watching or not self.next_poll else None
            if not assignment:
                return
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            os.mkdir(os.path.join(self.root, assignment["id"]), 0o700)
            work = self.work = Work(os.path.join(self.root, assignment["id"]), assignment)
            _write_json(work.file(ASSIGNMENT_FILE), assignment)  # known before any start
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

    def _unfinished(self) -> Work | None:
        """Work known from before a restart of this agent, whose end it has not reported."""
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(self.root)):
                assignment = _read_json(os.path.join(self.root, name, ASSIGNMENT_FILE))
                if assignment:
                    log.info("work %s: known from before a restart; following it", name)
                    return Work(os.path.join(self.root, name), assignment)
        return None

    def _start(self, work: Work) -> None:
        """Report the start, then start it. A refusal (stopped or given up before it started)
        means it never starts."""
        try:
            self._through(f"/v1/work/{work.id}/started", {}, "reporting the start")
        except AgentError as refused:
            return self._done(work, refused)
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


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuprov-agent", description="gpuprov node agent")
    commands = parser.add_subparsers(dest="command", required=True)
    probe_command = commands.add_parser("probe", help="print this machine's capabilities as JSON")
    reg = commands.add_parser(
        "register",
        help="probe, then register with the join token from stdin, --token-fd or --token-file",
    )
    daemon = commands.add_parser(
        "run",
        help="register once (unless a credential is kept), then heartbeat until revoked",
    )
    daemon.add_argument("--url", help=f"the API (default: {URL_ENV}= in FILE, or worker.json)")
    daemon_source = daemon.add_mutually_exclusive_group()
    daemon_source.add_argument("--token-file", help="file with the token, or an env file (0600)")
    daemon_source.add_argument("--token-fd", type=int, metavar="N", help="read the token from fd N")
    daemon.add_argument(
        "--delete-token-file", action="store_true", help="remove it once registered"
    )
    for command in (probe_command, reg, daemon):
        command.add_argument("--disk-path", default="/", help="filesystem reported as disk_gb")
        command.add_argument("--smi-timeout", type=float, default=SMI_TIMEOUT, metavar="SECONDS")
        command.add_argument(
            "--libcuda", default=LIBCUDA, help="library for the CUDA init check; 'none' skips it"
        )
    reg.add_argument("--url", help=f"the API, e.g. http://10.0.0.1:8080 (or {URL_ENV}= in FILE)")
    source = reg.add_mutually_exclusive_group()
    source.add_argument("--token-file", help="file with the token, or an env file (mode 0600)")
    source.add_argument("--token-fd", type=int, metavar="N", help="read the token from fd N")
    source.add_argument("--token", help=argparse.SUPPRESS)  # refused: see main()
    reg.add_argument("--delete-token-file", action="store_true", help="remove it once read")
    reg.add_argument("--tries", type=int, default=10, help="attempts while the API is down")
    supervisor = commands.add_parser("supervise", help="(started by `run`) lead a work's group")
    supervisor.add_argument("work_dir")
    whoami = commands.add_parser("whoami", help="ask the API about this worker (its credential)")
    whoami.add_argument("--url", required=True, help="the API, e.g. https://10.0.0.1:8080")
    whoami.add_argument("--tries", type=int, default=3, help="attempts while the API is down")
    for command in (reg, whoami, daemon):
        command.add_argument("--ca-file", help="pin the CA of the API's certificate (https)")
        command.add_argument(
            "--state-dir",
            help="where the worker credential is kept (default: this file's directory)",
        )
    return parser


def main(argv: list | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "supervise":
        return supervise(args.work_dir)
    logging.basicConfig(level=logging.INFO, format="gpuprov-agent: %(message)s")
    try:
        if args.command == "whoami":
            credential = read_credential(args.state_dir or default_state_dir())
            print(json.dumps(call_api(args.url, "/v1/workers/me", None, credential,
                                      args.ca_file, args.tries), indent=2))  # fmt: skip
            return 0
        libcuda = "" if args.libcuda.lower() == "none" else args.libcuda
        if args.command == "run":
            args.libcuda = libcuda
            signal.signal(signal.SIGTERM, _stop)
            return run(args)
        if args.command == "register":
            if args.token is not None:  # already exposed in ps and shell history: do not use it
                raise AgentError(
                    "--token is not accepted: the command line is visible to every user in ps. "
                    "Mint a new token and pipe it on stdin (or use --token-file)"
                )
            # First: a missing token fails before the probe, and the environment is scrubbed
            # of $GPUPROV_JOIN_TOKEN before anything is started.
            secret = read_join_secret(args.token_file, args.token_fd, args.delete_token_file)
            url = args.url or secret.api_url
            if not url:
                raise AgentError(f"no API URL: pass --url (or {URL_ENV}= in the token file)")
            state_dir = args.state_dir or default_state_dir()
            prepare_state_dir(state_dir)
        runtime = check_gpu_runtime(args.smi_timeout, libcuda)
        log.info("GPU runtime: %s: %s", runtime.verdict, runtime.message or "GPUs usable")
        capabilities = capabilities_of(runtime, args.disk_path)
        if args.command == "probe":
            print(json.dumps(capabilities, indent=2))
            return 0
        identity = {"vm": secret.vm[:128]} if secret.vm else None  # logged by the API if wrong
        response = register(
            url, secret.token, capabilities, identity, tries=args.tries, ca_file=args.ca_file
        )
        response = keep_credential(state_dir, response, url, capabilities)
    except AgentError as error:
        log.error("%s", error)
        return 1 if error.transient else 2
    except (_Stopped, KeyboardInterrupt):
        log.info("stopped")
        return 0
    print(json.dumps(response, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

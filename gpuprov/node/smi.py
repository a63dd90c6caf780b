"""Running nvidia-smi and the CUDA check under timeouts, and reading what they print: the GPU
list (`--query-gpu` CSV), the CUDA version (`--version`, else the banner), the kernel module's
version, and a failure classified into a verdict in nvidia-smi's or CUDA's own words.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys

from .join_token import TOKEN_ENV

log = logging.getLogger(__name__)

SMI_TIMEOUT = 10.0  # seconds per nvidia-smi call
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
GPU_QUERY = ("--query-gpu=name,memory.total,driver_version,uuid", "--format=csv,noheader,nounits")
MAX_TEXT = 256  # WorkerCapabilities' short text fields
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


class SmiFailed(Exception):
    """nvidia-smi could not answer: the verdict, the message, and whatever it printed."""

    def __init__(self, message: str, verdict: str = SMI_FAILED, output: str = "") -> None:
        super().__init__(message)
        self.verdict = verdict
        self.output = output


class TimedOut(Exception):
    pass


def run_bounded(argv: list, timeout: float, env: dict | None = None) -> tuple:
    """(exit status, stdout, stderr) of argv, started without $GPUPROV_JOIN_TOKEN; TimedOut after
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
        raise TimedOut from None
    return process.returncode, stdout, stderr


def nvidia_smi(args: tuple, timeout: float) -> str:
    """nvidia-smi's stdout, or SmiFailed with the verdict and reason."""
    try:
        code, stdout, stderr = run_bounded(["nvidia-smi", *args], timeout)
    except FileNotFoundError:
        raise SmiFailed("nvidia-smi not found", SMI_MISSING) from None
    except OSError as error:
        raise SmiFailed(f"nvidia-smi cannot run: {error.strerror}") from None
    except TimedOut:
        raise SmiFailed(f"nvidia-smi timed out after {timeout:g}s") from None
    if code != 0:
        verdict, message = classify_smi_failure(code, stderr + "\n" + stdout)
        raise SmiFailed(message, verdict, stdout)
    return stdout


def classify_smi_failure(returncode: int, output: str) -> tuple:
    """(verdict, message) for an nvidia-smi that exited non-zero. The message quotes what it
    said (NVML errors go to stdout on most drivers), leaving out any GPU rows it printed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = "; ".join(line for line in lines if gpu_row(line) is None)[:500]
    message = f"nvidia-smi exited {returncode}: {said or '(no output)'}"
    if MISMATCH_TEXT.lower() in output.lower():
        return DRIVER_MISMATCH, message
    if returncode == SMI_NOT_FOUND_EXIT or NO_DEVICES_TEXT in output:
        return NO_GPU, message
    return SMI_FAILED, message


def _field(raw: str) -> str | None:
    value = raw.strip()
    return None if not value or value.startswith("[") else value[:MAX_TEXT]  # [N/A]


def gpu_row(line: str) -> dict | None:
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
    """The rows of GPU_QUERY's output. Raises SmiFailed on a line that is not such a row:
    better no GPU than a wrong one."""
    gpus = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        row = gpu_row(line)
        if row is None:
            raise SmiFailed(f"unparsable nvidia-smi output: {line.strip()[:200]!r}")
        gpus.append(row)
    return gpus


def parse_cuda_version(text: str) -> str | None:
    match = CUDA_VERSION.search(text)
    return match.group(1) if match else None


def read_cuda_version(timeout: float) -> str | None:
    """From `nvidia-smi --version` (drivers from 535 or so), else from the banner. Informational:
    a miss is not a runtime failure."""
    for args in (("--version",), ()):
        with contextlib.suppress(SmiFailed):
            version = parse_cuda_version(nvidia_smi(args, timeout))
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


def cuda_init(libcuda: str, timeout: float) -> tuple | None:
    """None if CUDA initialises (or the check cannot run here); else (verdict, message)."""
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the whole machine, whatever this shell was given
    argv = [sys.executable or "python3", "-I", "-S", "-c", CUDA_CHECK, libcuda]
    try:
        code, stdout, stderr = run_bounded(argv, timeout, env)
    except TimedOut:
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

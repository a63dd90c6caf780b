"""The registration probe: the GPU runtime's verdict (nvidia-smi's list, then cuInit through
libcuda in a child process) and the machine's size, as the WorkerCapabilities payload the API
validates (gpuprov/models.py's WorkerCapabilities: keep them in step).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
from dataclasses import dataclass, field

from .smi import (
    DRIVER_MISMATCH,
    GPU_QUERY,
    NO_DEVICES_TEXT,
    NO_GPU,
    OK,
    SMI_TIMEOUT,
    SmiFailed,
    cuda_init,
    gpu_row,
    kernel_module_version,
    nvidia_smi,
    parse_gpus,
    read_cuda_version,
)

log = logging.getLogger(__name__)

AGENT_VERSION = "0.2.0"
CUDA_TIMEOUT = 30.0  # cuInit initialises every GPU: seconds on a big box without persistence
LIBCUDA = "libcuda.so.1"
MAX_GPUS = 64  # WorkerCapabilities.gpus
MAX_ERROR = 2000  # WorkerCapabilities.gpu_runtime_error


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


def check_gpu_runtime(
    smi_timeout: float | None = None, libcuda: str | None = None, cuda_version: bool = True
) -> GpuRuntime:
    """List the GPUs with nvidia-smi, read the CUDA version (unless `cuda_version` is False:
    a heartbeat does not report it), and initialise CUDA.

    `libcuda`: the library cuInit is called through (default LIBCUDA; "" skips the CUDA check).
    """
    timeout = SMI_TIMEOUT if smi_timeout is None else smi_timeout
    try:
        output = nvidia_smi(GPU_QUERY, timeout)
        gpus = [] if NO_DEVICES_TEXT in output else parse_gpus(output)  # said with exit 0
    except SmiFailed as failed:
        message, module = str(failed), kernel_module_version()
        if failed.verdict == DRIVER_MISMATCH and module:
            message += f"; kernel module {module}"
        # A lost GPU still leaves the others' rows: report what could be read, as not OK.
        readable = [row for row in map(gpu_row, failed.output.splitlines()) if row]
        return GpuRuntime(failed.verdict, message[:MAX_ERROR], readable[:MAX_GPUS])
    if not gpus:
        return GpuRuntime(NO_GPU, "no GPU visible")
    gpus = gpus[:MAX_GPUS]
    version = read_cuda_version(timeout) if cuda_version else None
    library = LIBCUDA if libcuda is None else libcuda
    problem = cuda_init(library, CUDA_TIMEOUT) if library else None
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

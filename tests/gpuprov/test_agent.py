"""The node agent: nvidia-smi parsing against captured outputs (providers/fake/nvidia_smi/), the
probe against fake nvidia-smi executables and a fake libcuda, registration against a local HTTP
server and the real API app, stdlib-only and self-contained, and the join token never shown."""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.models import GpuInfo, WorkerCapabilities
from gpuprov.node import probe as node_probe
from gpuprov.node import smi as node_smi
from gpuprov.node.credentials import CREDENTIAL_FILE, NODE_FILE
from gpuprov.node.errors import AgentError
from gpuprov.node.http_client import register
from gpuprov.node.join_token import TOKEN_ENV, read_join_secret, read_token
from gpuprov.node.probe import check_gpu_runtime, probe
from gpuprov.node.smi import (
    GPU_QUERY,
    SmiFailed,
    classify_smi_failure,
    parse_cuda_version,
    parse_gpus,
)
from gpuprov.store.credentials import Credentials
from gpuprov.store.records import Records
from providers import agent_artifact
from providers.base import ResourceRequest, compatibility_reasons
from providers.fake.node import DEFAULT_FIXTURES
from providers.ssh_common import AGENT_FILE
from tests.gpuprov.test_api import vm_token, worker_rows

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[2]
NODE_PACKAGE = REPO / "gpuprov" / "node"
FIXTURES = DEFAULT_FIXTURES  # the fake cloud's package data: captured nvidia-smi outputs


def install_agent(directory: Path) -> Path:
    """agent.pyz as every node gets it (the same bytes), alone in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    installed = directory / AGENT_FILE
    installed.write_bytes(agent_artifact.artifact())
    return installed


@functools.cache
def agent_pyz() -> Path:
    """One built agent.pyz for this test process, in a directory of its own."""
    return install_agent(Path(tempfile.mkdtemp(prefix="gpuprov-agent-")))


TOKEN = "tok-Zq8vJ3nX0aB4cD5eF6gH7iJ8kL9mN0pQ"  # long enough for the API's min_length
UNKNOWN_OPTION = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


def smi_script(
    query: str,
    query_exit: int = 0,
    version: str | None = None,
    banner: str | None = "banner-h100-80gb-hbm3-x8.txt",
    dump: Path | None = None,
) -> str:
    """A POSIX-sh nvidia-smi printing captured fixtures: `query` (exit `query_exit`) for the
    agent's exact GPU query, `version` for --version, `banner` with no arguments. With `dump`,
    it first appends its own command line and environment there (to look for the token)."""
    lines = []
    if dump is not None:
        lines += [f'echo "argv: $0 $*" >> {dump}', f"tr '\\0' '\\n' < /proc/$$/environ >> {dump}"]
    first, second = GPU_QUERY
    lines += [
        f'if [ "$1" = "{first}" ] && [ "$2" = "{second}" ] && [ "$#" -eq 2 ]; then',
        f"  cat {FIXTURES / query}; exit {query_exit}",
    ]
    if version is not None:
        lines += ['elif [ "$1" = "--version" ]; then', f"  cat {FIXTURES / version}"]
    if banner is not None:
        lines += ['elif [ "$#" -eq 0 ]; then', f"  cat {FIXTURES / banner}"]
    lines += ["else", f'  echo "{UNKNOWN_OPTION}"; exit 2', "fi"]
    return "\n".join(lines) + "\n"


H100X8 = smi_script("query-h100-80gb-hbm3-x8.txt")  # used by tests/gpuprov/test_join.py


def install_nvidia_smi(bin_dir: Path, script: str) -> Path:
    """Write `script` as an executable nvidia-smi in bin_dir; return bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    executable = bin_dir / "nvidia-smi"
    executable.write_text("#!/bin/sh\n" + script)
    executable.chmod(0o755)
    return bin_dir


@pytest.fixture(autouse=True)
def hermetic(tmp_path, monkeypatch):
    """No real libcuda, kernel module or token of this machine leaks into a test."""
    monkeypatch.setattr(node_probe, "LIBCUDA", str(tmp_path / "no-libcuda.so"))
    monkeypatch.setattr(node_smi, "DRIVER_VERSION_FILE", str(tmp_path / "no-driver-version"))
    monkeypatch.delenv(TOKEN_ENV, raising=False)


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """Put a fake nvidia-smi (given as a script body) first on PATH."""

    def put(script: str) -> None:
        bin_dir = install_nvidia_smi(tmp_path / "bin", script)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return put


def valid(capabilities: dict) -> WorkerCapabilities:
    """The agent's JSON is exactly a WorkerCapabilities payload (unknown fields are refused)."""
    return WorkerCapabilities.model_validate(json.loads(json.dumps(capabilities)))


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# ---------------------------------------------------------------- parsing captured outputs


@pytest.mark.parametrize(
    ("name", "count", "model", "memory_mb", "driver"),
    [
        ("query-h100-80gb-hbm3.txt", 1, "NVIDIA H100 80GB HBM3", 81559, "550.54.15"),
        ("query-a100-sxm4-40gb.txt", 1, "NVIDIA A100-SXM4-40GB", 40960, "535.129.03"),
        ("query-l4.txt", 1, "NVIDIA L4", 23034, "550.90.07"),
        ("query-h100-80gb-hbm3-x8.txt", 8, "NVIDIA H100 80GB HBM3", 81559, "550.90.07"),
    ],
)
def test_parse_gpus_reads_each_captured_query(name, count, model, memory_mb, driver):
    gpus = parse_gpus(fixture(name))
    assert len(gpus) == count
    assert {(gpu["name"], gpu["memory_mb"], gpu["driver_version"]) for gpu in gpus} == {
        (model, memory_mb, driver)
    }
    uuids = [gpu["uuid"] for gpu in gpus]
    assert len(set(uuids)) == count and all(uuid.startswith("GPU-") for uuid in uuids)
    assert [GpuInfo.model_validate(gpu) for gpu in gpus]  # the server's model takes each one


@pytest.mark.parametrize(
    ("row", "name", "memory_mb", "driver", "uuid"),
    [
        # Padded fields, [N/A] where a value is unsupported, units left in by an old driver.
        ("  NVIDIA L4 ,  [N/A] , 535.161.07 ,[N/A]  ", "NVIDIA L4", None, "535.161.07", None),
        ("Tesla T4, 15360 MiB, 470.82.01, [Not Supported]", "Tesla T4", 15360, "470.82.01", None),
        ("NVIDIA GB10, [N/A], 580.142, GPU-1234", "NVIDIA GB10", None, "580.142", "GPU-1234"),
    ],
)
def test_parse_gpus_reads_padded_and_unsupported_fields(row, name, memory_mb, driver, uuid):
    gpus = parse_gpus(f"{row}\n\n")
    assert gpus == [{"name": name, "memory_mb": memory_mb, "driver_version": driver, "uuid": uuid}]


@pytest.mark.parametrize(
    "line",
    [
        "NVIDIA H100 80GB HBM3, 81559",  # truncated row
        "<html>Segmentation fault",
        "Unable to determine the device handle, GPU is lost, Reboot, now",  # prose, 3 commas
        "[N/A], 81559, 550.54.15, GPU-1",  # no name
    ],
)
def test_parse_gpus_refuses_a_line_that_is_not_a_row(line):
    with pytest.raises(SmiFailed, match="unparsable nvidia-smi output"):
        parse_gpus(fixture("query-l4.txt") + line + "\n")


MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NO_NVML = (
    "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
    "NVIDIA Display Driver is properly installed and present in your system.; Please also try "
    "adding directory that contains libnvidia-ml.so to your system PATH."
)
LOST = "Unable to determine the device handle for GPU0000:A8:00.0: GPU is lost.  Reboot the system"
# fixture, nvidia-smi's exit status, verdict, message
FAILURES = [
    ("driver-mismatch.txt", 18, "driver_mismatch", f"{MISMATCH}; NVML library version: 570.124"),
    ("driver-mismatch-r470.txt", 18, "driver_mismatch", MISMATCH),
    ("no-devices.txt", 6, "no_gpu", "No devices were found"),
    ("no-driver.txt", 9, "nvidia_smi_failed", NO_DRIVER),
    ("no-nvml.txt", 12, "nvidia_smi_failed", NO_NVML),
    ("query-gpu-lost.txt", 15, "nvidia_smi_failed", f"{LOST} to recover this GPU"),
]


@pytest.mark.parametrize(("name", "code", "verdict", "said"), FAILURES)
def test_classify_smi_failure_names_each_captured_error(name, code, verdict, said):
    assert classify_smi_failure(code, "\n" + fixture(name)) == (
        verdict,
        f"nvidia-smi exited {code}: {said}",
    )


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("version-550.txt", "12.4"),
        ("banner-h100-80gb-hbm3-x8.txt", "12.4"),
        ("banner-l4-610.txt", "13.3"),  # "CUDA UMD Version" from driver 610
        ("version-610.txt", None),
    ],
)
def test_parse_cuda_version_reads_every_spelling(name, version):
    assert parse_cuda_version(fixture(name)) == version
    assert parse_cuda_version("CUDA Version                              : Not Found") is None


# ---------------------------------------------------------------- probe


def test_probe_reports_eight_healthy_h100s(fake_smi):
    fake_smi(H100X8)
    capabilities = probe()
    model = valid(capabilities)
    assert model.gpu_runtime_ok is True and model.gpu_runtime_error is None
    assert [gpu.name for gpu in model.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert {gpu.memory_mb for gpu in model.gpus} == {81559}
    assert model.gpus[3].uuid == "GPU-3f1e9d7c-5b3a-4f2e-8d6c-9a1b3c5d7e43"
    assert model.driver_version == "550.90.07" and model.cuda_version == "12.4"
    assert model.cpu_count == os.cpu_count() and model.cpu_count >= 1
    assert model.memory_gb and model.memory_gb > 0
    assert model.disk_gb and model.disk_gb > 0
    shape = model.shape()
    assert (shape.gpu_name, shape.gpu_count, shape.gpu_runtime_ok) == (
        "NVIDIA H100 80GB HBM3",
        8,
        True,
    )
    assert compatibility_reasons(shape, ResourceRequest(gpu="H100", gpus_per_node=8)) == []


def test_agent_payload_has_exactly_the_server_models_fields(fake_smi):
    fake_smi(H100X8)
    capabilities = probe()
    assert set(capabilities) == set(WorkerCapabilities.model_fields)
    assert set(capabilities["gpus"][0]) == set(GpuInfo.model_fields)


@pytest.mark.parametrize(
    ("query", "gpu", "memory_mb"),
    [
        ("query-h100-80gb-hbm3.txt", "H100", 81559),
        ("query-a100-sxm4-40gb.txt", "A100", 40960),
        ("query-l4.txt", "L4", 23034),
    ],
)
def test_probe_of_a_single_gpu_node_places_it(fake_smi, query, gpu, memory_mb):
    fake_smi(smi_script(query, version="version-550.txt", banner=None))
    model = valid(probe())
    assert model.gpu_runtime_ok and model.cuda_version == "12.4"
    assert [g.memory_mb for g in model.gpus] == [memory_mb]
    assert compatibility_reasons(model.shape(), ResourceRequest(gpu=gpu)) == []
    assert compatibility_reasons(model.shape(), ResourceRequest(gpu=gpu, gpus_per_node=2)) == [
        "1 GPUs < 2"
    ]


def test_probe_falls_back_to_the_banner_when_version_has_no_cuda(fake_smi):
    fake_smi(smi_script("query-l4.txt", version="version-610.txt", banner="banner-l4-610.txt"))
    assert probe()["cuda_version"] == "13.3"


def test_probe_without_any_cuda_version_still_works(fake_smi):
    fake_smi(smi_script("query-l4.txt", banner=None))
    model = valid(probe())
    assert model.gpu_runtime_ok and model.cuda_version is None


@pytest.mark.parametrize(("name", "code", "verdict", "said"), FAILURES)
def test_probe_reports_each_captured_failure_as_such(fake_smi, name, code, verdict, said):
    fake_smi(smi_script(name, query_exit=code))
    runtime = check_gpu_runtime()
    assert (runtime.verdict, runtime.message) == (verdict, f"nvidia-smi exited {code}: {said}")
    model = valid(probe())
    assert model.gpu_runtime_ok is False
    assert model.gpu_runtime_error == runtime.message
    assert model.cpu_count and model.memory_gb and model.disk_gb  # the rest is still reported
    if name == "query-gpu-lost.txt":  # the 7 GPUs it could read, and why the node is not OK
        assert len(model.gpus) == 7
        reasons = compatibility_reasons(model.shape(), ResourceRequest(gpu="H100", gpus_per_node=7))
        assert reasons == [f"GPU runtime not working: {runtime.message}"]
    else:
        assert model.gpus == []  # no GPU is claimed that could not be read


def test_a_driver_mismatch_names_the_loaded_kernel_module(fake_smi, tmp_path, monkeypatch):
    version_file = tmp_path / "version"
    version_file.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
    )
    monkeypatch.setattr(node_smi, "DRIVER_VERSION_FILE", str(version_file))
    fake_smi(smi_script("driver-mismatch.txt", query_exit=18))
    model = valid(probe())
    assert model.gpu_runtime_error == (
        f"nvidia-smi exited 18: {MISMATCH}; NVML library version: 570.124; kernel module 550.54.15"
    )
    assert model.driver_version == "550.54.15"  # the driver that is loaded


def test_placement_quotes_the_runtime_error_of_a_node_with_no_readable_gpu(fake_smi):
    fake_smi(smi_script("driver-mismatch.txt", query_exit=18))
    model = valid(probe())
    reasons = compatibility_reasons(model.shape(), ResourceRequest(gpu="H100", gpus_per_node=8))
    assert f"GPU runtime not working: {model.gpu_runtime_error}" in reasons


@pytest.mark.parametrize(
    ("script", "verdict", "message"),
    [
        pytest.param("exit 0\n", "no_gpu", "no GPU visible", id="zero-gpus"),
        pytest.param(
            "echo 'No devices were found'\n", "no_gpu", "no GPU visible", id="no-devices-exit-0"
        ),
        pytest.param(
            "echo '<html>Segmentation fault'\n",
            "nvidia_smi_failed",
            "unparsable nvidia-smi output: '<html>Segmentation fault'",
            id="garbage",
        ),
        pytest.param(
            "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n",
            "nvidia_smi_failed",
            "nvidia-smi exited 9: NVIDIA-SMI has failed",
            id="message-on-stderr",
        ),
        pytest.param(
            "exit 3\n", "nvidia_smi_failed", "nvidia-smi exited 3: (no output)", id="silent"
        ),
    ],
)
def test_probe_reports_odd_nvidia_smi_behaviour(fake_smi, script, verdict, message):
    fake_smi(script)
    runtime = check_gpu_runtime()
    assert (runtime.verdict, runtime.message, runtime.gpus) == (verdict, message, [])
    assert valid(probe()).gpu_runtime_ok is False


def test_probe_without_nvidia_smi_says_missing(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    runtime = check_gpu_runtime()
    assert (runtime.verdict, runtime.message) == ("nvidia_smi_missing", "nvidia-smi not found")
    model = valid(probe())
    assert (model.gpu_runtime_ok, model.gpu_runtime_error) == (False, "nvidia-smi not found")
    assert model.gpus == [] and model.cpu_count


def test_probe_with_unexecutable_nvidia_smi_says_why(tmp_path, monkeypatch):
    bin_dir = install_nvidia_smi(tmp_path / "bin", "exit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o644)  # no x bit: even root cannot execute it
    monkeypatch.setenv("PATH", str(bin_dir))
    runtime = check_gpu_runtime()
    assert (runtime.verdict, runtime.message) == (
        "nvidia_smi_failed",
        "nvidia-smi cannot run: Permission denied",
    )


def test_probe_gives_up_on_a_hung_nvidia_smi_and_kills_it(fake_smi, tmp_path):
    pid_file = tmp_path / "smi.pid"
    fake_smi(f"echo $$ > {pid_file}\nexec sleep 60\n")
    started = time.monotonic()
    runtime = check_gpu_runtime(smi_timeout=0.5)
    assert time.monotonic() - started < 5
    assert (runtime.verdict, runtime.message) == (
        "nvidia_smi_failed",
        "nvidia-smi timed out after 0.5s",
    )
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left hanging
        os.kill(pid, 0)


def test_probe_reports_the_disk_it_is_asked_about(fake_smi, tmp_path, caplog):
    fake_smi(H100X8)
    assert probe(disk_path=str(tmp_path))["disk_gb"] == round(
        shutil.disk_usage(tmp_path).total / 1024**3, 1
    )
    assert probe(disk_path=str(tmp_path / "absent"))["disk_gb"] is None
    assert "disk size unknown" in caplog.text


# ---------------------------------------------------------------- the CUDA init check

FAKE_LIBCUDA = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static const char *mode(void) { const char *m = getenv("FAKE_CUINIT"); return m ? m : "0"; }
static const char *env(const char *name) { const char *v = getenv(name); return v ? v : "-"; }
int cuInit(unsigned int flags) {
    const char *report = getenv("FAKE_CUDA_REPORT");
    FILE *out = report ? fopen(report, "w") : NULL;
    if (out) {
        fprintf(out, "%s\n%s\n", env("CUDA_VISIBLE_DEVICES"), env("GPUPROV_JOIN_TOKEN"));
        fclose(out);
    }
    if (!strcmp(mode(), "abort")) abort();
    if (!strcmp(mode(), "hang")) sleep(60);
    return atoi(mode());
}
int cuDeviceGetCount(int *count) {
    *count = atoi(getenv("FAKE_CUDA_DEVICES") ? getenv("FAKE_CUDA_DEVICES") : "8");
    return 0;
}
int cuGetErrorName(int code, const char **name) {
    *name = code == 802 ? "CUDA_ERROR_SYSTEM_NOT_READY"
          : code == 803 ? "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" : "CUDA_ERROR_NO_DEVICE";
    return 0;
}
int cuGetErrorString(int code, const char **text) {
    *text = code == 802 ? "system not yet initialized"
          : code == 803 ? "system has unsupported display driver / cuda driver combination"
          : "no CUDA-capable device is detected";
    return 0;
}
"""


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory) -> Path:
    """A libcuda whose cuInit does what $FAKE_CUINIT says (a CUresult, "abort" or "hang")."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a fake libcuda")
    directory = tmp_path_factory.mktemp("libcuda")
    (directory / "fake.c").write_text(FAKE_LIBCUDA)
    library = directory / "libcuda.so.1"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(directory / "fake.c")],
        check=True,
        timeout=60,
    )
    return library


@pytest.mark.parametrize(
    ("mode", "devices", "verdict", "message"),
    [
        ("0", "8", "ok", None),
        (
            "802",
            "8",
            "cuda_init_failed",
            "CUDA init (cuInit) failed with 802 CUDA_ERROR_SYSTEM_NOT_READY: system not yet "
            "initialized (on an NVSwitch system, is nvidia-fabricmanager running?)",
        ),
        (
            "803",
            "8",
            "driver_mismatch",
            "CUDA init (cuInit) failed with 803 CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: system has "
            "unsupported display driver / cuda driver combination (libcuda does not match the "
            "kernel driver: cuda-compat?)",
        ),
        (
            "100",
            "8",
            "cuda_init_failed",
            "CUDA init (cuInit) failed with 100 CUDA_ERROR_NO_DEVICE: no CUDA-capable device is "
            "detected",
        ),
        ("0", "0", "cuda_init_failed", "CUDA init: cuDeviceGetCount found no device"),
        ("abort", "8", "cuda_init_failed", "CUDA init (cuInit) crashed: signal 6"),
    ],
)
def test_cuda_init_check(fake_smi, fake_libcuda, monkeypatch, mode, devices, verdict, message):
    fake_smi(H100X8)
    monkeypatch.setenv("FAKE_CUINIT", mode)
    monkeypatch.setenv("FAKE_CUDA_DEVICES", devices)
    runtime = check_gpu_runtime(libcuda=str(fake_libcuda))
    assert (runtime.verdict, runtime.message) == (verdict, message)
    assert len(runtime.gpus) == 8  # nvidia-smi read them; CUDA is what failed
    model = valid(probe(libcuda=str(fake_libcuda)))
    assert model.gpu_runtime_ok is (verdict == "ok")


def test_cuda_init_that_hangs_is_bounded(fake_smi, fake_libcuda, monkeypatch):
    fake_smi(H100X8)
    monkeypatch.setenv("FAKE_CUINIT", "hang")
    monkeypatch.setattr(node_probe, "CUDA_TIMEOUT", 0.5)
    started = time.monotonic()
    runtime = check_gpu_runtime(libcuda=str(fake_libcuda))
    assert time.monotonic() - started < 5
    assert (runtime.verdict, runtime.message) == (
        "cuda_init_failed",
        "CUDA init (cuInit) timed out after 0.5s",
    )


def test_cuda_check_sees_the_whole_machine_and_never_the_token(
    fake_smi, fake_libcuda, monkeypatch, tmp_path
):
    fake_smi(H100X8)
    report = tmp_path / "report"
    monkeypatch.setenv("FAKE_CUDA_REPORT", str(report))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # would hide every GPU from cuInit
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert check_gpu_runtime(libcuda=str(fake_libcuda)).ok
    assert report.read_text().split() == ["-", "-"]


def test_a_libcuda_that_cannot_be_loaded_skips_the_check(fake_smi, caplog):
    fake_smi(H100X8)
    runtime = check_gpu_runtime()  # LIBCUDA points nowhere (the hermetic fixture)
    assert runtime.ok
    assert "CUDA check skipped: cannot load" in caplog.text
    assert check_gpu_runtime(libcuda="").ok  # "" skips it without a word


# ---------------------------------------------------------------- self-contained, stdlib only


def test_agent_imports_only_the_standard_library_and_itself():
    imported, own = set(), {path.stem for path in NODE_PACKAGE.glob("*.py")}
    for module in NODE_PACKAGE.glob("*.py"):
        tree = ast.parse(module.read_text(), feature_version=(3, 8))  # and 3.8 grammar
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:  # within gpuprov.node only
                assert node.level == 1 and (node.module or "") in own, module.name
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
    assert imported, "no imports found: is the AST walk broken?"
    assert sorted(imported - set(sys.stdlib_module_names)) == []
    assert not imported & {"gpuprov", "providers", "pydantic", "tomllib", "zoneinfo", "graphlib"}


def _python38() -> str | None:
    """A Python 3.8 (the oldest the agent supports), if this machine has one."""
    candidates = [str(path) for path in Path.home().glob(".pyenv/versions/3.8*/bin/python3.8")]
    found = shutil.which("python3.8")
    if found and "/shims/" not in found:  # a pyenv shim may refuse to run it
        candidates.append(found)
    return sorted(candidates)[-1] if candidates else None


@pytest.mark.parametrize("python", ["current", "3.8"])
def test_agent_pyz_runs_alone_without_site_packages(fake_smi, fake_libcuda, tmp_path, python):
    interpreter = sys.executable if python == "current" else _python38()
    if interpreter is None:
        pytest.skip("no python3.8 here")
    # agent.pyz alone in a directory, `-I -S`: no gpuprov, no site-packages, as on a bare image.
    lone = install_agent(tmp_path / "lone")
    fake_smi(H100X8)
    result = subprocess.run(
        [interpreter, "-I", "-S", str(lone), "probe", "--libcuda", str(fake_libcuda)],
        cwd=lone.parent,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    model = valid(json.loads(result.stdout))
    assert len(model.gpus) == 8 and model.gpu_runtime_ok
    assert "GPU runtime: ok" in result.stderr


# ---------------------------------------------------------------- register


@dataclass
class FakeApi:
    """A real HTTP server on loopback answering registrations from a script of responses."""

    url: str
    responses: list[tuple[int, object]] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length", 0))
            api.requests.append(
                {
                    "path": self.path,
                    "content_type": self.headers.get("Content-Type"),
                    "body": json.loads(self.rfile.read(length)),
                }
            )
            status, body = api.responses.pop(0) if api.responses else (500, {"detail": "?"})
            payload = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield api
    server.shutdown()
    server.server_close()


ACCEPTED = {"worker_id": "w-1", "origin": "existing", "job": None, "vm": None, "label": "box"}
CAPABILITIES = {"gpus": [], "gpu_runtime_ok": False, "gpu_runtime_error": "no GPU visible"}


def test_register_posts_token_capabilities_and_identity(fake_api):
    fake_api.responses = [(200, ACCEPTED)]
    response = register(fake_api.url + "/", TOKEN, CAPABILITIES, {"label": "box"}, pause=0.01)
    assert response == ACCEPTED
    [request] = fake_api.requests
    assert request["path"] == "/v1/workers/register"
    assert request["content_type"] == "application/json"
    assert request["body"] == {
        "token": TOKEN,
        "capabilities": CAPABILITIES,
        "identity": {"label": "box"},
    }


@pytest.mark.parametrize(
    ("status", "detail", "message"),
    [
        (401, "join token already used", "join token already used"),
        (409, "job train refused the registration: moved on", "job train refused"),
        (413, "request body too large", "request body too large"),
        (
            422,
            [{"loc": ["body", "gpus"], "msg": "Extra inputs are not permitted", "input": TOKEN}],
            "body.gpus: Extra inputs are not permitted",
        ),
    ],
)
def test_register_refusal_is_final(fake_api, status, detail, message):
    body = detail if status == 413 else {"detail": detail}  # the 413 is plain text
    fake_api.responses = [(status, body), (200, ACCEPTED)]
    with pytest.raises(AgentError) as refused:
        register(fake_api.url, TOKEN, CAPABILITIES, tries=5, pause=0.01)
    assert refused.value.status == status and not refused.value.transient
    assert message in str(refused.value)
    assert TOKEN not in str(refused.value)  # a 422 echoes its input: never repeat it
    assert len(fake_api.requests) == 1  # not retried


def test_register_retries_a_503_then_succeeds(fake_api, caplog):
    fake_api.responses = [(503, {"detail": "job train cannot be reached now"}), (200, ACCEPTED)]
    with caplog.at_level(logging.DEBUG):
        assert register(fake_api.url, TOKEN, CAPABILITIES, pause=0.01) == ACCEPTED
    assert len(fake_api.requests) == 2
    assert "HTTP 503: job train cannot be reached now" in caplog.text


def test_register_gives_up_after_its_tries(fake_api):
    fake_api.responses = [(502, "bad gateway")] * 3
    with pytest.raises(AgentError, match="after 3 attempts: HTTP 502") as gave_up:
        register(fake_api.url, TOKEN, CAPABILITIES, tries=3, pause=0.01)
    assert gave_up.value.transient and gave_up.value.status is None
    assert len(fake_api.requests) == 3


def test_register_retries_while_the_api_is_unreachable():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(AgentError, match="after 2 attempts: cannot reach") as gave_up:
        register(url, TOKEN, CAPABILITIES, tries=2, pause=0.01)
    assert gave_up.value.transient


def test_register_never_logs_or_prints_the_token(fake_api, caplog, capsys):
    # The server even echoes the token back in its errors; the agent must not repeat it.
    fake_api.responses = [(503, {"detail": f"busy {TOKEN}"}), (401, {"detail": f"bad {TOKEN}"})]
    with caplog.at_level(logging.DEBUG), pytest.raises(AgentError) as refused:
        register(fake_api.url, TOKEN, CAPABILITIES, pause=0.01)
    out, err = capsys.readouterr()
    assert "bad <token>" in str(refused.value)
    for text in (caplog.text, out, err, str(refused.value)):
        assert TOKEN not in text


# ---------------------------------------------------------------- reading the join token


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "join"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("text", "url", "vm"),
    [
        (f"{TOKEN}\n", None, None),
        (f"\n  {TOKEN}  \n", None, None),
        # cloud-init's /etc/gpuprov/join.env (providers/userdata.py), quoted or exported
        (f"GPUPROV_API_URL=http://cp:8080\nGPUPROV_JOIN_TOKEN={TOKEN}\nGPUPROV_VM=j-a1-n0\n",
         "http://cp:8080", "j-a1-n0"),
        (f"export GPUPROV_JOIN_TOKEN='{TOKEN}'\n", None, None),
    ],
)  # fmt: skip
def test_token_file_holds_a_bare_token_or_an_env_file(tmp_path, caplog, text, url, vm):
    path = token_file(tmp_path, text)
    secret = read_join_secret(token_file=str(path))
    assert (secret.token, secret.api_url, secret.vm) == (TOKEN, url, vm)
    assert path.exists() and "open to other users" not in caplog.text


def test_token_file_open_to_others_is_warned_about_and_can_be_deleted(tmp_path, caplog):
    path = token_file(tmp_path, TOKEN, mode=0o644)
    assert read_token(str(path), delete_file=True) == TOKEN
    assert "token file" in caplog.text and "(mode 644): chmod 600 it" in caplog.text
    assert not path.exists()
    assert TOKEN not in caplog.text


def test_token_from_a_descriptor(tmp_path):
    read_end, write_end = os.pipe()
    os.write(write_end, f"{TOKEN}\nsecond line\n".encode())  # the writer keeps it open
    assert read_token(token_fd=read_end) == TOKEN
    with pytest.raises(OSError):  # closed once read
        os.fstat(read_end)
    os.close(write_end)


def test_a_descriptor_that_never_delivers_times_out():
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(AgentError, match="no join token on descriptor .* within 0.2s"):
            read_join_secret(token_fd=read_end, wait=0.2)
    finally:
        os.close(write_end)


def test_no_child_inherits_an_environment_token(fake_smi, monkeypatch, tmp_path):
    dump = tmp_path / "smi-saw"
    fake_smi(smi_script("query-l4.txt", dump=dump))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # e.g. `probe`, which never reads it
    assert check_gpu_runtime().ok
    assert "PATH=" in dump.read_text() and TOKEN not in dump.read_text()


def test_the_environment_token_is_warned_about_and_removed(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert read_token() == TOKEN
    assert TOKEN_ENV not in os.environ  # nothing started from here inherits it
    assert "`ps e`" in caplog.text and TOKEN not in caplog.text
    # A token file wins, and the environment is scrubbed all the same.
    monkeypatch.setenv(TOKEN_ENV, "env-" + TOKEN)
    assert read_token(str(token_file(tmp_path, TOKEN))) == TOKEN
    assert TOKEN_ENV not in os.environ


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("", "no join token", id="empty"),
        pytest.param("short\n", "does not look like one [(]5 characters", id="short"),
        pytest.param(f"{TOKEN} {TOKEN}\n", "like one [(]73 characters", id="two-words"),
        pytest.param("x" * 300, "does not look like one [(]300 characters", id="long"),
        pytest.param(f"{TOKEN}\x07\n", "does not look like one", id="control-character"),
    ],
)
def test_a_malformed_token_is_refused_without_quoting_it(tmp_path, text, error):
    with pytest.raises(AgentError, match=error) as refused:
        read_token(str(token_file(tmp_path, text)))
    assert TOKEN not in str(refused.value) and "short" not in str(refused.value)


# ---------------------------------------------------------------- the command, as a process


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return env | extra


def secrets_in(dump: Path) -> str:
    return dump.read_text() if dump.exists() else ""


@pytest.mark.parametrize("source", ["stdin", "fd", "file", "env"])
def test_agent_command_registers_with_the_token_off_the_command_line(
    fake_api, fake_smi, tmp_path, source
):
    dump = tmp_path / "smi-saw"
    fake_smi(smi_script("query-h100-80gb-hbm3-x8.txt", dump=dump))
    # One retry (a second's pause) is enough to see that a retry's log holds no token either.
    retry = [(503, {"detail": f"retry {TOKEN}"})] if source == "stdin" else []
    fake_api.responses = [*retry, (200, ACCEPTED)]
    env = agent_env()
    argv = [sys.executable, str(agent_pyz()), "register", "--libcuda", "none"]
    argv += ["--state-dir", str(tmp_path / "state")]
    stdin, pass_fds = "", ()
    if source == "env":
        env[TOKEN_ENV] = TOKEN
        argv += ["--url", fake_api.url]
    elif source == "file":  # cloud-init's env file: it names the API too, and goes once read
        path = token_file(tmp_path, f"GPUPROV_API_URL={fake_api.url}\nGPUPROV_JOIN_TOKEN={TOKEN}\n")
        argv += ["--token-file", str(path), "--delete-token-file"]
    elif source == "fd":
        read_end, write_end = os.pipe()
        os.write(write_end, f"{TOKEN}\n".encode())
        os.close(write_end)
        argv += ["--url", fake_api.url, "--token-fd", str(read_end)]
        pass_fds = (read_end,)
    else:
        argv += ["--url", fake_api.url]
        stdin = TOKEN + "\n"
    result = subprocess.run(
        argv, env=env, input=stdin, capture_output=True, text=True, timeout=60, pass_fds=pass_fds
    )
    if pass_fds:
        os.close(pass_fds[0])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ACCEPTED
    assert [request["body"]["token"] for request in fake_api.requests] == [TOKEN] * (1 + len(retry))
    assert len(fake_api.requests[-1]["body"]["capabilities"]["gpus"]) == 8
    assert ("retrying" in result.stderr) is bool(retry) and "GPU runtime: ok" in result.stderr
    assert TOKEN not in result.stdout + result.stderr
    assert TOKEN not in " ".join(argv)
    assert "argv:" in secrets_in(dump) and TOKEN not in secrets_in(dump)  # nvidia-smi's view
    assert ("`ps e`" in result.stderr) is (source == "env")
    if source == "file":
        assert not path.exists()


def test_agent_command_refuses_a_token_on_its_command_line(fake_api, fake_smi):
    fake_smi(H100X8)
    result = subprocess.run(
        [sys.executable, str(agent_pyz()), "register", "--url", fake_api.url, "--token", TOKEN],
        env=agent_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--token is not accepted" in result.stderr and "Mint a new token" in result.stderr
    assert TOKEN not in result.stderr + result.stdout
    assert fake_api.requests == []


def test_agent_command_needs_an_api_url(tmp_path):
    path = token_file(tmp_path, TOKEN)
    result = subprocess.run(
        [sys.executable, str(agent_pyz()), "register", "--token-file", str(path)],
        env=agent_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "no API URL: pass --url (or GPUPROV_API_URL= in the token file)" in result.stderr


def test_agent_command_without_a_token_fails_before_contacting_anyone(fake_api):
    result = subprocess.run(
        [sys.executable, "-m", "gpuprov.node", "register", "--url", fake_api.url],
        cwd=REPO,
        env=agent_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "no join token" in result.stderr
    assert fake_api.requests == []


# ---------------------------------------------------------------- against the real API app


class RegisterGate:
    """ASGI wrapper holding each register request until the test lets it through."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") == "/v1/workers/register":
            self.arrived.set()
            await self.release.wait()
        await self.app(scope, receive, send)


@dataclass
class LiveApi:
    url: str
    records: Records
    gate: RegisterGate


@pytest.fixture
async def live_api(records: Records) -> AsyncIterator[LiveApi]:
    gate = RegisterGate(create_app(records))
    port = free_port()
    async with serving(gate, "127.0.0.1", port):
        yield LiveApi(f"http://127.0.0.1:{port}", records, gate)


@pytest.mark.parametrize(
    ("query", "code", "ok"),
    [("query-h100-80gb-hbm3-x8.txt", 0, True), ("driver-mismatch.txt", 18, False)],
)
async def test_registration_round_trip_through_the_real_api(live_api, fake_smi, query, code, ok):
    fake_smi(smi_script(query, query_exit=code))
    token = vm_token(live_api.records)
    live_api.gate.release.set()
    capabilities = await asyncio.to_thread(probe)
    response = await asyncio.to_thread(register, live_api.url, token, capabilities, tries=1)
    assert (response["origin"], response["job"], response["vm"]) == (
        "managed",
        "job1",
        "job1-a1-n0",
    )
    [registration] = live_api.records.workers_of_vms(["job1-a1-n0"]).values()
    assert (registration.job, registration.id) == ("job1", response["worker_id"])
    reported = WorkerCapabilities.model_validate(capabilities)
    [row] = worker_rows(live_api.records)
    assert row["id"] == response["worker_id"]
    stored = row["capabilities"]
    stored = WorkerCapabilities.model_validate(
        json.loads(stored) if isinstance(stored, str) else stored
    )
    assert stored == reported and stored.gpu_runtime_ok is ok
    reasons = compatibility_reasons(stored.shape(), ResourceRequest(gpu="H100", gpus_per_node=8))
    assert (reasons == []) is ok


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # not about the database
async def test_agent_process_never_shows_the_token(live_api, fake_smi, tmp_path):
    """The agent as bootstrap starts it: the file alone in a private directory, the token on
    stdin. While its request is held at the API, neither its command line nor its environment
    holds the token; the credential it gets back lands beside it, readable only by its user,
    and nowhere else."""
    dump = tmp_path / "smi-saw"
    fake_smi(smi_script("query-h100-80gb-hbm3-x8.txt", dump=dump))
    token = vm_token(live_api.records)
    node_dir = tmp_path / "node"
    node_dir.mkdir(mode=0o700)
    installed = install_agent(node_dir)
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(installed), "register", "--url", live_api.url, "--libcuda", "none",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=agent_env(),
    )  # fmt: skip
    try:
        assert process.stdin is not None
        process.stdin.write(f"{token}\n".encode())
        await process.stdin.drain()
        process.stdin.close()
        await asyncio.wait_for(live_api.gate.arrived.wait(), 30)
        proc = Path("/proc") / str(process.pid)
        cmdline, environ = (proc / "cmdline").read_bytes(), (proc / "environ").read_bytes()
        assert b"register" in cmdline and b"PATH=" in environ  # we read the right process
        assert token.encode() not in cmdline and token.encode() not in environ
    finally:
        live_api.gate.release.set()
        out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    shown = json.loads(out)
    assert shown["vm"] == "job1-a1-n0" and "credential" not in shown
    assert token not in out.decode() + err.decode()
    assert "argv:" in secrets_in(dump) and token not in secrets_in(dump)

    kept = node_dir / CREDENTIAL_FILE
    assert shown["credential_file"] == str(kept)
    assert kept.stat().st_mode & 0o777 == 0o600
    credential = kept.read_text().strip()
    assert credential not in out.decode() + err.decode() + secrets_in(dump)
    worker = Credentials(live_api.records.db).worker(credential)
    assert worker is not None and worker.id == shown["worker_id"]
    kept_files = sorted(path.name for path in node_dir.iterdir())
    assert kept_files == [AGENT_FILE, CREDENTIAL_FILE, NODE_FILE]
    assert credential not in (node_dir / NODE_FILE).read_text()

"""The node agent: nvidia-smi probing against fake nvidia-smi executables, registration against
a real local HTTP server, stdlib-only and self-contained, and the token never shown."""

from __future__ import annotations

import ast
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuprov import agent
from gpuprov.agent import AgentError, parse_gpus, probe, register
from gpuprov.dev import free_port
from gpuprov.models import WorkerCapabilities

REPO = Path(__file__).resolve().parents[2]
AGENT_FILE = REPO / "gpuprov" / "agent.py"
TOKEN = "tok-Zq8vJ3nX0aB4cD5eF6gH7iJ8kL9mN0pQ"  # long enough for the API's min_length

# Captured shapes of real nvidia-smi output (driver 550, CUDA 12.4).
H100_ROWS = "".join(
    f"NVIDIA H100 80GB HBM3, 81559, 550.54.15, GPU-5f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5{index}\n"
    for index in range(8)
)
BANNER = """\
Tue Jun  4 10:15:01 2024
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""
MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.90"
)


def smi_script(rows: str, banner: str = BANNER, version: str = "") -> str:
    """A POSIX-sh nvidia-smi that answers the agent's exact query, the banner and --version."""
    return f"""\
if [ "$1" = "--query-gpu=name,memory.total,driver_version,uuid" ] \\
   && [ "$2" = "--format=csv,noheader,nounits" ]; then
cat <<'ROWS'
{rows}ROWS
elif [ "$#" -eq 0 ]; then
cat <<'BANNER'
{banner}BANNER
elif [ "$1" = "--version" ] && [ -n '{version}' ]; then
echo '{version}'
else
echo "nvidia-smi: unexpected arguments: $*" >&2; exit 2
fi
"""


H100X8 = smi_script(H100_ROWS)


def install_nvidia_smi(bin_dir: Path, script: str) -> Path:
    """Write `script` as an executable nvidia-smi in bin_dir; return bin_dir."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    executable = bin_dir / "nvidia-smi"
    executable.write_text("#!/bin/sh\n" + script)
    executable.chmod(0o755)
    return bin_dir


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


# ---------------------------------------------------------------- probe


def test_probe_reports_eight_healthy_h100s(fake_smi):
    fake_smi(H100X8)
    capabilities = probe()
    model = valid(capabilities)
    assert model.gpu_runtime_ok is True and model.gpu_runtime_error is None
    assert [gpu.name for gpu in model.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert {gpu.memory_mb for gpu in model.gpus} == {81559}
    assert model.gpus[3].uuid == "GPU-5f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a53"
    assert model.driver_version == "550.54.15" and model.cuda_version == "12.4"
    assert model.cpu_count == os.cpu_count() and model.cpu_count >= 1
    assert model.memory_gb and model.memory_gb > 0
    assert model.disk_gb and model.disk_gb > 0
    shape = model.shape()
    assert (shape.gpu_name, shape.gpu_count, shape.gpu_runtime_ok) == (
        "NVIDIA H100 80GB HBM3",
        8,
        True,
    )


def test_probe_reads_cuda_version_from_version_flag_on_new_drivers(fake_smi):
    banner = "| NVIDIA-SMI 570.86.15        Driver Version: 570.86.15      |\n"
    version = "CUDA Version                              : 12.8"
    fake_smi(smi_script(H100_ROWS, banner=banner, version=version))
    assert probe()["cuda_version"] == "12.8"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        pytest.param(
            f"cat <<'OUT'\n{MISMATCH}\nOUT\nexit 18\n",
            "nvidia-smi exited 18: Failed to initialize NVML: Driver/library version mismatch",
            id="driver-library-mismatch",
        ),
        pytest.param("exit 0\n", "no GPU visible", id="zero-gpus"),
        pytest.param(
            "echo 'No devices were found'\nexit 6\n",
            "nvidia-smi exited 6: No devices were found",
            id="no-devices-found",
        ),
        pytest.param(
            "echo '<html>Segmentation fault'\n",
            "unparsable nvidia-smi output: '<html>Segmentation fault'",
            id="garbage",
        ),
        pytest.param(
            f"cat <<'OUT'\n{H100_ROWS}OUT\necho 'NVIDIA H100 80GB HBM3, 81559'\n",
            "unparsable nvidia-smi output: 'NVIDIA H100 80GB HBM3, 81559'",
            id="truncated-row",
        ),
        pytest.param(
            "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n",
            "nvidia-smi exited 9: NVIDIA-SMI has failed",
            id="message-on-stderr",
        ),
        pytest.param("exit 3\n", "nvidia-smi exited 3: (no output)", id="silent-failure"),
    ],
)
def test_probe_reports_a_broken_gpu_runtime_with_its_reason(fake_smi, script, expected):
    fake_smi(script)
    capabilities = probe()
    model = valid(capabilities)
    assert model.gpu_runtime_ok is False
    assert model.gpu_runtime_error == expected
    assert model.gpus == []  # no GPU is claimed that could not be read
    assert model.cpu_count and model.memory_gb and model.disk_gb  # the rest is still reported


def test_probe_without_nvidia_smi_says_not_found(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    model = valid(probe())
    assert (model.gpu_runtime_ok, model.gpu_runtime_error) == (False, "nvidia-smi not found")
    assert model.gpus == [] and model.cpu_count


def test_probe_with_unexecutable_nvidia_smi_says_why(tmp_path, monkeypatch):
    bin_dir = install_nvidia_smi(tmp_path / "bin", "exit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o644)  # no x bit: even root cannot execute it
    monkeypatch.setenv("PATH", str(bin_dir))
    model = valid(probe())
    assert (model.gpu_runtime_ok, model.gpu_runtime_error) == (
        False,
        "nvidia-smi cannot run: Permission denied",
    )


def test_probe_gives_up_on_a_hung_nvidia_smi_and_kills_it(fake_smi, tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "SMI_TIMEOUT", 0.5)
    pid_file = tmp_path / "smi.pid"
    fake_smi(f"echo $$ > {pid_file}\nexec sleep 60\n")
    started = time.monotonic()
    model = valid(probe())
    assert time.monotonic() - started < 5
    assert (model.gpu_runtime_ok, model.gpu_runtime_error) == (
        False,
        "nvidia-smi timed out after 0.5s",
    )
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left hanging
        os.kill(pid, 0)


@pytest.mark.parametrize(
    ("row", "name", "memory_mb", "driver", "uuid"),
    [
        (
            "NVIDIA H100 80GB HBM3, 81559, 550.54.15, GPU-0c1d2e3f-1111-2222-3333-444455556666",
            "NVIDIA H100 80GB HBM3",
            81559,
            "550.54.15",
            "GPU-0c1d2e3f-1111-2222-3333-444455556666",
        ),
        (
            "NVIDIA A100-SXM4-40GB, 40960, 535.129.03, GPU-9a8b7c6d-aaaa-bbbb-cccc-ddddeeeeffff",
            "NVIDIA A100-SXM4-40GB",
            40960,
            "535.129.03",
            "GPU-9a8b7c6d-aaaa-bbbb-cccc-ddddeeeeffff",
        ),
        ("NVIDIA L4, 23034, 535.161.07, GPU-1234", "NVIDIA L4", 23034, "535.161.07", "GPU-1234"),
        # Padded fields, [N/A] where a value is unsupported, units left in by an old driver.
        ("  NVIDIA L4 ,  [N/A] , 535.161.07 ,[N/A]  ", "NVIDIA L4", None, "535.161.07", None),
        ("Tesla T4, 15360 MiB, 470.82.01, [Not Supported]", "Tesla T4", 15360, "470.82.01", None),
    ],
)
def test_parse_gpus_reads_realistic_rows(row, name, memory_mb, driver, uuid):
    gpus = parse_gpus(f"{row}\n\n")
    assert gpus == [{"name": name, "memory_mb": memory_mb, "driver_version": driver, "uuid": uuid}]


# ---------------------------------------------------------------- self-contained, stdlib only


def test_agent_imports_only_the_standard_library():
    tree = ast.parse(AGENT_FILE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import: the agent must run as one file"
            imported.add((node.module or "").split(".")[0])
    assert imported, "no imports found: is the AST walk broken?"
    assert sorted(imported - set(sys.stdlib_module_names)) == []


def test_agent_runs_as_one_file_without_site_packages(fake_smi, tmp_path):
    # A copy alone in a directory, `-I -S`: no gpuprov, no site-packages, as on a bare image.
    lone = tmp_path / "lone" / "agent.py"
    lone.parent.mkdir()
    shutil.copy(AGENT_FILE, lone)
    fake_smi(H100X8)
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(lone), "probe"],
        cwd=lone.parent,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert len(valid(json.loads(result.stdout)).gpus) == 8


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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
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


@pytest.mark.parametrize("source", ["env", "file", "stdin"])
def test_agent_command_registers_with_the_token_off_the_command_line(
    fake_api, fake_smi, tmp_path, source
):
    fake_smi(H100X8)
    fake_api.responses = [(503, {"detail": f"retry {TOKEN}"}), (200, ACCEPTED)]
    env = {k: v for k, v in os.environ.items() if k != agent.TOKEN_ENV}
    argv = [sys.executable, "-m", "gpuprov.agent", "register", "--url", fake_api.url]
    stdin = ""
    if source == "env":
        env[agent.TOKEN_ENV] = TOKEN
    elif source == "file":
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        argv += ["--token-file", str(token_file)]
    else:
        stdin = TOKEN + "\n"
    result = subprocess.run(
        argv, cwd=REPO, env=env, input=stdin, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ACCEPTED
    assert [request["body"]["token"] for request in fake_api.requests] == [TOKEN, TOKEN]
    assert len(fake_api.requests[-1]["body"]["capabilities"]["gpus"]) == 8
    assert "retrying" in result.stderr
    assert TOKEN not in result.stdout + result.stderr
    assert TOKEN not in " ".join(argv)


def test_agent_command_without_a_token_fails_before_contacting_anyone(fake_api):
    env = {k: v for k, v in os.environ.items() if k != agent.TOKEN_ENV}
    result = subprocess.run(
        [sys.executable, "-m", "gpuprov.agent", "register", "--url", fake_api.url],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "no join token" in result.stderr
    assert fake_api.requests == []

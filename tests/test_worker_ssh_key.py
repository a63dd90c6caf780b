"""`python worker.py` and the deployment's SSH client key, against the session's Temporal dev
server and one database file shared by every worker process (each with its own data dir, as on
separate hosts): the first worker without a configured key generates one and says that it serves
one worker only; a second such worker refuses to start with one line naming the setting; a
worker given the key in its environment starts and never logs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest

from gpuprov.engine.worker import open_records
from gpuprov.store.ssh_records import SshRecords

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[1]
STARTED = "worker on "


def write_config(tmp_path: Path, name: str, client, task_queue: str) -> Path:
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f"""
[temporal]
address = "{client.service_client.config.target_host}"
task_queue = "{task_queue}"
data_dir = "{tmp_path / name}"

[database]
url = "sqlite:///{tmp_path / "gpuprov.db"}"

[providers.fake]
ssh_bootstrap = true
"""
    )
    return config


def start(config: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROV_")}
    return subprocess.Popen(
        [sys.executable, str(REPO / "worker.py"), "--config", str(config)],
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=environment | env,
    )


def wait_for_start(worker: subprocess.Popen[bytes], log: Path) -> str:
    """The start-up line, once the worker has logged it (it polls from then on)."""
    for _ in range(1200):
        lines = [line for line in log.read_text().splitlines() if STARTED in line]
        if lines:
            return lines[0]
        assert worker.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"the worker never said it started:\n{log.read_text()}")


def stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)


def test_a_second_worker_with_a_key_of_its_own_refuses_to_start_in_one_line(
    client, task_queue: str, tmp_path: Path
) -> None:
    first_log = tmp_path / "first.log"
    first = start(write_config(tmp_path, "first", client, task_queue), first_log)
    try:
        line = wait_for_start(first, first_log)
    finally:
        stop(first)
    assert "SSH client key SHA256:" in line and "one worker only" in line
    assert "ssh.client_key_file, ssh.client_key or GPUPROV_SSH__CLIENT_KEY" in line

    second_log = tmp_path / "second.log"
    second = start(write_config(tmp_path, "second", client, task_queue), second_log)
    assert second.wait(120) == 2
    output = second_log.read_text().strip().splitlines()
    errors = [line for line in output if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == output[-1], output
    assert errors[0].removeprefix("error: ").startswith("ssh.client_key is not set")
    assert not [line for line in output if STARTED in line]


def test_a_worker_given_the_key_in_its_environment_starts_and_never_logs_it(
    client, task_queue: str, tmp_path: Path
) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    pem = key.export_private_key().decode()
    log = tmp_path / "worker.log"
    worker = start(
        write_config(tmp_path, "worker", client, task_queue), log, GPUPROV_SSH__CLIENT_KEY=pem
    )
    try:
        line = wait_for_start(worker, log)
    finally:
        stop(worker)
    fingerprint = key.get_fingerprint("sha256")
    assert line.endswith(f"SSH client key {fingerprint} from ssh.client_key")
    text = log.read_text()
    assert not [chunk for chunk in pem.splitlines()[1:-1] if chunk in text]
    assert not (tmp_path / "worker" / "ssh" / "client_ed25519").exists()
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    [row] = SshRecords(records.db).client_keys()
    records.db.dispose()
    assert (row.fingerprint, row.source) == (fingerprint, "configured")

"""SSH keys in the database, on SQLite and on PostgreSQL 15 (conftest): host-key pins that the
first writer owns, and the deployment's client keys that keep a second generated key out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import asyncssh
import pytest

from gpuprov.store.db import Database
from gpuprov.store.ssh_records import ClientKeySource, SshRecords
from tests.gpuprov.test_records import race, snapshot

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[2]
VM = "train-a1-n0-abc123"


def public_line() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


# ---------------------------------------------------------------------------- host keys


def test_the_first_pin_of_a_vm_stands_and_a_second_gets_it_back(database: Database):
    ssh = SshRecords(database)
    first, second = public_line(), public_line()

    assert ssh.host_key(VM) is None
    assert ssh.pin_host_key(VM, first) == first
    assert ssh.pin_host_key(VM, second) == first
    assert ssh.pin_host_key(VM, first) == first
    assert ssh.host_key(VM) == first
    assert ssh.host_key("other-a1-n0-abc123") is None
    assert len(snapshot(database)["ssh_host_keys"]) == 1


def test_workers_pinning_one_vm_at_once_all_get_the_first_writers_key(database_url: str):
    """Eight workers (each its own engine and connections) pin different keys for one VM at the
    same moment: exactly one key is recorded and every worker is told that one."""
    databases = [Database(database_url) for _ in range(8)]
    databases[0].upgrade()
    keys = [public_line() for _ in databases]
    try:
        answers = race(8, lambda i: SshRecords(databases[i]).pin_host_key(VM, keys[i]))
    finally:
        for database in databases:
            database.dispose()
    assert not [answer for answer in answers if isinstance(answer, BaseException)], answers
    [recorded] = set(answers)
    assert recorded in keys
    check = Database(database_url)
    assert SshRecords(check).host_key(VM) == recorded
    check.dispose()


PIN_IN_A_PROCESS = textwrap.dedent(
    """
    import sys
    from gpuprov.store.db import Database
    from gpuprov.store.ssh_records import ClientKeySource, SshRecords

    url, vm, key = sys.argv[1], sys.argv[2], sys.argv[3]
    database = Database(url)
    print("ready", flush=True)
    sys.stdin.readline()  # the go signal, sent once every process is ready
    print(SshRecords(database).pin_host_key(vm, key), flush=True)
    database.dispose()
    """
)


def test_two_worker_processes_pinning_one_vm_agree_on_the_first(
    database: Database, database_url: str
):
    keys = [public_line(), public_line()]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PIN_IN_A_PROCESS, database_url, VM, key],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for key in keys
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    answers = [process.communicate(timeout=60)[0].strip() for process in processes]

    assert [process.returncode for process in processes] == [0, 0]
    assert answers[0] == answers[1] and answers[0] in keys
    assert SshRecords(database).host_key(VM) == answers[0]


# ---------------------------------------------------------------------------- client keys


def register(ssh: SshRecords, fingerprint: str, source: ClientKeySource, host: str = "host-a"):
    line = f"ssh-ed25519 AAAA{fingerprint}"
    return ssh.register_client_key(fingerprint, line, source=source, host=host)


def test_a_generated_key_is_accepted_alone_and_again_on_restart(database: Database):
    ssh = SshRecords(database)
    assert register(ssh, "SHA256:a", "generated") is None
    assert register(ssh, "SHA256:a", "generated") is None  # the same worker, restarted
    [row] = ssh.client_keys()
    assert (row.fingerprint, row.source, row.host) == ("SHA256:a", "generated", "host-a")


def test_a_second_generated_key_is_refused_naming_the_first_and_leaves_no_row(
    database: Database,
):
    ssh = SshRecords(database)
    register(ssh, "SHA256:a", "generated", host="host-a")

    other = register(ssh, "SHA256:b", "generated", host="host-b")

    assert other is not None and (other.fingerprint, other.host) == ("SHA256:a", "host-a")
    assert [row.fingerprint for row in ssh.client_keys()] == ["SHA256:a"]
    assert register(ssh, "SHA256:a", "generated") is None, "the first one still starts"


def test_a_configured_key_is_always_accepted_and_then_refuses_generated_ones(
    database: Database,
):
    ssh = SshRecords(database)
    register(ssh, "SHA256:old", "generated")
    assert register(ssh, "SHA256:deploy", "configured") is None
    assert register(ssh, "SHA256:deploy", "configured", host="host-b") is None

    refused = register(ssh, "SHA256:new", "generated", host="host-c")
    assert refused is not None and refused.fingerprint == "SHA256:old"
    again = register(ssh, "SHA256:old", "generated")  # the old single worker, restarted
    assert again is not None and again.fingerprint == "SHA256:deploy"
    assert [row.fingerprint for row in ssh.client_keys()] == ["SHA256:old", "SHA256:deploy"]


def test_of_workers_registering_generated_keys_at_once_at_most_one_starts(database_url: str):
    databases = [Database(database_url) for _ in range(6)]
    databases[0].upgrade()
    try:
        answers = race(6, lambda i: register(SshRecords(databases[i]), f"SHA256:{i}", "generated"))
    finally:
        for database in databases:
            database.dispose()
    assert not [answer for answer in answers if isinstance(answer, BaseException)], answers
    accepted = [i for i, answer in enumerate(answers) if answer is None]
    assert len(accepted) <= 1
    check = Database(database_url)
    rows = SshRecords(check).client_keys()
    check.dispose()
    assert [row.fingerprint for row in rows] == [f"SHA256:{i}" for i in accepted]

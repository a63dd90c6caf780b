"""providers/ssh_common.py: what the core's bootstrap and the ssh provider share about SSH."""

from __future__ import annotations

import errno
import inspect

import asyncssh
import pytest

from activities import bootstrap, ssh_connect
from providers.ssh import remote
from providers.ssh_common import (
    AGENT_FILE,
    REMOTE_ROOT,
    describe_error,
    fingerprint,
    host_key_algorithms,
    isolated_options,
    public_line,
    remote_dir,
)

ED25519 = asyncssh.generate_private_key("ssh-ed25519")


def test_without_a_known_key_ed25519_is_asked_for_first_and_rsa_never_with_sha1():
    algs = host_key_algorithms(None)
    assert algs[0] == "ssh-ed25519" and "ssh-rsa" not in algs
    algs.append("changed")  # a caller's list is its own
    assert host_key_algorithms(None)[-1] == "rsa-sha2-256"


def test_a_known_key_asks_for_its_own_type_only():
    assert host_key_algorithms(ED25519) == ["ssh-ed25519"]
    trust = ssh_connect.HostKeyTrust(keys=[ED25519.convert_to_public()])
    assert trust.host_key_algorithms() == ["ssh-ed25519"]
    assert ssh_connect.HostKeyTrust().host_key_algorithms() == host_key_algorithms(None)


def test_isolated_options_keep_the_workers_ssh_setup_out_and_are_valid_asyncssh_options():
    options = isolated_options()
    assert options["config"] is None and options["agent_path"] is None
    assert options["password"] is None and options["kbdint_auth"] is False
    assert options["preferred_auth"] == "publickey"
    accepted = inspect.signature(asyncssh.SSHClientConnectionOptions.prepare).parameters
    assert set(options) <= set(accepted)
    options["password"] = "x"  # a caller's dict is its own
    assert isolated_options()["password"] is None


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (TimeoutError(), "timed out"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed"), "connection refused"),
        (asyncssh.DisconnectError(11, "too many sessions"), "disconnected: too many sessions"),
        (OSError("no errno"), "OSError: no errno"),
        (ValueError("x" * 1000), "ValueError: " + "x" * 288),
    ],
)
def test_a_failed_connection_is_described_in_a_few_words(error, words):
    assert describe_error(error) == words


def test_keys_print_as_openssh_does():
    public = ED25519.convert_to_public()
    assert fingerprint(ED25519) == fingerprint(public)
    assert fingerprint(public).startswith("SHA256:")
    assert public_line(ED25519).startswith("ssh-ed25519 AAAA")
    assert asyncssh.import_public_key(public_line(ED25519)).public_data == public.public_data


def test_bootstrap_installs_the_agent_where_the_ssh_providers_cleanup_looks():
    assert remote_dir("vm-1") == f'"$HOME"/{REMOTE_ROOT}/vm-1'
    assert remote_dir("odd'vm") == "\"$HOME\"/.gpuprov/'odd'\"'\"'vm'"
    assert bootstrap.install_command("vm-1").endswith(f" {remote_dir('vm-1')}/{AGENT_FILE}")
    cleanup = remote.cleanup_command("vm-1")
    assert f"rm -rf -- {remote_dir('vm-1')} " in cleanup
    assert "'[.]gpuprov/vm-1/agent[.]pyz'" in cleanup

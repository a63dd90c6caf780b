"""The worker credential and the node record in the state directory: where it is (`--state-dir`,
else beside agent.pyz, else ~/.gpuprov/worker), made 0700 and proved writable before a token
is spent; `worker-credential` (0600, the secret) and `worker.json` (the API's URL, the worker
id, the registered GPUs' UUIDs: no secret).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

from .errors import AgentError
from .location import home
from .workdir import write_json

log = logging.getLogger(__name__)

CREDENTIAL_FILE = "worker-credential"
NODE_FILE = "worker.json"  # api_url, worker_id, the registered GPUs' UUIDs: no secret
PACKAGE_STATE_DIR = "~/.gpuprov/worker"


def default_state_dir() -> str:
    """Where the credential lives unless --state-dir says otherwise: beside agent.pyz (bootstrap's
    private per-VM directory), else ~/.gpuprov/worker (run from the gpuprov package:
    `python -m gpuprov.node`, a source checkout)."""
    return home() or os.path.expanduser(PACKAGE_STATE_DIR)


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
        write_json(path, {"api_url": api_url, "worker_id": worker_id, "gpus": gpus})
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

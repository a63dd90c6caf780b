"""cloud-init's own reading of user data, for tests: the installed cloud-init (the `cloud-init`
command and the system python3's `cloudinit` package), never a re-implementation of it.

- `processed(user_data)`: what cloud-init makes of user data on a machine: gzip undone, the
  MIME archive split into parts (each typed as cloud-init types it), every cloud-config part
  merged onto the ones before it by cloud-init's own mergers (each part's `merge_how`).
- `schema_errors(config)`: `cloud-init schema -c` on a cloud-config; "" when valid.
- `write_files(config, root)`: cloud-init's write_files module writing each file of the
  config under `root` (decoding, permissions), as it would at `/` on the machine.

`make test` installs cloud-init where it is missing (the Makefile's cloud-init rule); without
it these fail with that message, never skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CLOUD_INIT = "/usr/bin/cloud-init"
SYSTEM_PYTHON = "/usr/bin/python3"  # the interpreter cloud-init is installed for
TIMEOUT = 60

_PROCESS = r"""
import json, sys
from cloudinit import handlers, helpers
from cloudinit.handlers.cloud_config import CloudConfigPartHandler
from cloudinit.user_data import UserDataProcessor

class Paths(helpers.Paths):
    def get_ipath(self, name=None):
        return None  # nothing written: the merged config is printed instead

paths = Paths({"cloud_dir": sys.argv[2], "run_dir": sys.argv[2]})
with open(sys.argv[1], "rb") as handle:
    message = UserDataProcessor(paths).process(handle.read())
merger = CloudConfigPartHandler(paths)
merger.handle_part(None, handlers.CONTENT_START, None, None, None, None)
parts = []
for part in message.walk():
    if part.get_content_maintype() == "multipart":
        continue
    payload = part.get_payload(decode=True).decode("utf-8")
    ctype = part.get_content_type()
    parts.append({"type": ctype, "payload": payload})
    if ctype == "text/cloud-config":
        merger.handle_part(None, ctype, part.get_filename() or "", payload, None, dict(part))
print(json.dumps({"parts": parts, "config": merger.cloud_buf}))
"""

_WRITE_FILES = r"""
import json, sys
from cloudinit.config import cc_write_files
files = json.loads(sys.stdin.read())
cc_write_files.write_files("write_files", files, "root:root")
"""


@dataclass
class Processed:
    parts: list[dict[str, str]]  # {"type": "text/cloud-config", "payload": "..."} in order
    config: dict[str, Any]  # every cloud-config part, merged

    def part_types(self) -> list[str]:
        return [part["type"] for part in self.parts]


def require_cloud_init() -> None:
    if shutil.which(CLOUD_INIT) is None or shutil.which(SYSTEM_PYTHON) is None:
        pytest.fail(
            f"{CLOUD_INIT} is not installed: `make test` installs it (apt-get install cloud-init)",
            pytrace=False,
        )


def processed(user_data: str | bytes) -> Processed:
    """What cloud-init reads out of `user_data` (text or bytes, gzip-compressed or not)."""
    require_cloud_init()
    raw = user_data.encode() if isinstance(user_data, str) else user_data
    with tempfile.TemporaryDirectory(prefix="gpuprov-cloud-init-") as scratch:
        source = Path(scratch) / "user-data"
        source.write_bytes(raw)
        done = _system_python(["-c", _PROCESS, str(source), scratch])
    result = json.loads(done.stdout)
    return Processed(parts=result["parts"], config=result["config"] or {})


def schema_errors(config: dict[str, Any] | str) -> str:
    """What `cloud-init schema -c` says is wrong with a cloud-config; "" when it is valid."""
    require_cloud_init()
    text = config if isinstance(config, str) else "#cloud-config\n" + json.dumps(config)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="gpuprov-") as document:
        document.write(text)
        document.flush()
        done = subprocess.run(
            [CLOUD_INIT, "schema", "-c", document.name],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    return "" if done.returncode == 0 else (done.stderr + done.stdout).strip()


def write_files(config: dict[str, Any], root: Path) -> None:
    """cloud-init's write_files module, writing `config`'s files under `root`."""
    require_cloud_init()
    files = [
        {**entry, "path": str(root / entry["path"].lstrip("/")), "owner": None}
        for entry in config.get("write_files", [])
    ]
    _system_python(["-c", _WRITE_FILES], stdin=json.dumps(files))


def _system_python(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"cloud-init's python failed ({done.returncode}): {done.stderr}")
    return done

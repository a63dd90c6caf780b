"""The node agent as it ships: one zipapp, agent.pyz, built from the gpuprov.node package, and
the SHA-256 every delivery path pins it to.

Every path runs these bytes and checks this hash before the agent starts: cloud-init (the unit's
ExecStartPre fetches GET /v1/node/agent.pyz and checks it, providers/node_agent.py), the SSH
bootstrap (uploaded, then `sha256sum --check` on the node, activities/bootstrap.py), `gpuprov
join` (fetched from the API against this pin, gpuprov/cli/join_service.py) and the fake cloud's
nodes (providers/fake/node.py, the unit's own fetch). The archive:

    __main__.py               runs `gpuprov.node` as `python -m` would
    gpuprov/__init__.py       an empty package around it (the house's own is not shipped)
    gpuprov/node/*.py         the agent's modules, byte for byte, docstrings and all

The build is deterministic: the same sources give the same bytes on every machine, so a worker
and the API it points nodes at agree on the hash without talking to each other (and disagree,
refusing the node, when they run different agent versions). Entries are sorted, stored (no
compression: zlib builds differ in what they emit), dated 1980-01-01, mode 0644, made on
"Unix", with no compiled files and no comment. The node needs nothing but `python3`:
`python3 -I -S agent.pyz COMMAND`.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from importlib import resources

PACKAGE = "gpuprov.node"
ENTRY = b'import runpy\n\nrunpy.run_module("gpuprov.node", run_name="__main__", alter_sys=True)\n'
PARENT = b'"""gpuprov, reduced to its node agent (gpuprov.node) inside agent.pyz."""\n'
FETCH = "fetch.py"  # the pinned download, also shipped alone (cloud-init writes it)
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
FILE_MODE = 0o100644  # a regular file, rw-r--r--
UNIX = 3  # ZipInfo.create_system: the mode bits above mean what they say


def sources() -> dict[str, bytes]:
    """Every file of the archive by its name in it: the package's modules (*.py only: never a
    __pycache__ or an editor's leftover), the empty parent package and the entry point."""
    package = resources.files(PACKAGE)
    modules = {
        f"gpuprov/node/{entry.name}": entry.read_bytes()
        for entry in package.iterdir()
        if entry.name.endswith(".py") and entry.is_file()
    }
    return {"__main__.py": ENTRY, "gpuprov/__init__.py": PARENT, **modules}


def build(files: dict[str, bytes]) -> bytes:
    """`files` as a zip archive whose bytes depend on nothing but `files`."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(files):
            entry = zipfile.ZipInfo(name, date_time=EPOCH)
            entry.external_attr = FILE_MODE << 16
            entry.create_system = UNIX
            entry.compress_type = zipfile.ZIP_STORED
            archive.writestr(entry, files[name])
    return buffer.getvalue()


@functools.cache
def artifact() -> bytes:
    """agent.pyz, built once per process from the package this worker runs."""
    return build(sources())


@functools.cache
def sha256() -> str:
    """The pin: agent.pyz's SHA-256, hex."""
    return hashlib.sha256(artifact()).hexdigest()


def fetch_source() -> bytes:
    """gpuprov/node/fetch.py, the unit's fetch-and-verify step, as the node gets it."""
    return resources.files(PACKAGE).joinpath(FETCH).read_bytes()

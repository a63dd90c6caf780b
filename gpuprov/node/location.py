"""Where the agent runs from, and how it starts itself again (`supervise`).

On a node the agent is one file, agent.pyz, run as `python3 -I -S agent.pyz COMMAND`: its
modules are imported from inside the archive (zipimport), so `archive()` is that file and its
directory is the agent's own (bootstrap's private per-VM directory, the default state dir).
From a source checkout or an installed gpuprov (`python -m gpuprov.node`) there is no
archive: the agent starts itself again from the package, isolated all the same.
"""

from __future__ import annotations

import os
import sys

# `python -I -S -c BOOT ROOT COMMAND ...`: the package's parent first on sys.path (-I leaves the
# current directory and $PYTHONPATH out), then the command line as agent.pyz would run it.
BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from gpuprov.node.cli import main; sys.exit(main())"
)


def archive() -> str | None:
    """The agent.pyz this agent was imported from, or None when it runs from the package."""
    path = getattr(globals().get("__loader__"), "archive", None)  # zipimport.zipimporter's
    return os.path.abspath(path) if isinstance(path, str) else None


def home() -> str | None:
    """The directory agent.pyz lies in, or None when it runs from the package."""
    path = archive()
    return os.path.dirname(path) if path else None


def self_argv() -> list[str]:
    """The command line that runs this same agent again, under the same interpreter, `-I -S`
    (no site-packages, no PYTHON* variables): the archive, or the package it was imported
    from; a subcommand and its arguments follow."""
    python = sys.executable or "python3"
    path = archive()
    if path:
        return [python, "-I", "-S", path]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [python, "-I", "-S", "-c", BOOT, root]

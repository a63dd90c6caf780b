"""`python -m gpuprov.node COMMAND ...`: the agent's command line (agent.pyz's own __main__.py
runs this module)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

"""What the command modules share: the client a command talks to Temporal with, the help text
of `--run`, and waiting for Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable

from gpuprov.config import Settings
from gpuprov.sdk.client import GpuprovClient

# A command's handler: the settings and the parsed flags in, the exit code out.
Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]
Commands = argparse._SubParsersAction

EARLIER_RUN = "an earlier run of the name (as `gpuprov status` shows it); default: the latest"


async def client_for(settings: Settings) -> GpuprovClient:
    return await GpuprovClient.connect(codec=settings.codec, settings=settings.temporal)


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def until_signalled() -> None:
    await stop_on_signals().wait()

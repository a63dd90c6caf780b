"""`gpuprov api`: run the control-plane API (gpuprov/api/) until Ctrl-C or SIGTERM, once the
database answers."""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys

from gpuprov.api.app import create_app, serving
from gpuprov.cli.common import Commands, stop_on_signals
from gpuprov.config import Settings
from gpuprov.engine.worker import open_records_patiently
from gpuprov.sdk.connection import connect_temporal
from gpuprov.store.secrets import Vault


def open_files_for_every_node() -> None:
    """Raise this process's open-file limit to the most it may have: every node keeps a
    connection open (Linux's usual soft limit, 1024, would refuse the 1025th node)."""
    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def add_parser(commands: Commands) -> None:
    commands.add_parser("api", help="run the control-plane API until Ctrl-C").set_defaults(
        handler=_api
    )


async def _api(settings: Settings, args: argparse.Namespace) -> int:
    stop = stop_on_signals()
    records = await open_records_patiently(
        settings.database_url,
        settings.database.wait_seconds,
        lambda line: print(f"waiting for the database: {line}", file=sys.stderr),
        stop,
    )
    if records is None:
        return 130
    try:
        app = create_app(
            records,
            workers=settings.workers,
            jobs=settings.jobs,
            temporal=lambda: connect_temporal(settings.temporal, codec=settings.codec),
            vault=Vault.configured(records.db, settings.secrets),
            task_queue=settings.temporal.task_queue,
            temporal_ui_url=settings.api.temporal_ui_url,
            namespace=settings.temporal.namespace,
        )
        api = settings.api
        tls = {"tls_cert_file": api.tls_cert_file, "tls_key_file": api.tls_key_file}
        keep_alive = settings.workers.keep_alive
        open_files_for_every_node()
        async with serving(app, api.host, api.port, keep_alive_seconds=keep_alive, **tls):
            scheme = "https" if api.https else "http"
            print(f"control-plane API at {scheme}://{api.host}:{api.port}")
            print(f"nodes are told to use {settings.api.url}. Ctrl-C stops.")
            await stop.wait()
    finally:
        records.db.dispose()
    print("stopped")
    return 0

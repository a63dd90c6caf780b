"""The production worker: `python worker.py [--config gpuprov.toml]`.

Reads settings (file + environment), connects to the Temporal cluster, and runs ProvisionJob
and every cloud activity on the configured task queue until SIGINT/SIGTERM. With `[metrics] bind`
set, it serves Prometheus metrics (Temporal SDK and gpuprov_*) at http://<bind>/metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys

from temporalio.client import Client

from gpuprov.cli.arguments import Parser
from gpuprov.config import ConfigError, Settings, load_settings
from gpuprov.engine.worker import (
    connect,
    metrics_runtime,
    open_records_patiently,
    running_worker,
    start_backoff,
)
from gpuprov.store.db import DatabaseUnavailable


async def connect_patiently(settings: Settings, stop: asyncio.Event) -> Client | None:
    """Connect, retrying with backoff until it works or `stop` is set (then None)."""
    runtime = metrics_runtime(settings.metrics)
    for tries in itertools.count():
        try:
            return await connect(settings.temporal, runtime, settings.codec)
        except RuntimeError as error:  # unreachable; a refused setting raises ConfigError
            delay = start_backoff(tries)
            logging.warning(
                "cannot reach Temporal at %s (%s); retrying in %gs",
                settings.temporal.address,
                error,
                delay,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            return None
    return None


async def serve(config_path: str | None) -> None:
    settings = load_settings(config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # The database first: its wait is bounded (`[database] wait_seconds`), Temporal's is not.
    records = await open_records_patiently(
        settings.database_url, settings.database.wait_seconds, logging.warning, stop
    )
    if records is None:
        return
    client = await connect_patiently(settings, stop)
    if client is None:
        records.db.dispose()
        return
    async with running_worker(client, settings, records) as runtime:
        logging.info(
            "worker on %s/%s, providers: %s; %s",
            settings.temporal.address,
            settings.temporal.task_queue,
            ", ".join(runtime.providers) or "none",
            runtime.ssh_key,
        )
        for provider, reason in sorted(runtime.skipped.items()):
            logging.warning("provider %s skipped: %s", provider, reason)
        if settings.metrics.bind:
            logging.info("metrics on http://%s/metrics", settings.metrics.bind)
        await stop.wait()


def main() -> None:
    parser = Parser(prog="worker.py", description="gpuprov Temporal worker")
    parser.add_argument("--config", help="path to gpuprov.toml (default: $GPUPROV_CONFIG)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # botocore logs request parameters (EC2 user data carries a node's join token) at DEBUG.
    for chatty in ("botocore", "aiobotocore"):
        logging.getLogger(chatty).setLevel(max(logging.INFO, logging.getLogger().level))
    code = 0
    try:
        asyncio.run(serve(args.config))
    except (ConfigError, DatabaseUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        code = 2
    logging.shutdown()
    sys.stderr.flush()
    # Skip finalization: the Temporal client's Rust threads can crash it
    # (temporalio/sdk-python#300); the worker has already shut down cleanly.
    os._exit(code)


if __name__ == "__main__":
    main()

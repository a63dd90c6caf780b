"""The production worker: `python worker.py [--config gpuprov.toml]`.

Reads settings (file + environment), connects to the Temporal cluster, and runs ProvisionJob
and every cloud activity on the configured task queue until SIGINT/SIGTERM. With `[metrics] bind`
set, it serves Prometheus metrics (Temporal SDK and gpuprov_*) at http://<bind>/metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from gpuprov.config import load_settings
from gpuprov.engine import connect, metrics_runtime, running_worker


async def serve(config_path: str | None) -> None:
    settings = load_settings(config_path)
    client = await connect(settings.temporal, metrics_runtime(settings.metrics), settings.codec)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running_worker(client, settings) as runtime:
        logging.info(
            "worker on %s/%s, providers: %s",
            settings.temporal.address,
            settings.temporal.task_queue,
            ", ".join(runtime.providers) or "none",
        )
        for provider, reason in sorted(runtime.skipped.items()):
            logging.warning("provider %s skipped: %s", provider, reason)
        if settings.metrics.bind:
            logging.info("metrics on http://%s/metrics", settings.metrics.bind)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="gpuprov Temporal worker")
    parser.add_argument("--config", help="path to gpuprov.toml (default: $GPUPROV_CONFIG)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(serve(args.config))
    logging.shutdown()
    # Skip finalization: the Temporal client's Rust threads can crash it
    # (temporalio/sdk-python#300); the worker has already shut down cleanly.
    os._exit(0)


if __name__ == "__main__":
    main()

"""`gpuprov codec-server`: serve /encode and /decode (gpuprov/api/codec_server.py) so the Temporal
UI and CLI show encrypted payloads."""

from __future__ import annotations

import argparse

from gpuprov.api.app import serving
from gpuprov.api.codec_server import create_codec_app, endpoint_url, ui_origins
from gpuprov.cli.common import Commands, until_signalled
from gpuprov.config import ConfigError, Settings
from gpuprov.sdk.codec import codec_for


def add_parser(commands: Commands) -> None:
    commands.add_parser(
        "codec-server",
        help="serve /encode and /decode so the Temporal UI shows encrypted payloads",
        description=(
            "Run the remote codec server for the Temporal UI on [codec] host:port (default "
            "127.0.0.1:8081); start the UI with --ui-codec-endpoint pointing at it. Anyone who "
            "can reach it can decrypt payloads: keep it local or behind an authenticating proxy."
        ),
    ).set_defaults(handler=_codec_server)


async def _codec_server(settings: Settings, args: argparse.Namespace) -> int:
    codec = codec_for(settings.codec)
    if codec is None:
        raise ConfigError(
            "codec-server needs [codec] keys (GPUPROV_CODEC__KEYS); see docs/operations.md"
        )
    host, port = settings.codec.host, settings.codec.port
    origins = ui_origins(settings)
    async with serving(create_codec_app(codec, origins), host, port):
        url = endpoint_url(host, port)
        active = codec.active_key or "none, decode only"
        print(f"codec server at {url}; keys {', '.join(codec.key_ids)} (active: {active})")
        print(f"browsers allowed from {', '.join(origins)}")
        print(f"start the UI with --ui-codec-endpoint {url}. Ctrl-C stops.")
        await until_signalled()
    print("stopped")
    return 0

"""`MetadataServer`: EC2's and GCE's instance metadata services on loopback, as a node sees them.

EC2 (IMDSv2): `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` gives a
token; every GET under /latest/meta-data/ without a valid `X-aws-ec2-metadata-token` is 401.
`spot/instance-action` and `events/recommendations/rebalance` are 404 until the test sets them;
`events/maintenance/scheduled` is `[]` until set.
GCE: GET /computeMetadata/v1/instance/preempted (`FALSE`/`TRUE`) and .../maintenance-event
(`NONE`, ...) need `Metadata-Flavor: Google` (403 without), answer with an ETag, and with
`?wait_for_change=true` hang until the value changes from the `last_etag` given (or
`timeout_sec` passes).
`requests` counts every request by path, so a test can tell how a notice reached the agent.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EC2_PREFIX = "/latest/meta-data/"
GCE_PREFIX = "/computeMetadata/v1/instance/"


class MetadataServer:
    def __init__(self) -> None:
        self.ec2: dict[str, str | None] = {
            "spot/instance-action": None,
            "events/recommendations/rebalance": None,
            "events/maintenance/scheduled": "[]",
        }
        self.gce = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self.tokens: set[str] = set()
        self.requests: Counter[str] = Counter()
        self.changed = threading.Condition()
        self.closing = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> MetadataServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.changed:
            self.closing = True  # every hanging GET answers now
            self.changed.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def set_ec2(self, path: str, value: object) -> None:
        self.ec2[path] = None if value is None else json.dumps(value)

    def set_gce(self, path: str, value: str) -> None:
        with self.changed:
            self.gce[path] = value
            self.changed.notify_all()


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _handler(server: MetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def _answer(self, status: int, body: str = "", headers: dict | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            server.requests[self.path] += 1
            if self.path != "/latest/api/token":
                return self._answer(404)
            if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._answer(400)
            token = secrets.token_urlsafe(24)
            server.tokens.add(token)
            self._answer(200, token)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            server.requests[url.path] += 1
            if url.path.startswith(EC2_PREFIX):
                if self.headers.get("X-aws-ec2-metadata-token") not in server.tokens:
                    return self._answer(401)
                value = server.ec2.get(url.path[len(EC2_PREFIX) :])
                return self._answer(404) if value is None else self._answer(200, value)
            if url.path.startswith(GCE_PREFIX):
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403)
                return self._gce(url.path[len(GCE_PREFIX) :], urllib.parse.parse_qs(url.query))
            self._answer(404)

        def _gce(self, key: str, query: dict[str, list[str]]) -> None:
            if key not in server.gce:
                return self._answer(404)
            if query.get("wait_for_change") == ["true"]:
                last = (query.get("last_etag") or [""])[0]
                timeout = float((query.get("timeout_sec") or ["60"])[0])
                with server.changed:
                    server.changed.wait_for(
                        lambda: server.closing or etag(server.gce[key]) != last, timeout
                    )
            value = server.gce[key]
            self._answer(200, value, {"ETag": etag(value), "Metadata-Flavor": "Google"})

    return Handler

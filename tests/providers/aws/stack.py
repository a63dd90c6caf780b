"""A local EC2 for tests, reusable by any test module (the cross-cloud failover test too).

- `moto_server()`: moto's server mode on loopback, on a free port (start one per module: its
  first call loads moto's EC2 backend, about two seconds). `reset_moto(url)` empties it.
- `AwsFront`: a tiny threaded HTTP endpoint on loopback in front of moto. It answers the
  requests its rules match with recorded AWS bodies (stockouts, quotas, throttling, ...), the
  Price List API from a price table (moto has no pricing service), and forwards everything else
  to moto. It records every request, so tests can read what the adapter sent.
- `aws_config()` / `aws_cloud()`: an `AwsCloud` with dummy keys and a loopback endpoint: it
  never reads the environment or credential files, and never reaches AWS.
- `live_instances()` / `gpuprov_security_groups()` / `gpuprov_key_pairs()`: what is left in moto.

aiobotocore speaks aiohttp, not httpx, so respx cannot intercept it: recorded bodies are served
over real HTTP instead.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import boto3
from aiobotocore.session import AioSession
from botocore.config import Config
from moto.server import ThreadedMotoServer

from providers.aws.client import StaticCredentials
from providers.aws.cloud import AwsCloud
from providers.aws.config import AwsConfig

FIXTURES = Path(__file__).parent / "fixtures"
REGION = "us-east-1"
TEST_CREDENTIALS = StaticCredentials(access_key_id="testing", secret_access_key="testing")
# An Ubuntu AMI moto knows in every region (its amis.json).
MOTO_AMI = "ami-1e749f67"
MOTO_IMAGE_NAME = "ubuntu/images/hvm-ssd/ubuntu-trusty-14.04-amd64-server-*"
PRICING_TARGET = "AWSPriceListService.GetProducts"


def recorded(name: str, **values: str) -> bytes:
    """A recorded body from fixtures/, with `{placeholders}` filled in."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text.encode()


# ---------------------------------------------------------------- moto


@contextmanager
def moto_server() -> Iterator[str]:
    """moto on 127.0.0.1, a free port; yields its URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


# Budgets, never expectations: moto answers in milliseconds on a quiet machine, but its first
# call into a backend after a reset loads that backend (SSM's default parameters take seconds),
# and a loaded 2-core machine stretches that several times. A test that is about a timeout sets
# its own.
READ_TIMEOUT = 120.0
# boto3 clients that arrange and check moto's state.
BOTO_CONFIG = Config(read_timeout=READ_TIMEOUT)


def reset_moto(url: str) -> None:
    request = urllib.request.Request(f"{url}/moto-api/reset", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=READ_TIMEOUT):
        pass


def ec2(url: str, region: str = REGION) -> Any:
    """A plain boto3 EC2 client on moto (for arranging and checking state)."""
    return boto3.client(
        "ec2",
        region_name=region,
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BOTO_CONFIG,
    )


def live_instances(url: str, region: str = REGION) -> list[dict[str, Any]]:
    """Every gpuprov-tagged instance in moto that is not terminated."""
    pages = ec2(url, region).describe_instances(
        Filters=[
            {"Name": "tag-key", "Values": ["gpuprov-vm"]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping"]},
        ]
    )
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def gpuprov_security_groups(url: str, region: str = REGION) -> list[str]:
    groups = ec2(url, region).describe_security_groups()["SecurityGroups"]
    return [g["GroupName"] for g in groups if g["GroupName"].startswith("gpuprov-")]


def gpuprov_key_pairs(url: str, region: str = REGION) -> list[str]:
    pairs = ec2(url, region).describe_key_pairs()["KeyPairs"]
    return [p["KeyName"] for p in pairs if p["KeyName"].startswith("gpuprov-")]


# ---------------------------------------------------------------- the front endpoint


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "text/xml;charset=UTF-8"
    headers: dict[str, str] = field(default_factory=dict)


def error_reply(status: int, fixture: str, **values: str) -> Reply:
    """A recorded EC2 error body (fixtures/<fixture>) with its HTTP status."""
    return Reply(status, recorded(fixture, **values))


@dataclass
class Seen:
    """One request the front received: the EC2 Action and its query parameters, or the JSON
    target (Price List) and its body; the region comes from the signature's scope."""

    action: str
    params: dict[str, str]
    region: str
    json_body: dict[str, Any] | None = None


Responder = Callable[[Seen], Reply | None]


@dataclass
class Rule:
    action: str
    answer: Reply | Responder
    when: dict[str, str] = field(default_factory=dict)
    times: int | None = None  # None: every matching request
    region: str | None = None

    def matches(self, seen: Seen) -> bool:
        return (
            self.action == seen.action
            and (self.times is None or self.times > 0)
            and (self.region is None or self.region == seen.region)
            and all(seen.params.get(k) == v for k, v in self.when.items())
        )


class AwsFront:
    """Recorded answers first, the Price List from `prices`, then moto (if `upstream`)."""

    def __init__(
        self, upstream: str | None = None, prices: dict[tuple[str, str], float] | None = None
    ) -> None:
        self.upstream = upstream
        self.prices = dict(prices or {})  # (region, instance type) -> USD per hour
        self.rules: list[Rule] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> AwsFront:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(
        self,
        action: str,
        answer: Reply | Responder,
        times: int | None = None,
        region: str | None = None,
        **when: str,
    ) -> None:
        with self._lock:
            self.rules.append(Rule(action, answer, when, times, region))

    def requests(self, action: str) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.seen if seen.action == action]

    def respond(self, seen: Seen, raw: bytes, headers: dict[str, str]) -> Reply:
        with self._lock:
            self.seen.append(seen)
            rule = next((r for r in self.rules if r.matches(seen)), None)
            if rule is not None and rule.times is not None:
                rule.times -= 1
        if rule is not None:
            reply = rule.answer(seen) if callable(rule.answer) else rule.answer
            if reply is not None:
                return reply
        if seen.action == "GetProducts":
            return self._price_list(seen)
        if self.upstream is None:
            return Reply(400, recorded("error.xml", code="UnexpectedTestRequest", message=""))
        return _forward(self.upstream, raw, headers)

    def _price_list(self, seen: Seen) -> Reply:
        """A GetProducts page shaped like the recorded one, for the filtered (region, type)."""
        filters = {f["Field"]: f["Value"] for f in (seen.json_body or {}).get("Filters", [])}
        key = (filters.get("regionCode", ""), filters.get("instanceType", ""))
        entries = []
        if key in self.prices:
            product = recorded(
                "get_products_entry.json",
                instance_type=key[1],
                region=key[0],
                price=f"{self.prices[key]:.10f}",
            )
            entries.append(json.dumps(json.loads(product)))  # PriceList items are JSON text
        body = json.dumps({"FormatVersion": "aws_v1", "PriceList": entries}).encode()
        return Reply(200, body, "application/x-amz-json-1.1")


def _handler(front: AwsFront) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stall

        def do_POST(self) -> None:  # noqa: N802  (http.server's name)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items()}
            reply = front.respond(_seen(headers, raw), raw, headers)
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for key, value in reply.headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _seen(headers: dict[str, str], raw: bytes) -> Seen:
    lowered = {k.lower(): v for k, v in headers.items()}
    scope = lowered.get("authorization", "").split("Credential=")[-1].split("/")
    region = scope[2] if len(scope) > 2 else ""
    target = lowered.get("x-amz-target")
    if target:
        return Seen(target.split(".")[-1], {}, region, json.loads(raw or b"{}"))
    params = dict(parse_qsl(raw.decode(), keep_blank_values=True))
    return Seen(params.get("Action", ""), params, region)


def _forward(upstream: str, raw: bytes, headers: dict[str, str]) -> Reply:
    target = urlsplit(upstream)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=READ_TIMEOUT)
    try:
        skip = {"host", "content-length", "connection", "accept-encoding"}
        forwarded = {k: v for k, v in headers.items() if k.lower() not in skip}
        connection.request("POST", "/", body=raw, headers=forwarded)
        response = connection.getresponse()
        body = response.read()
        kind = response.getheader("Content-Type") or "text/xml"
        return Reply(response.status, body, kind)
    finally:
        connection.close()


# ---------------------------------------------------------------- the adapter


def aws_config(endpoint_url: str, **overrides: Any) -> AwsConfig:
    """A fast AwsConfig on `endpoint_url`: H100 (p5.48xlarge) in two zones of us-east-1."""
    settings: dict[str, Any] = dict(
        endpoint_url=endpoint_url,
        regions=[REGION],
        zones={REGION: ["us-east-1a", "us-east-1b"]},
        instance_types=["p5.48xlarge"],
        images={REGION: MOTO_AMI},
        spot=False,
        poll_interval=0.05,
        boot_timeout=READ_TIMEOUT,
        delete_timeout=READ_TIMEOUT,
        request_timeout=READ_TIMEOUT,
    )
    settings.update(overrides)
    return AwsConfig(**settings)


# One SDK session for every test adapter: parsing EC2's API model takes most of a second.
_SESSION = AioSession()


def aws_cloud(endpoint_url: str, **overrides: Any) -> AwsCloud:
    """An AwsCloud with dummy keys on a loopback endpoint (never the AWS chain, never AWS)."""
    return AwsCloud(
        aws_config(endpoint_url, **overrides), credentials=TEST_CREDENTIALS, session=_SESSION
    )

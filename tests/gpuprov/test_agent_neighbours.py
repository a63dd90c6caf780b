"""The node agent behind an address it shares (every node behind one NAT gateway does) with a
neighbour that keeps presenting bad join tokens: the real agent process against the real API
registers at once, heartbeats and answers `whoami` while the address is throttled; and where
the API (or a proxy in front of it) does answer 429, the agent waits out its Retry-After and
carries on instead of giving up."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import respx

from gpuprov.cli.dev import free_port
from gpuprov.node.errors import AgentError
from gpuprov.node.http_client import call_api
from providers.fake import agent as fake_agent
from providers.fake import node
from tests.gpuprov.test_agent_run import (
    api_on,
    heartbeats,
    install,
    join_env,
    start,
    stop,
    until,
)
from tests.gpuprov.test_api import CAPABILITIES, REGISTER, VM, body, vm_token

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@contextlib.asynccontextmanager
async def neighbour(url: str) -> AsyncIterator[list[int]]:
    """Bogus join tokens from this machine's address, one after another, until the block ends;
    the statuses answered."""
    answered: list[int] = []

    async def flood(http: httpx.AsyncClient) -> None:
        number = 0
        while True:
            number += 1
            response = await http.post(REGISTER, json=body(f"bogus-join-token-{number:06d}"))
            answered.append(response.status_code)
            await asyncio.sleep(0.02)

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        task = asyncio.create_task(flood(http))
        try:
            await until(lambda: answered.count(429) >= 5, "the address to be throttled")
            yield answered
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # not about the database
async def test_a_node_registers_at_once_while_its_neighbours_bad_tokens_throttle_the_address(
    records, tmp_path
):
    root = tmp_path / "node"
    install(root / "bin")
    token = vm_token(records)
    async with api_on(records, free_port()) as url, neighbour(url) as answered:
        assert answered[:20] == [401] * 20  # then 429: the address is throttled
        daemon = start(root, sys.executable, "--token-file", str(join_env(root, url, token)))
        try:
            found = await until(lambda: records.workers_of_vms([VM]), "registration", timeout=60)
            [worker_id] = [row.id for row in found.values()]
            seen = heartbeats(records, worker_id)
            await until(lambda: heartbeats(records, worker_id) >= seen + 3, "heartbeats")
            whoami = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, str(root / node.AGENT_PATH), "whoami", "--url", url,
                 "--state-dir", str(daemon.state_dir), "--tries", "1"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert whoami.returncode == 0, whoami.stderr
            assert worker_id in whoami.stdout
            assert answered[-1] == 429  # the neighbour was throttled all along
        finally:
            stop(daemon)
    # the agent itself was never throttled: no "HTTP 429" retry and no "(429)" refusal in its
    # log (a bare "429" would also match a port number in the URL it prints)
    assert "HTTP 429" not in daemon.log, daemon.log
    assert "(429)" not in daemon.log, daemon.log


class _Throttling(BaseHTTPRequestHandler):
    """429 with Retry-After for the first `refusals` requests, then 200 with {}."""

    refusals = 1
    retry_after = "2"
    seen: list[float] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append(time.monotonic())
        if len(self.seen) <= self.refusals:
            self.send_response(429)
            self.send_header("Retry-After", self.retry_after)
            payload = b'{"detail": "too many bad secrets from this address"}'
        else:
            self.send_response(200)
            payload = b"{}"
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def throttling_server() -> Iterator[str]:
    _Throttling.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Throttling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_agent_waits_out_a_429s_retry_after_and_gets_through():
    with throttling_server() as url:
        answer = call_api(url, "/v1/workers/me", tries=3, pause=0.05)
    assert answer == {}
    first, second = _Throttling.seen
    assert second - first >= 1.9  # the Retry-After, not the 0.05 s backoff


def test_a_throttled_call_that_runs_out_of_tries_is_transient_and_says_how_long_to_wait():
    with throttling_server() as url, pytest.raises(AgentError) as raised:
        call_api(url, "/v1/workers/me", tries=1)
    assert raised.value.transient and raised.value.retry_after == 2.0
    assert raised.value.status is None  # no refusal: asked again, it can get through


@respx.mock(assert_all_called=True)
async def test_the_fake_clouds_agent_takes_a_429_for_a_pause_not_a_refusal(respx_mock):
    route = respx_mock.post("http://api/v1/workers/register")
    route.side_effect = [
        httpx.Response(429, headers={"Retry-After": "1"}, json={"detail": "slow down"}),
        httpx.Response(200, json={"credential": "gpw_x"}),
    ]
    capabilities = dict(CAPABILITIES)
    started = time.monotonic()
    assert await fake_agent.register("http://api", "a-join-token-0001", capabilities) == "gpw_x"
    assert time.monotonic() - started >= 0.9 and route.call_count == 2

"""The agent keeps its connection to the control plane open between calls (one per thread),
opens a new one when the server closed the kept one while it sat idle, and never hides a
failure of a connection it has just opened."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuprov.node.connections import KeptConnections
from gpuprov.node.errors import AgentError
from gpuprov.node.http_client import call_api


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.requests = 0
        self.close_after_answer = False  # then closed without saying so, as an idle timeout does
        self.drop_next = 0  # connections closed unanswered


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.server.drop_next:
            self.server.drop_next -= 1
            self.close_connection = True
            return
        self.server.requests += 1
        close = self.server.close_after_answer  # read before the answer lets the test go on
        body = b'{"n": %d}' % self.server.requests
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = close

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _serving() -> Iterator[tuple[_Server, str]]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_calls_on_kept_connections_share_one_and_calls_without_open_their_own():
    with _serving() as (server, url):
        kept = KeptConnections()
        answers = [call_api(url, "/v1/workers/me", tries=1, connections=kept) for _ in range(3)]
        assert [answer["n"] for answer in answers] == [1, 2, 3]
        assert server.connections == 1
        kept.close()
        for _ in range(2):
            call_api(url, "/v1/workers/me", tries=1)
        assert server.connections == 3


def test_a_connection_the_server_closed_while_idle_is_replaced_without_a_failure():
    with _serving() as (server, url):
        kept = KeptConnections()
        server.close_after_answer = True
        assert call_api(url, "/v1/workers/me", tries=1, connections=kept) == {"n": 1}
        server.close_after_answer = False
        assert call_api(url, "/v1/workers/me", tries=1, connections=kept) == {"n": 2}
        assert server.connections == 2
        assert call_api(url, "/v1/workers/me", tries=1, connections=kept) == {"n": 3}
        assert server.connections == 2
        kept.close()


def test_a_new_connection_dropped_unanswered_is_a_failure_not_retried_behind_the_callers_back():
    with _serving() as (server, url):
        kept = KeptConnections()
        server.drop_next = 1
        with pytest.raises(AgentError) as failed:
            call_api(url, "/v1/workers/me", tries=1, connections=kept)
        assert failed.value.transient and "cannot reach" in str(failed.value)
        assert server.connections == 1 and server.requests == 0
        # a kept connection met closed is replaced once; a drop on the new one is a failure
        server.close_after_answer = True
        assert call_api(url, "/v1/workers/me", tries=1, connections=kept) == {"n": 1}
        server.close_after_answer, server.drop_next = False, 1
        with pytest.raises(AgentError):
            call_api(url, "/v1/workers/me", tries=1, connections=kept)
        assert server.connections == 3 and server.requests == 1
        kept.close()


def test_each_thread_has_its_own_kept_connection():
    with _serving() as (server, url):
        kept = KeptConnections()

        def three_calls() -> None:
            for _ in range(3):
                call_api(url, "/v1/workers/me", tries=1, connections=kept)
            kept.close()

        threads = [threading.Thread(target=three_calls) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert server.requests == 6 and server.connections == 2

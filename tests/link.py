"""`Link`: a TCP proxy on loopback between node agents and the API that a test can degrade.

Each connection carries one HTTP request: the agent keeps its connections open between calls,
but the link asks the API to close each after its answer (`Connection: close`), so every
request meets the link afresh. The proxy reads the request's head, then either passes the
connection through to the API or drops it (closes it unanswered, as a cut cable or a lost
packet looks to the agent):
- `cut()`: every credential seen so far (`Authorization: Bearer ...`) is cut off for good,
  while new ones (a replacement node registering, then heartbeating) pass: one partitioned
  node among healthy ones;
- `jitter(delay, drop_share, error_share, max_in_a_row)`: every request waits up to `delay`
  seconds; `drop_share` of them are dropped and `error_share` answered 503 by the link itself,
  never more than `max_in_a_row` in a row for one credential (seeded: the same order of
  requests meets the same fate).
`dropped` and `passed` count what it did; `stop()` (or leaving `running()`) closes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpuprov.cli.dev import free_port

MAX_HEAD = 64 * 1024
_BEARER = re.compile(rb"^authorization:\s*bearer\s+(\S+)", re.I | re.M)
_CONNECTION = re.compile(rb"^connection:[^\r\n]*\r\n", re.I | re.M)


def one_request_only(head: bytes) -> bytes:
    """`head` asking for the connection to be closed after its answer."""
    return _CONNECTION.sub(b"", head)[:-2] + b"Connection: close\r\n\r\n"


class Link:
    def __init__(self, upstream_port: int, seed: int = 0) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: set[bytes] = set()
        self.cut_off: set[bytes] = set()
        self.delay, self.drop_share, self.error_share, self.max_in_a_row = 0.0, 0.0, 0.0, 0
        self.random = random.Random(seed)
        self.in_a_row: dict[bytes | None, int] = {}
        self.passed = self.dropped = self.errors = self.delayed = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def cut(self) -> None:
        """Every credential seen so far is cut off from the API from now on."""
        self.cut_off |= self.seen

    def jitter(
        self, delay: float, drop_share: float, error_share: float = 0.0, max_in_a_row: int = 3
    ) -> None:
        self.delay, self.drop_share, self.error_share = delay, drop_share, error_share
        self.max_in_a_row = max_in_a_row

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._carry(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_HEAD:
            return
        found = _BEARER.search(head)
        credential = found.group(1) if found else None
        if credential is not None:
            self.seen.add(credential)
        if self.delay:
            self.delayed += 1
            await asyncio.sleep(self.random.uniform(0, self.delay))
        if credential in self.cut_off:
            self.dropped += 1
            return  # closed unanswered
        fate, row = self.random.random(), self.in_a_row.get(credential, 0)
        if fate < self.drop_share + self.error_share and row < self.max_in_a_row:
            self.in_a_row[credential] = row + 1
            if fate < self.drop_share:
                self.dropped += 1
                return  # closed unanswered
            self.errors += 1
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")  # fmt: skip
            await writer.drain()
            return
        self.in_a_row[credential] = 0
        self.passed += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            up_writer.write(one_request_only(head))
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()


@asynccontextmanager
async def running(upstream_port: int, seed: int = 0) -> AsyncIterator[Link]:
    link = Link(upstream_port, seed)
    await link.start()
    try:
        yield link
    finally:
        await link.stop()

"""The heartbeat load generator, in its own process: `python -m bench.heartbeat_load` (a JSON
LoadRequest on stdin, the JSON LoadResult on stdout).

Each simulated agent makes what the node agent makes: with `keep_alive` (the agent today) one
loopback connection it keeps, HTTP/1.1 requests on it one after another, a new connection only
when the server has closed it; without, a new connection per request with `Connection: close`
(the agent's urllib before). Paced: agent i starts at i x interval / agents and then sends one
every interval (a late answer delays only that agent's next one). Unpaced: `agents` loops, each
sending the next as soon as the last is answered: what the API holds at most. Bounded in count
(the agents) and in time (`seconds`); only 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time

from pydantic import BaseModel, Field

HOST = "127.0.0.1"


class LoadRequest(BaseModel):
    port: int
    method: str = "POST"
    path: str = "/v1/workers/heartbeat"
    credentials_file: str | None = None  # one credential a line, one agent each; 0600
    agents: int = Field(ge=1, le=10_000)
    interval: float | None = None  # seconds; None: unpaced
    seconds: float = Field(gt=0, le=600)
    keep_alive: bool = True


class LoadResult(BaseModel):
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = Field(default_factory=dict)  # "status 401", "connect: ..." -> n
    latencies: list[float] = Field(default_factory=list)  # seconds, answered requests
    seconds: float = 0.0  # first send to last answer
    cpu_seconds: float = 0.0  # this process


def _request(method: str, path: str, credential: str | None, keep_alive: bool) -> bytes:
    body = b'{"healthy": true, "detail": null}' if method == "POST" else b""
    headers = [f"{method} {path} HTTP/1.1", f"Host: {HOST}"]
    if not keep_alive:
        headers.append("Connection: close")
    if credential:
        headers.append(f"Authorization: Bearer {credential}")
    if body:
        headers += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


class Connection:
    """One agent's connection: kept open between requests with keep-alive, else one a request."""

    def __init__(self, port: int, keep_alive: bool) -> None:
        self.port = port
        self.keep_alive = keep_alive
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def close(self) -> None:
        if self.streams is not None:
            writer = self.streams[1]
            self.streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def exchange(self, request: bytes) -> bytes:
        """The answer's status line and head (the body read and dropped)."""
        for attempt in (1, 2):
            fresh = self.streams is None
            if fresh:
                self.streams = await asyncio.open_connection(HOST, self.port)
            reader, writer = self.streams
            try:
                writer.write(request)
                await writer.drain()
                if not self.keep_alive:
                    return await reader.read()  # Connection: close: to the end
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                if b"connection: close" in head.lower():
                    await self.close()
                return head
            except (OSError, asyncio.IncompleteReadError):
                await self.close()
                if fresh or attempt == 2:  # a kept connection the server closed: once more
                    raise
            finally:
                if not self.keep_alive:
                    await self.close()
        raise AssertionError("unreachable")


async def _once(connection: Connection, request: bytes, result: LoadResult) -> None:
    started = time.perf_counter()
    result.sent += 1
    try:
        answer = await connection.exchange(request)
    except (OSError, asyncio.IncompleteReadError) as error:
        key = f"connect: {type(error).__name__}"
        result.errors[key] = result.errors.get(key, 0) + 1
        return
    status = answer.split(b" ", 2)[1:2]
    if status == [b"200"]:
        result.ok += 1
        result.latencies.append(time.perf_counter() - started)
    else:
        key = f"status {status[0].decode() if status else '?'}"
        result.errors[key] = result.errors.get(key, 0) + 1


def read_credentials(load: LoadRequest) -> list[str | None]:
    if not load.credentials_file:
        return [None] * load.agents
    with open(load.credentials_file) as handle:
        return [line.strip() for line in handle if line.strip()][: load.agents]


async def run(load: LoadRequest, credentials: list[str | None]) -> LoadResult:
    requests = [
        _request(load.method, load.path, credential, load.keep_alive) for credential in credentials
    ]
    result = LoadResult()
    started = time.perf_counter()
    deadline = started + load.seconds

    async def agent(index: int) -> None:
        request = requests[index]
        connection = Connection(load.port, load.keep_alive)
        try:
            if load.interval is None:
                while time.perf_counter() < deadline:
                    await _once(connection, request, result)
                return
            due = started + index * load.interval / len(requests)
            while due < deadline:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                await _once(connection, request, result)
                due += load.interval
        finally:
            await connection.close()

    await asyncio.gather(*(agent(index) for index in range(len(requests))))
    result.seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time()
    return result


def main() -> None:
    load = LoadRequest.model_validate_json(sys.stdin.read())
    result = asyncio.run(run(load, read_credentials(load)))
    sys.stdout.write(result.model_dump_json())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

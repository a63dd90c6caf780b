"""The heartbeat load generator, in its own process: `python -m bench.heartbeat_load` (a JSON
LoadRequest on stdin, the JSON LoadResult on stdout).

Each simulated agent makes what the node agent's urllib makes: a new loopback connection per
request, one `Connection: close` HTTP/1.1 request, the response read to the end. Paced: agent i
starts at i x interval / agents and then sends one every interval (a late answer delays only
that agent's next one). Unpaced: `agents` loops, each sending the next as soon as the last is
answered: what the API holds at most. Bounded in count (the agents) and in time (`seconds`); only
127.0.0.1.
"""

from __future__ import annotations

import asyncio
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


class LoadResult(BaseModel):
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = Field(default_factory=dict)  # "status 401", "connect: ..." -> n
    latencies: list[float] = Field(default_factory=list)  # seconds, answered requests
    seconds: float = 0.0  # first send to last answer
    cpu_seconds: float = 0.0  # this process


def _request(method: str, path: str, credential: str | None) -> bytes:
    body = b'{"healthy": true, "detail": null}' if method == "POST" else b""
    headers = [f"{method} {path} HTTP/1.1", f"Host: {HOST}", "Connection: close"]
    if credential:
        headers.append(f"Authorization: Bearer {credential}")
    if body:
        headers += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


async def _once(port: int, request: bytes, result: LoadResult) -> None:
    started = time.perf_counter()
    result.sent += 1
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            writer.write(request)
            await writer.drain()
            answer = await reader.read()  # Connection: close: to the end
        finally:
            writer.close()
            await writer.wait_closed()
    except OSError as error:
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
    requests = [_request(load.method, load.path, credential) for credential in credentials]
    result = LoadResult()
    started = time.perf_counter()
    deadline = started + load.seconds

    async def agent(index: int) -> None:
        request = requests[index]
        if load.interval is None:
            while time.perf_counter() < deadline:
                await _once(load.port, request, result)
            return
        due = started + index * load.interval / len(requests)
        while due < deadline:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await _once(load.port, request, result)
            due += load.interval

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

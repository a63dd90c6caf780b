"""The fake cloud's simulated node agent: what a booted machine's agent would report, sent
through the real control-plane API with the real join token from the instance's bootstrap, then
heartbeats with the worker credential it got, as gpuprov.agent `run` does: at the interval the
API answers, until the credential is refused or the instance is deleted (the task cancelled)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from gpuprov.models import GpuInfo, WorkerCapabilities
from providers.fake.config import FakeInstanceType

log = logging.getLogger(__name__)

RUNTIME_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
RETRY_PAUSE = 1.0
MAX_TRIES = 30
HEARTBEAT_INTERVAL = 30.0  # until the API says otherwise
# What the simulated agent reports once a GPU fault shows (the real agent's words for them).
GPU_FAULT_DETAILS = {
    "gpu_lost": "GPU 0000:A8:00.0 is lost (fallen off the bus, Xid 79)",
    "ecc_error": "GPU 00000000:86:00.0: 1 uncorrectable ECC error(s) since the driver loaded "
    "(Xid 48)",
    "gpu_missing": "1 registered GPU(s) missing from nvidia-smi's list (7 of 8 listed)",
}


def simulated_capabilities(
    instance_type: FakeInstanceType, runtime_broken: bool
) -> WorkerCapabilities:
    memory_mb = int(instance_type.gpu_memory_gb * 1024) if instance_type.gpu_memory_gb else None
    gpus = [
        GpuInfo(name=f"NVIDIA {instance_type.gpu}", memory_mb=memory_mb, driver_version="550.54.15")
        for _ in range(instance_type.gpu_count if instance_type.gpu else 0)
    ]
    return WorkerCapabilities(
        gpus=gpus,
        driver_version="550.54.15" if gpus else None,
        cuda_version="12.4" if gpus else None,
        cpu_count=instance_type.vcpus,
        memory_gb=instance_type.memory_gb,
        disk_gb=instance_type.disk_gb,
        gpu_runtime_ok=bool(gpus) and not runtime_broken,
        gpu_runtime_error=RUNTIME_MISMATCH if runtime_broken else None,
        agent_version="fake-agent",
        address="127.0.0.1",  # every simulated node is on this machine
    )


async def register(api_url: str, token: str, capabilities: WorkerCapabilities) -> str | None:
    """POST /v1/workers/register until accepted (the worker's credential) or refused for good
    (None).

    Any 4xx is final (a bad, used or expired token, or a job that refused the node: 409);
    5xx and connection errors are retried, as gpuprov.agent does.
    """
    body = {"token": token, "capabilities": capabilities.model_dump(mode="json")}
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        for _ in range(MAX_TRIES):
            try:
                response = await http.post("/v1/workers/register", json=body)
            except httpx.HTTPError as error:
                log.info("fake agent: API unreachable (%s), retrying", error)
            else:
                if response.status_code == 200:
                    return str(response.json()["credential"])
                if response.status_code < 500:
                    log.warning("fake agent: registration refused: %s", response.text)
                    return None
            await asyncio.sleep(RETRY_PAUSE)
    return None


async def heartbeat(
    api_url: str, credential: str, health: Callable[[], tuple[bool, str | None]]
) -> None:
    """Heartbeat with `health()` (healthy, detail) until the credential is refused (401)."""
    interval = HEARTBEAT_INTERVAL
    headers = {"Authorization": f"Bearer {credential}"}
    async with httpx.AsyncClient(base_url=api_url, timeout=30, headers=headers) as http:
        while True:
            healthy, detail = health()
            try:
                response = await http.post(
                    "/v1/workers/heartbeat", json={"healthy": healthy, "detail": detail}
                )
            except httpx.HTTPError as error:
                log.info("fake agent: heartbeat failed (%s), retrying", error)
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if response.status_code == 401:
                return  # revoked: the real agent exits here
            if response.status_code == 200:
                interval = float(response.json().get("interval_seconds", interval))
            await asyncio.sleep(interval)

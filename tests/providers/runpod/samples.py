"""Realistic RunPod REST v2 bodies, shaped after the examples and schemas of RunPod's own
OpenAPI document (tests/fixtures/openapi/runpod/api-reference-v2/openapi.json) and the error
texts RunPod is known to send (runpodctl#189, runpod-python#297, dstack#1740)."""

from __future__ import annotations

import copy
import json
from typing import Any

BASE_URL = "https://api.runpod.io"
API_KEY = "rp_TESTKEY0123456789abcdef"  # a made-up key: tests check it never leaks
VM = "train-7b-a1-n0-ce4389"
LABEL = f"gpuprov-{VM}"
USER_KEY = (  # the example key of RunPod's OpenAPI document
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILXGDN/SclOozk1xsDztpmhGiKkkrfQB9SKoO8dSIQQZ"
    " me@example.com"
)
VM_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuprovPerVmKeyPerVmKeyPerVmKeyPerVmKey0 gpuprov"


def _gpu(
    gpu_id: str,
    name: str,
    memory: int,
    secure: float,
    community: float,
    max_secure: int,
    max_community: int,
    data_centers: list[tuple[str, str, str]] | None,
    availability: str = "HIGH",
    manufacturer: str = "NVIDIA",
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": gpu_id,
        "name": name,
        "pool": None,
        "manufacturer": manufacturer,
        "memory": memory,
        "secure": True,
        "community": community > 0,
        "price": {"secure": secure, "community": community},
        "maxCount": {"secure": max_secure, "community": max_community},
        "availability": availability,
    }
    if data_centers is not None:
        entry["dataCenters"] = [
            {"id": dc, "name": dc_name, "availability": level}
            for dc, dc_name, level in data_centers
        ]
    return entry


# GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=8&cloud=SECURE
CATALOG: dict[str, Any] = {
    "gpus": [
        _gpu(
            "NVIDIA H100 PCIe",
            "H100 PCIe",
            80,
            2.39,
            1.99,
            8,
            4,
            [("US-KS-2", "US Kansas 2", "LOW")],
            availability="LOW",
        ),
        _gpu(
            "NVIDIA H100 80GB HBM3",
            "H100 SXM",
            80,
            2.69,
            0,
            8,
            0,
            [
                ("EU-RO-1", "EU Romania 1", "MEDIUM"),
                ("US-TX-3", "US Texas 3", "HIGH"),
                ("CA-MTL-1", "CA Montreal 1", "NONE"),
            ],
            availability="HIGH",
        ),
        # Stocked nowhere: availability NONE and no dataCenters at all (as documented).
        _gpu("NVIDIA A100 80GB PCIe", "A100 PCIe", 80, 1.64, 1.19, 8, 8, None, "NONE"),
        # Not offered with 8 on one machine (maxCount 2).
        _gpu(
            "NVIDIA GeForce RTX 4090",
            "RTX 4090",
            24,
            0.44,
            0.31,
            2,
            4,
            [("US-KS-2", "US Kansas 2", "HIGH")],
        ),
        _gpu(
            "AMD Instinct MI300X OAM",
            "MI300X",
            192,
            2.49,
            0,
            8,
            0,
            [("EU-RO-1", "EU Romania 1", "LOW")],
            manufacturer="AMD",
        ),
    ]
}


def pod(
    pod_id: str = "7h9k2m4n6p",
    name: str = LABEL,
    status: str = "RUNNING",
    direct: bool = True,
    data_center: str | None = "US-KS-2",
    vm_marker: str | None = VM,
    endpoint: tuple[str, int] = ("195.26.233.3", 34446),
) -> dict[str, Any]:
    """A Pod as GET /v2/pods returns it (every field the schema requires); `endpoint` is
    its ssh.direct host and port."""
    host, port = endpoint
    env: dict[str, str] = {"PUBLIC_KEY": VM_KEY}
    if vm_marker is not None:
        env["GPUPROV_VM"] = vm_marker
    running = status == "RUNNING"
    return {
        "id": pod_id,
        "name": name,
        "image": "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404",
        "args": "",
        "disk": 100,
        "ports": ["22/tcp"],
        "env": env,
        "registry": None,
        "status": status,
        "actions": ["stop", "restart", "terminate"] if running else ["terminate"],
        "mounts": {},
        "gpu": {"id": "NVIDIA H100 PCIe", "count": 8},
        "cloud": "SECURE",
        "dataCenterId": data_center,
        "cudaVersion": "12.8" if data_center else None,
        "ssh": {
            "proxy": {
                "host": "ssh.runpod.io",
                "port": 22,
                "username": f"{pod_id}-64411eb2",
                "command": f"ssh {pod_id}-64411eb2@ssh.runpod.io",
            },
            "direct": (
                {
                    "host": host,
                    "port": port,
                    "username": "root",
                    "command": f"ssh root@{host} -p {port}",
                }
                if running and direct
                else None
            ),
        },
        "template": None,
        "cost": 19.12 if running else 0.0,
        "locked": False,
        "globalNetworking": {"enabled": False},
        "runtime": (
            {
                "uptime": 60,
                "ports": [{"private": 22, "public": port, "type": "tcp", "ip": host}],
            }
            if running and direct
            else None
        ),
        "createdAt": "2026-06-01T12:00:00Z",
        "startedAt": "2026-06-01T12:02:00Z" if running else None,
    }


def problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> bytes:
    body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return json.dumps(body).encode()


STOCKOUT = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
STOCKOUT_400 = problem(400, "Bad Request", STOCKOUT)
DISK_STOCKOUT_400 = problem(
    400, "Bad Request", "There are no longer any instances available with enough disk space."
)
HOST_GPUS_400 = problem(
    400, "Bad Request", "There are not enough free GPUs on the host machine to start this pod."
)
RULE_400 = problem(400, "Bad Request", "allowedCudaVersions and minCudaVersion are exclusive")
# The documented examples of createPod's 400 and 403 (components/responses, api-reference-v2).
BAD_REQUEST_400 = problem(400, "Bad Request", "request could not be processed")
UNAUTHORIZED_401 = problem(401, "Unauthorized", "missing bearer token")
BALANCE_402 = problem(402, "Payment Required", "insufficient balance to deploy this pod")
FORBIDDEN_403 = problem(403, "Forbidden", "access denied")
NOT_FOUND_404 = problem(404, "Not Found", "pod not found")
CLUSTER_409 = problem(
    409, "Conflict", "pod belongs to a cluster; delete the cluster via /v2/clusters/{id}"
)
VALIDATION_422 = problem(
    422,
    "Unprocessable Entity",
    "Request validation failed.",
    ["$: additional properties 'bogus' not allowed"],
)
RATE_LIMITED_429 = problem(429, "Too Many Requests", "rate limit exceeded for the minute window")
INTERNAL_500 = problem(500, "Internal Server Error", "upstream error")
BAD_GATEWAY_HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"


def catalog() -> dict[str, Any]:
    return copy.deepcopy(CATALOG)

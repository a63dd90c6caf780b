"""Realistic Prime Intellect answers, shaped like the vendor OpenAPI document and the examples in
Prime's own API guides (docs.primeintellect.ai: "Get Availability Information", "Provision
Instance", "Managing Pods"). test_contract.py validates every one against the document."""

from __future__ import annotations

import copy
from typing import Any

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHprimetestkeyprimetestkeyprimetest ops@example"
NULL_SPEC: dict[str, Any] = {
    "minCount": None,
    "defaultCount": None,
    "maxCount": None,
    "pricePerUnit": None,
    "step": None,
    "defaultIncludedInPrice": None,
    "additionalInfo": None,
}


def _spec(**values: Any) -> dict[str, Any]:
    return {**NULL_SPEC, **values}


# The guide's Hyperstack offer: fixed resources, everything in the base price.
HYPERSTACK_H100: dict[str, Any] = {
    "cloudId": "n3-H100x1",
    "gpuType": "H100_80GB",
    "socket": "PCIe",
    "provider": "hyperstack",
    "region": "canada",
    "dataCenter": "CANADA-1",
    "country": "CA",
    "gpuCount": 1,
    "gpuMemory": 80,
    "disk": _spec(defaultCount=100),
    "vcpu": _spec(defaultCount=180),
    "memory": _spec(defaultCount=180),
    "internetSpeed": None,
    "interconnect": None,
    "interconnectType": None,
    "provisioningTime": None,
    "stockStatus": "Available",
    "security": "secure_cloud",
    "prices": {"onDemand": 1.9, "communityPrice": None, "isVariable": None, "currency": "USD"},
    "images": ["ubuntu_22_cuda_12", "cuda_12_1_pytorch_2_2", "flux", "axolotl"],
    "isSpot": None,
    "prepaidTime": None,
}

# The guide's RunPod offer: the default disk is charged on top (defaultIncludedInPrice false).
RUNPOD_H100: dict[str, Any] = {
    "cloudId": "NVIDIA H100 PCIe",
    "gpuType": "H100_80GB",
    "socket": "PCIe",
    "provider": "runpod",
    "region": "united_states",
    "dataCenter": "US-KS-2",
    "country": "US",
    "gpuCount": 1,
    "gpuMemory": 80,
    "disk": _spec(
        minCount=80,
        defaultCount=80,
        maxCount=1000,
        pricePerUnit=0.00014,
        step=1,
        defaultIncludedInPrice=False,
    ),
    "vcpu": _spec(defaultCount=16),
    "memory": _spec(defaultCount=251),
    "stockStatus": "Low",
    "security": "secure_cloud",
    "prices": {"onDemand": 2.69, "communityPrice": None, "isVariable": None, "currency": "USD"},
    "images": ["ubuntu_22_cuda_12", "cuda_12_1_pytorch_2_2"],
    "isSpot": False,
}

# An 8-GPU node in one of Prime's own data centres.
DC_ROAN_H100X8: dict[str, Any] = {
    "cloudId": "8x-h100-sxm5",
    "gpuType": "H100_80GB",
    "socket": "SXM5",
    "provider": "dc_roan",
    "region": "united_states",
    "dataCenter": "us-east-1",
    "country": "US",
    "gpuCount": 8,
    "gpuMemory": 80,
    "disk": _spec(defaultCount=2000, defaultIncludedInPrice=True, pricePerUnit=0.0001),
    "vcpu": _spec(defaultCount=104),
    "memory": _spec(defaultCount=752),
    "interconnect": 3200,
    "interconnectType": "Infiniband",
    "stockStatus": "Medium",
    "security": "secure_cloud",
    "prices": {"onDemand": 15.92, "communityPrice": None, "isVariable": False, "currency": "USD"},
    "images": ["ubuntu_22_cuda_12", "cuda_12_4_pytorch_2_5"],
    "isSpot": False,
}

# A community-cloud offer: its price is `communityPrice`.
COMMUNITY_RTX4090: dict[str, Any] = {
    "cloudId": "rtx4090-1x",
    "gpuType": "RTX4090_24GB",
    "socket": "PCIe",
    "provider": "massedcompute",
    "region": "eu_west",
    "dataCenter": None,
    "country": "NL",
    "gpuCount": 1,
    "gpuMemory": 24,
    "disk": _spec(defaultCount=50),
    "vcpu": _spec(defaultCount=8),
    "memory": _spec(defaultCount=32),
    "stockStatus": "High",
    "security": "community_cloud",
    "prices": {"onDemand": None, "communityPrice": 0.39, "isVariable": True, "currency": "USD"},
    "images": ["ubuntu_22_cuda_12"],
    "isSpot": True,
}

SOLD_OUT = {**HYPERSTACK_H100, "cloudId": "n3-H100x2", "gpuCount": 2, "stockStatus": "Unavailable"}
PREPAID = {**RUNPOD_H100, "cloudId": "reserved-h100", "prepaidTime": 720.0}
UNPRICED = {
    **HYPERSTACK_H100,
    "cloudId": "n3-A100x1",
    "gpuType": "A100_80GB",
    "prices": {"onDemand": None, "communityPrice": None, "isVariable": None, "currency": "USD"},
}


def availability(*items: dict[str, Any], total: int | None = None) -> dict[str, Any]:
    return {
        "items": copy.deepcopy(list(items)),
        "totalCount": len(items) if total is None else total,
    }


def pod(
    pod_id: str,
    name: str,
    status: str = "PROVISIONING",
    installation: str = "PENDING",
    ssh: str | None = None,
    ip: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An APIPodConfig as the list and create answers carry it."""
    body: dict[str, Any] = {
        "id": pod_id,
        "userId": "user-7f3a",
        "teamId": None,
        "walletId": "wallet-19",
        "name": name,
        "type": "HOSTED",
        "providerType": "runpod",
        "status": status,
        "installationStatus": installation,
        "installationFailure": None,
        "installationProgress": 100 if installation == "FINISHED" else 0,
        "createdAt": "2026-08-20T10:00:00Z",
        "updatedAt": "2026-08-20T10:01:00Z",
        "terminatedAt": None,
        "gpuName": "H100_80GB",
        "gpuCount": 1,
        "socket": "PCIe",
        "priceHr": 2.7,
        "stoppedPriceHr": None,
        "provisioningPriceHr": 0.0,
        "environmentType": "ubuntu_22_cuda_12",
        "customTemplateId": None,
        "clusterId": None,
        "primePortMapping": [],
        "sshConnection": ssh,
        "ip": ip,
        "resources": {"memory": 251, "disk": 80, "vcpus": 16},
        "attachedResources": [],
        "isSpot": False,
        "autoRestart": False,
    }
    body.update(extra)
    return body


def pods_page(*pods: dict[str, Any], offset: int = 0, total: int | None = None) -> dict[str, Any]:
    return {
        "total_count": len(pods) if total is None else total,
        "offset": offset,
        "limit": 100,
        "data": copy.deepcopy(list(pods)),
    }


def ssh_key(key_id: str, name: str, public_key: str = PUBLIC_KEY) -> dict[str, Any]:
    return {
        "id": key_id,
        "userId": "user-7f3a",
        "name": name,
        "publicKey": public_key,
        "isPrimary": False,
        "isUserKey": True,
        "createdAt": "2026-08-20T09:00:00Z",
        "updatedAt": "2026-08-20T09:00:00Z",
    }


def keys_page(*keys: dict[str, Any]) -> dict[str, Any]:
    return {"total_count": len(keys), "offset": 0, "limit": 100, "data": list(keys)}


# Error answers in Prime's shapes. The stockout text is representative: Prime documents none.
STOCKOUT = {"detail": "No capacity: the selected GPU configuration is out of stock"}
NO_BALANCE = {"detail": "Insufficient balance. Please add funds to your wallet."}
UNAUTHORIZED = {"detail": "Invalid API key"}
VALIDATION = {"errors": [{"param": "pod.gpuCount", "details": "Input should be greater than 0"}]}
MISSING_FIELD = {"detail": "Missing field: max_price not specified"}
NOT_FOUND = {"detail": "Pod not found"}

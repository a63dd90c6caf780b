"""Lambda Cloud API v1 bodies, shaped as the vendor's OpenAPI 1.10.0 documents them
(tests/fixtures/openapi/lambda/lambda-labs-openapi.json; texts are the schemas' defaults and
examples). test_contract.py validates every one against that document."""

from __future__ import annotations

import copy
from typing import Any

BASE_URL = "https://lambda.test"
API = f"{BASE_URL}/api/v1"
API_KEY = "secret-lambda-key-0123456789"  # fake; asserted never to leak


def instance_type(
    name: str, description: str, gpu: str, cents: int, vcpus: int, memory: int, disk: int, gpus: int
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "gpu_description": gpu,
        "price_cents_per_hour": cents,
        "specs": {"vcpus": vcpus, "memory_gib": memory, "storage_gib": disk, "gpus": gpus},
    }


H100_SXM = instance_type(
    "gpu_8x_h100_sxm5", "8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 2392, 208, 1800, 22528, 8
)
H100_GDR = instance_type(
    "gpu_8x_h100_sxm5gdr", "8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 3592, 208, 1800, 24780, 8
)
A100 = instance_type(
    "gpu_8x_example",
    "8x Example GPU (40 GB SXM4)",
    "Example GPU (40 GB SXM4)",
    1592,
    124,
    1800,
    6144,
    8,
)
A10 = instance_type("gpu_1x_a10", "1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 75, 30, 200, 1400, 1)
CPU = instance_type("cpu_4x_general", "4x vCPU", "", 20, 4, 16, 64, 0)


def region(name: str) -> dict[str, str]:
    descriptions = {
        "us-east-3": "Washington DC, USA",
        "us-south-2": "Texas, USA",
        "us-west-1": "California, USA",
        "us-east-1": "Virginia, USA",
    }
    return {"name": name, "description": descriptions.get(name, name)}


def types_item(kind: dict[str, Any], regions: list[str]) -> dict[str, Any]:
    return {
        "instance_type": copy.deepcopy(kind),
        "regions_with_capacity_available": [region(name) for name in regions],
    }


# GET /instance-types `data`: two H100 types with capacity, one type with none, a small A10, a
# CPU-only type.
INSTANCE_TYPES: dict[str, Any] = {
    "gpu_8x_h100_sxm5": types_item(H100_SXM, ["us-east-3", "us-south-2"]),
    "gpu_8x_h100_sxm5gdr": types_item(H100_GDR, ["us-west-1"]),
    "gpu_8x_example": types_item(A100, []),
    "gpu_1x_a10": types_item(A10, ["us-east-1", "us-west-1"]),
    "cpu_4x_general": types_item(CPU, ["us-east-1"]),
}


def actions(available: bool = True) -> dict[str, Any]:
    detail: dict[str, Any] = {"available": available}
    if not available:
        detail |= {
            "reason_code": "vm-has-not-launched",
            "reason_description": "The instance has not launched yet.",
        }
    names = ("migrate", "rebuild", "restart", "cold_reboot", "terminate")
    return {name: dict(detail) for name in names}


def instance(
    instance_id: str,
    *,
    name: str | None = None,
    status: str = "active",
    region_name: str = "us-east-3",
    ip: str | None = "198.51.100.2",
    kind: dict[str, Any] = H100_SXM,
    tags: list[dict[str, str]] | None = None,
    ssh_key_names: list[str] | None = None,
) -> dict[str, Any]:
    """One Instance object (required fields plus what a running instance shows)."""
    body: dict[str, Any] = {
        "id": instance_id,
        "status": status,
        "ssh_key_names": ssh_key_names if ssh_key_names is not None else ["ops-team"],
        "file_system_names": [],
        "region": region(region_name),
        "instance_type": copy.deepcopy(kind),
        "actions": actions(status == "active"),
        "tags": tags or [],
    }
    if name is not None:
        body["name"] = name
    if ip is not None:
        body |= {"ip": ip, "private_ip": "10.0.2.100", "hostname": ip.replace(".", "-")}
    return body


def ssh_key(key_id: str, name: str, public_key: str) -> dict[str, str]:
    return {"id": key_id, "name": name, "public_key": public_key}


USER_KEY = ssh_key(
    "ddf9a910ceb744a0bb95242cbba6cb50",
    "ops-team",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICN+lJwsONkwrdsSnQsu1ydUkIuIg5oOC+Eslvmtt60T noname",
)
VM_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGd0eXBlc2FmZXZtcGVydm1rZXlmb3J0ZXN0cw vm"


def image(image_id: str, family: str, region_name: str) -> dict[str, Any]:
    return {
        "id": image_id,
        "created_time": "2025-04-01T10:30:45.123456Z",
        "updated_time": "2025-04-01T10:30:45.123456Z",
        "name": f"{family}-2025-04",
        "description": "Lambda Stack on Ubuntu LTS",
        "family": family,
        "version": "2025.04",
        "architecture": "x86_64",
        "region": region(region_name),
    }


IMAGES = [
    image("43336648-096d-4cba-9aa2-f9bb7727639d", "lambda-stack-24-04", "us-east-3"),
    image("7fa3b5d6-5a1c-4d2e-9f0e-1b2c3d4e5f60", "lambda-stack-24-04", "us-south-2"),
    image("0b8f2a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b", "ubuntu-24-04", "us-south-2"),
]


def error(code: str, message: str, suggestion: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if suggestion is not None:
        body["suggestion"] = suggestion
    return {"error": body}


INSUFFICIENT_CAPACITY = error(
    "instance-operations/launch/insufficient-capacity",
    "Not enough capacity to fulfill launch request.",
)
QUOTA_EXCEEDED = error(
    "global/quota-exceeded", "Quota exceeded.", "Contact Support to increase your quota."
)
INVALID_PARAMETERS = error("global/invalid-parameters", "Invalid request data.")
LAUNCH_RESOURCE_MISSING = error(
    "global/object-does-not-exist",
    "Specified SSH key does not exist.",
    "Check the name of the SSH key and try again.",
)
FILE_SYSTEM_WRONG_REGION = error(
    "instance-operations/launch/file-system-in-wrong-region",
    "The file system is in a different region than the instance.",
)
INSTANCE_NOT_FOUND = error("global/object-does-not-exist", "Specified instance does not exist.")
NOT_FOUND = error("global/not-found", "The requested resource was not found.")
INVALID_API_KEY = error(
    "global/invalid-api-key",
    "API key was invalid, expired, or deleted.",
    "Check your API key or create a new one, then try again.",
)
FORBIDDEN = error("global/forbidden", "You do not have permission to perform this action.")
ACCOUNT_INACTIVE = error(
    "global/account-inactive",
    "Your account is inactive.",
    "Make sure you have verified your email address and have a valid payment method. "
    "Contact Support if problems continue.",
)
INVALID_ADDRESS = error(
    "global/invalid-address",
    "Your billing address is invalid.",
    "Make sure your billing address is valid. Contact Support if problems continue.",
)
CONFLICT = error("global/conflict", "The request conflicts with the current state of the resource.")
INTERNAL = error(
    "global/internal-error",
    "An internal server error occurred.",
    "Try again later. Contact Support if the problem persists.",
)
PROVIDER_UNAVAILABLE = error(
    "provider/internal-unavailable", "Provider unavailable", "Try again shortly"
)

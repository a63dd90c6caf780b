"""Vast.ai response bodies as the API documents them (tests/fixtures/openapi/vast/yaml/*.yaml):
the field names, types and example values of search_offers, create_instance, show_instances
and destroy_instance, with our own ids, labels and prices laid over them."""

from __future__ import annotations

import copy
from typing import Any

BASE_URL = "https://vast.test"
API_KEY = "vast-test-key-0123456789abcdef"

# One listing: search_offers.yaml's 200 example (as a list element, as its schema says).
_LISTING: dict[str, Any] = {
    "id": 12345678,
    "ask_contract_id": 12345678,
    "bundle_id": 987654321,
    "bw_nvlink": 0,
    "compute_cap": 900,
    "cpu_arch": "amd64",
    "cpu_cores": 64,
    "cpu_cores_effective": 32,
    "cpu_ghz": 2.99,
    "cpu_name": "QuantumX 128-Core Processor",
    "cpu_ram": 65536,
    "cuda_max_good": 11.2,
    "direct_port_count": 42,
    "disk_bw": 1234.5,
    "disk_space": 2048.5,
    "dlperf": 222.22,
    "dph_base": 0.123456,
    "dph_total": 0.234567,
    "driver_version": "999.99.99",
    "geolocation": "Atlantis, AT",
    "gpu_arch": "nvidia",
    "gpu_name": "Imaginary RTX 9999",
    "gpu_ram": 24576,
    "gpu_total_ram": 49152,
    "host_id": 55555,
    "inet_down": 9876.5,
    "inet_down_cost": 0.00123,
    "inet_up": 8765.4,
    "inet_up_cost": 0.00456,
    "is_bid": False,
    "machine_id": 88888,
    "min_bid": 0.111111,
    "num_gpus": 4,
    "public_ipaddr": "203.0.113.42",
    "reliability": 0.9999,
    "reliability2": 0.9999,
    "rentable": True,
    "rented": False,
    "static_ip": True,
    "storage_cost": 0.987654,
    "verification": "verified",
    "verified": True,
}


def listing(ask_id: int, **fields: Any) -> dict[str, Any]:
    """A listing with our own id and whatever fields the test sets."""
    body = copy.deepcopy(_LISTING)
    body.update(id=ask_id, ask_contract_id=ask_id, **fields)
    return body


def h100_listing(ask_id: int, dph_total: float, **fields: Any) -> dict[str, Any]:
    """An 8 x H100 SXM listing in the US (what the job tests ask for)."""
    values: dict[str, Any] = dict(
        gpu_name="H100 SXM",
        num_gpus=8,
        gpu_ram=81559,
        cpu_cores=128,
        cpu_cores_effective=128,
        cpu_ram=1031865,
        disk_space=1500.0,
        dph_total=dph_total,
        geolocation="Texas, US",
    )
    values.update(fields)
    return listing(ask_id, **values)


# One instance: show_instances.yaml's item example, trimmed to what we read plus neighbours.
_INSTANCE: dict[str, Any] = {
    "id": 312,
    "actual_status": "running",
    "cur_state": "running",
    "next_state": "running",
    "intended_status": "running",
    "label": "ML Training Job 2025",
    "image_uuid": "vastai/base-image:@vastai-automatic-tag",
    "image_runtype": "ssh_direc ssh_proxy",
    "status_msg": "success, running vastai/base-image/ssh",
    "public_ipaddr": "192.0.2.45",
    "local_ipaddrs": "10.0.0.5 172.17.0.2",
    "ssh_host": "ssh123.vast.ai",
    "ssh_idx": "6",
    "ssh_port": 10600,
    "machine_id": 12,
    "start_date": 1668804745.1223178,
    "gpu_name": "H100 SXM",
    "num_gpus": 8,
    "direct_port_count": 1001,
    "direct_port_start": 20000,
    "direct_port_end": 20002,
    "ports": {
        "8888/tcp": [{"HostIp": "0.0.0.0", "HostPort": "8888"}],
        "22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "20000"}],
    },
    "geolocation": "California, United States",
    "verification": "verified",
    "dph_base": 0.8,
    "dph_total": 0.8021,
}


def instance(instance_id: int, label: str | None, **fields: Any) -> dict[str, Any]:
    body = copy.deepcopy(_INSTANCE)
    body.update(id=instance_id, label=label, **fields)
    return body


def booting(instance_id: int, label: str | None, **fields: Any) -> dict[str, Any]:
    """Just created: no status yet, no port mapping (ports is only present when running)."""
    values: dict[str, Any] = dict(
        actual_status="loading", cur_state="running", status_msg=None, ports=None
    )
    values.update(fields)
    return instance(instance_id, label, **values)


def page(instances: list[dict[str, Any]], next_token: str | None = None) -> dict[str, Any]:
    """One page of GET /api/v1/instances/."""
    return {
        "success": True,
        "instances_found": len(instances),
        "total_instances": len(instances),
        "next_token": next_token,
        "instances": instances,
    }


# Error bodies exactly as create_instance.yaml and destroy_instance.yaml document them.
NO_SUCH_ASK_404 = {
    "success": False,
    "error": "invalid_args",
    "msg": "error 404/3603: no_such_ask Instance type by id 1234567 is not available.",
    "ask_id": 1234567,
}
NO_SUCH_ASK_410 = {
    "success": False,
    "error": "no_such_ask",
    "msg": "error 410/3907: no_such_ask Instance type 1234567 is no longer available.",
    "ask_id": 1234567,
}
INVALID_ARGS_400 = {
    "success": False,
    "error": "invalid_args",
    "msg": "error 400/3467: Invalid args: 'id' is required and must be a valid offer ID",
    "ask_id": 1234567,
}
NOT_YOUR_OWN_403 = {
    "success": False,
    "error": "invalid_args",
    "msg": "error 403/3586: Offer 1234567 is not your own. Hosts can only rent their own machines.",
    "ask_id": 1234567,
}
AUTH_ERROR_401 = {"success": False, "error": "auth_error", "msg": "Invalid user key"}
TOO_FREQUENT_TEXT = "API requests too frequent endpoint threshold=4.5"
TOO_FREQUENT_429 = {"detail": "API requests too frequent endpoint threshold=4.5"}
DESTROY_NOT_FOUND_404 = {"success": False, "error": "not_found", "msg": "Instance not found"}
DESTROY_RATE_LIMITED_429 = {
    "success": False,
    "error": "rate_limit_exceeded",
    "msg": "API requests too frequent endpoint threshold=3.0",
}
DESTROYED = {"success": True, "msg": "Instance destroyed successfully"}
LIST_BAD_TOKEN_400 = {"error": "invalid_token", "msg": "Invalid after_token"}

"""Compute Engine response bodies in their documented shapes (error format of
cloud.google.com/compute/docs/api/how-tos/api-requests-responses and operations-quota, the
Operation and Instance resources of the v1 REST reference, resource-error troubleshooting)."""

from __future__ import annotations

from typing import Any

PROJECT = "gpuprov-test"
LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}"
ZONE = "us-central1-a"
NAME = "gpuprov-train-a1-n0-ce4389"
VM = "train-a1-n0-ce4389"


def http_error(code: int, reason: str, message: str, domain: str = "global") -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": domain, "reason": reason}],
        }
    }


RATE_LIMITED = {  # operations-quota: concurrent operations over the limit
    "error": {
        "code": 403,
        "message": "Rate Limit Exceeded",
        "errors": [
            {
                "message": "Rate Limit Exceeded",
                "domain": "usageLimits",
                "reason": "rateLimitExceeded",
            }
        ],
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "CONCURRENT_OPERATIONS_QUOTA_EXCEEDED",
                "domain": "compute.googleapis.com",
                "metadata": {
                    "containerType": "PROJECT",
                    "containerId": PROJECT,
                    "quotaMetric": "compute.googleapis.com/instances_insert_requests",
                    "location": "us-central1",
                },
            }
        ],
    }
}
QUOTA_403 = http_error(
    403,
    "quotaExceeded",
    "Quota 'NVIDIA_H100_GPUS' exceeded. Limit: 0.0 in region us-central1.",
    "usageLimits",
)
GPUS_ALL_REGIONS_403 = http_error(
    403, "quotaExceeded", "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.", "usageLimits"
)
FORBIDDEN = http_error(
    403, "forbidden", "Required 'compute.instances.create' permission for 'projects/gpuprov-test'"
)
API_DISABLED = {
    "error": {
        "code": 403,
        "message": "Compute Engine API has not been used in project 123 before or it is disabled.",
        "errors": [
            {
                "message": "Compute Engine API has not been used in project 123 before or it is "
                "disabled.",
                "domain": "usageLimits",
                "reason": "accessNotConfigured",
                "extendedHelp": "https://console.developers.google.com",
            }
        ],
        "status": "PERMISSION_DENIED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "SERVICE_DISABLED",
                "domain": "googleapis.com",
                "metadata": {"service": "compute.googleapis.com", "consumer": "projects/123"},
            }
        ],
    }
}
UNAUTHENTICATED = {
    "error": {
        "code": 401,
        "message": "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        "errors": [
            {
                "message": "Invalid Credentials",
                "domain": "global",
                "reason": "authError",
                "location": "Authorization",
                "locationType": "header",
            }
        ],
        "status": "UNAUTHENTICATED",
    }
}
NOT_FOUND_INSTANCE = http_error(
    404,
    "notFound",
    f"The resource 'projects/{PROJECT}/zones/{ZONE}/instances/{NAME}' was not found",
)
NOT_FOUND_MACHINE_TYPE = http_error(
    404,
    "notFound",
    f"The resource 'projects/{PROJECT}/zones/{ZONE}/machineTypes/a3-highgpu-9g' was not found",
)
ALREADY_EXISTS = http_error(
    409,
    "alreadyExists",
    f"The resource 'projects/{PROJECT}/zones/{ZONE}/instances/{NAME}' already exists",
)
INVALID = http_error(
    400, "invalid", "Invalid value for field 'resource.machineType': 'zones/us-central1-a/x'."
)
BACKEND_ERROR = http_error(503, "backendError", "Backend Error")
TOO_MANY = http_error(429, "rateLimitExceeded", "Too Many Requests", "usageLimits")
RESOURCE_NOT_READY = http_error(
    400, "resourceNotReady", f"The resource 'projects/{PROJECT}/global/firewalls/x' is not ready"
)


def operation(status: str, name: str = "operation-1724150000000-61f-a1b2-c3d4", **extra: Any):
    body = {
        "kind": "compute#operation",
        "id": "7203940221634419851",
        "name": name,
        "zone": f"{LINK}/zones/{ZONE}",
        "operationType": "insert",
        "targetLink": f"{LINK}/zones/{ZONE}/instances/{NAME}",
        "targetId": "4567890123456789012",
        "status": status,
        "user": "gpuprov@gpuprov-test.iam.gserviceaccount.com",
        "progress": 100 if status == "DONE" else 0,
        "insertTime": "2026-08-20T10:00:00.000-07:00",
        "startTime": "2026-08-20T10:00:00.400-07:00",
        "selfLink": f"{LINK}/zones/{ZONE}/operations/{name}",
    }
    body.update(extra)
    return body


def failed_operation(code: str, message: str, **extra: Any) -> dict[str, Any]:
    error = {"code": code, "message": message, **extra}
    return operation(
        "DONE",
        error={"errors": [error]},
        httpErrorStatusCode=403 if code == "QUOTA_EXCEEDED" else 503,
        httpErrorMessage="FORBIDDEN" if code == "QUOTA_EXCEEDED" else "SERVICE UNAVAILABLE",
        endTime="2026-08-20T10:00:09.000-07:00",
    )


STOCKOUT_OPERATION = failed_operation(
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later.",
)
STOCKOUT_DETAILS_OPERATION = failed_operation(
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources available to "
    "fulfill the request. '(resource type:compute)'.",
    errorDetails=[
        {
            "errorInfo": {
                "reason": "resource_availability",
                "domain": "compute.googleapis.com",
                "metadatas": {"zone": ZONE, "vmType": "a3-highgpu-8g", "zonesAvailable": ""},
            }
        },
        {
            "localizedMessage": {
                "locale": "en-US",
                "message": "An a3-highgpu-8g VM instance is currently unavailable in the "
                f"{ZONE} zone.",
            }
        },
    ],
)
GPUS_ALL_REGIONS_OPERATION = failed_operation(
    "QUOTA_EXCEEDED",
    "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
    errorDetails=[
        {
            "quotaInfo": {
                "metricName": "compute.googleapis.com/gpus_all_regions",
                "limitName": "GPUS-ALL-REGIONS-per-project",
                "limit": 0,
            }
        }
    ],
)
REGION_QUOTA_OPERATION = failed_operation(
    "QUOTA_EXCEEDED",
    "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
    errorDetails=[
        {
            "quotaInfo": {
                "metricName": "compute.googleapis.com/nvidia_h100_gpus",
                "limitName": "NVIDIA-H100-GPUS-per-project-region",
                "dimensions": {"region": "us-central1"},
                "limit": 0,
            }
        }
    ],
)
PREEMPTED_WHILE_CREATED = failed_operation(
    "UNSUPPORTED_OPERATION",
    "Instance was preempted during creation.",
)
RATE_OPERATION = failed_operation(
    "RESOURCE_OPERATION_RATE_EXCEEDED",
    f"Operation rate exceeded for resource 'projects/{PROJECT}/zones/{ZONE}/instances/{NAME}'.",
)
IMAGE_NOT_FOUND_OPERATION = failed_operation(
    "RESOURCE_NOT_FOUND",
    f"The resource 'projects/{PROJECT}/global/images/family/nope' was not found",
)
EXISTS_OPERATION = failed_operation(
    "RESOURCE_ALREADY_EXISTS",
    f"The resource 'projects/{PROJECT}/zones/{ZONE}/instances/{NAME}' already exists",
)


def instance(status: str = "RUNNING", nat_ip: str | None = "34.118.0.10", **extra: Any):
    access = {"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "External NAT"}
    if nat_ip:
        access["natIP"] = nat_ip
        access["networkTier"] = "PREMIUM"
    body = {
        "kind": "compute#instance",
        "id": "4567890123456789012",
        "creationTimestamp": "2026-08-20T10:00:00.000-07:00",
        "name": NAME,
        "tags": {"items": [NAME], "fingerprint": "6smc4R4d39I="},
        "machineType": f"{LINK}/zones/{ZONE}/machineTypes/a3-highgpu-8g",
        "status": status,
        "zone": f"{LINK}/zones/{ZONE}",
        "canIpForward": False,
        "networkInterfaces": [
            {
                "kind": "compute#networkInterface",
                "network": f"{LINK}/global/networks/default",
                "subnetwork": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/regions/"
                "us-central1/subnetworks/default",
                "networkIP": "10.128.0.7",
                "name": "nic0",
                "accessConfigs": [access],
                "fingerprint": "zK6mJ5bTmGk=",
                "stackType": "IPV4_ONLY",
            }
        ],
        "disks": [
            {
                "kind": "compute#attachedDisk",
                "type": "PERSISTENT",
                "mode": "READ_WRITE",
                "source": f"{LINK}/zones/{ZONE}/disks/{NAME}",
                "deviceName": "persistent-disk-0",
                "index": 0,
                "boot": True,
                "autoDelete": True,
                "diskSizeGb": "200",
            }
        ],
        "metadata": {
            "kind": "compute#metadata",
            "fingerprint": "pN4Lh3F5t6E=",
            "items": [
                {"key": "gpuprov-vm", "value": VM},
                {"key": "user-data", "value": "GPUPROV_JOIN_TOKEN=secret-join-token"},
            ],
        },
        "selfLink": f"{LINK}/zones/{ZONE}/instances/{NAME}",
        "scheduling": {
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": True,
            "preemptible": False,
            "provisioningModel": "STANDARD",
        },
        "cpuPlatform": "Intel Sapphire Rapids",
        "labels": {"gpuprov_vm": VM, "gpuprov_job": "train"},
        "labelFingerprint": "42WmSpB8rSM=",
        "startRestricted": False,
        "deletionProtection": False,
        "fingerprint": "lk9kJzOOCjI=",
        "lastStartTimestamp": "2026-08-20T10:00:40.000-07:00",
    }
    body.update(extra)
    return body

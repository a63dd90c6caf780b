"""EC2 (Price List, SSM) error codes -> ErrorKind: one table, read by code, never by HTTP status.

AWS answers a stockout with HTTP 500 `InsufficientInstanceCapacity` (and SDKs retry it unless
told not to), so a 5xx is Transient only when its code is unknown. Codes are from the EC2 API
error reference and docs/clouds reference section 5; a code ending in `.*` matches every code
with that prefix (`InvalidAMIID.NotFound`, `InvalidAMIID.Malformed`, ...).

Codes a primitive treats as success (a `...Duplicate` in prepare, a `...NotFound` when deleting)
are not here: the caller names them (`ok_codes`), because what they mean depends on the call.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import aiohttp
from botocore import exceptions as boto
from botocore.parsers import ResponseParserError

from providers.errors import ErrorKind, ProviderError

T, C, Q, U, F, I, K = (  # noqa: E741  (short names keep the table readable)
    ErrorKind.TRANSIENT,
    ErrorKind.CAPACITY,
    ErrorKind.QUOTA,
    ErrorKind.UNAVAILABLE,
    ErrorKind.FAILED,
    ErrorKind.INVALID_REQUEST,
    ErrorKind.CREDENTIALS,
)

_PARAMETER = re.compile(r"parameter ([A-Za-z0-9_.\[\]]+)")

CODES: dict[str, ErrorKind] = {
    # stockouts: block this offer, try the next
    "InsufficientInstanceCapacity": C,  # HTTP 500; the message names AZs that have capacity
    "InsufficientHostCapacity": C,
    "InsufficientCapacity": C,
    "InsufficientReservedInstanceCapacity": C,
    "SpotMaxPriceTooLow": C,
    # not viable here, nothing created
    "Unsupported": U,  # the type is not offered in that AZ
    "InvalidInstanceType": U,  # the type does not exist in this region
    "InsufficientFreeAddressesInSubnet": U,
    # account limits: block the region
    "VcpuLimitExceeded": Q,
    "InstanceLimitExceeded": Q,
    "MaxSpotInstanceCountExceeded": Q,
    "ResourceLimitExceeded": Q,
    "SecurityGroupLimitExceeded": Q,
    "RulesPerSecurityGroupLimitExceeded": Q,
    "VolumeLimitExceeded": Q,
    "PendingVerification": Q,  # a new account not yet cleared for this region
    # retry the step
    "RequestLimitExceeded": T,  # HTTP 503 throttling
    "Throttling": T,
    "ThrottlingException": T,  # Price List API
    "InternalError": T,
    "InternalFailure": T,
    "InternalErrorException": T,
    "ServiceUnavailable": T,
    "ServiceUnavailableException": T,
    "Unavailable": T,
    "RequestTimeout": T,
    "RequestTimeoutException": T,
    "RequestExpired": T,  # clock skew; signing again fixes it
    "DependencyViolation": T,  # security group still attached while the instance terminates
    "IncorrectState": T,
    "ConcurrentTagAccess": T,
    # authentication and authorisation: abort
    "AuthFailure": K,
    "UnauthorizedOperation": K,
    "Blocked": K,
    "InvalidClientTokenId": K,
    "SignatureDoesNotMatch": K,
    "IncompleteSignature": K,
    "MissingAuthenticationToken": K,
    "OptInRequired": K,  # the region (or the service) is not enabled for the account
    "AccessDenied": K,
    "AccessDeniedException": K,
    "UnrecognizedClientException": K,
    "ExpiredToken": K,
    "ExpiredTokenException": K,
    "AuthFailure.ServiceLinkedRoleCreationNotPermitted": K,
    # the ask cannot be satisfied: abort
    "InvalidParameterValue": I,
    "InvalidParameterCombination": I,
    "InvalidParameter": I,
    "MissingParameter": I,
    "UnknownParameter": I,
    "ValidationError": I,
    "InvalidParameterException": I,  # Price List API
    "InvalidAMIID.*": I,
    "ParameterNotFound": I,  # SSM: a `resolve:ssm:` image names no parameter in the region
    "ParameterVersionNotFound": I,
    "InvalidKeyPair.*": I,
    "InvalidBlockDeviceMapping": I,
    "InvalidUserData.Malformed": I,
    "InvalidGroup.NotFound": I,
    "InvalidSubnetID.NotFound": I,
    "InvalidInstanceID.Malformed": I,
    "InvalidFilter": I,
    "UnsupportedOperation": I,
    "VPCIdNotSpecified": I,  # the account has no default VPC
    "VPCResourceNotSpecified": I,
    # a same-token request with other parameters: something may exist under that token
    "IdempotentParameterMismatch": F,
}

# RunInstances right after prepare may not see the new security group or key pair yet
# (EC2 is eventually consistent): retrying the step is the documented remedy.
RUN_INSTANCES_OVERRIDES: dict[str, ErrorKind] = {
    "InvalidGroup.NotFound": T,
    "InvalidKeyPair.NotFound": T,
}
OVERRIDES: dict[str, dict[str, ErrorKind]] = {"RunInstances": RUN_INSTANCES_OVERRIDES}


def kind_for(code: str, status: int | None, operation: str) -> ErrorKind:
    """The kind of an AWS error code (then its prefix); unknown codes by status and call."""
    kind = OVERRIDES.get(operation, {}).get(code) or CODES.get(code)
    if kind is None and "." in code:
        kind = CODES.get(code.split(".", 1)[0] + ".*")
    if kind is not None:
        return kind
    if status is not None and status >= 500:
        return T
    if status in (401, 403):
        return K
    if status == 429:
        return T
    # An unknown 4xx (or no status): nothing says it is safe, and RunInstances may have
    # launched something: Failed tears the attempt down and moves to the next offer.
    return F


def error_code(error: boto.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code") or "")


def from_client_error(error: boto.ClientError, operation: str) -> ProviderError:
    """A ProviderError carrying the cloud's own words: `<Code>: <Message>` (request id)."""
    response: Mapping[str, Any] = error.response or {}
    details = response.get("Error") or {}
    metadata = response.get("ResponseMetadata") or {}
    code = str(details.get("Code") or "")
    message = str(details.get("Message") or "")
    status = metadata.get("HTTPStatusCode")
    status = status if isinstance(status, int) else None
    kind = kind_for(code, status, operation)
    words = f"{operation}: {code or f'HTTP {status}'}: {message}".rstrip(": ")
    if request_id := metadata.get("RequestId"):
        words += f" (request {request_id})"
    return ProviderError(kind, words, retry_after=_retry_after(metadata.get("HTTPHeaders")))


def from_exception(error: BaseException, operation: str) -> ProviderError:
    """Any failure of one call -> ProviderError; the SDK's wording, never its parameters."""
    if isinstance(error, ProviderError):
        return error
    if isinstance(error, boto.ClientError):
        return from_client_error(error, operation)
    kind = _exception_kind(error)
    if isinstance(error, boto.ParamValidationError):
        # botocore quotes the offending values, and user data carries a join token: name the
        # parameters only.
        names = sorted(set(_PARAMETER.findall(str(error))))
        return ProviderError(kind, f"{operation}: invalid parameters: {', '.join(names)}")
    return ProviderError(kind, f"{operation}: {type(error).__name__}: {error}")


def _exception_kind(error: BaseException) -> ErrorKind:
    credentials = (
        boto.NoCredentialsError,
        boto.PartialCredentialsError,
        boto.ProfileNotFound,
        boto.CredentialRetrievalError,
        boto.NoRegionError,
        boto.UnauthorizedSSOTokenError,
        boto.SSOTokenLoadError,
    )
    if isinstance(error, credentials):
        return K
    if isinstance(error, boto.ParamValidationError):
        return I
    # The network, a timeout, or a reply the SDK could not read (a truncated body): the core
    # retries, and a create it retries observes first, so a launch that landed is adopted.
    network = (
        boto.HTTPClientError,
        boto.ConnectionError,  # botocore's own: EndpointConnectionError, ConnectTimeoutError
        ResponseParserError,
        aiohttp.ClientError,
        asyncio.TimeoutError,
        OSError,  # includes TimeoutError and ConnectionError
    )
    if isinstance(error, network):
        return T
    return F


def _retry_after(headers: Any) -> float | None:
    """EC2 sends no Retry-After; honour one if a proxy or another AWS service does."""
    if not isinstance(headers, Mapping):
        return None
    raw = headers.get("retry-after") or headers.get("Retry-After")
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        return None
    return seconds if 0 <= seconds <= 3600 else None

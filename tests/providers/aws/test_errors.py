"""The AWS error table: recorded EC2 error documents, parsed by botocore exactly as the client
parses them, classified by code (never by HTTP status alone)."""

from __future__ import annotations

import pytest
from botocore import exceptions as boto
from botocore.parsers import ResponseParserError, create_parser
from botocore.session import get_session

from providers.aws.errors import from_client_error, from_exception, kind_for
from providers.errors import ErrorKind
from tests.providers.aws.stack import recorded

EC2_MODEL = get_session().get_service_model("ec2")


def client_error(
    fixture: str, status: int, operation: str = "RunInstances", **values: str
) -> boto.ClientError:
    """What aiobotocore raises for this recorded body and status."""
    parsed = create_parser("ec2").parse(
        {"status_code": status, "headers": {}, "body": recorded(fixture, **values)},
        EC2_MODEL.operation_model(operation).output_shape,
    )
    return boto.ClientError(parsed, operation)


@pytest.mark.parametrize(
    ("fixture", "status", "kind"),
    [
        ("insufficient_instance_capacity.xml", 500, ErrorKind.CAPACITY),
        ("vcpu_limit_exceeded.xml", 400, ErrorKind.QUOTA),
        ("max_spot_instance_count_exceeded.xml", 400, ErrorKind.QUOTA),
        ("unsupported.xml", 400, ErrorKind.UNAVAILABLE),
        ("request_limit_exceeded.xml", 503, ErrorKind.TRANSIENT),
        ("internal_error.xml", 500, ErrorKind.TRANSIENT),
        ("auth_failure.xml", 401, ErrorKind.CREDENTIALS),
        ("unauthorized_operation.xml", 403, ErrorKind.CREDENTIALS),
        ("invalid_ami_not_found.xml", 400, ErrorKind.INVALID_REQUEST),
        ("idempotent_parameter_mismatch.xml", 400, ErrorKind.FAILED),
    ],
)
def test_recorded_error_documents_are_classified_by_their_code(fixture, status, kind):
    error = from_client_error(client_error(fixture, status), "RunInstances")
    assert error.kind is kind


def test_a_stockout_is_capacity_although_it_arrives_as_http_500():
    stockout = client_error("insufficient_instance_capacity.xml", 500)
    error = from_client_error(stockout, "RunInstances")
    assert error.kind is ErrorKind.CAPACITY
    # The cloud's own words reach the user: code, message (with the zones that have capacity)
    assert error.message.startswith("RunInstances: InsufficientInstanceCapacity: We currently")
    assert "choosing us-east-1b" in error.message
    assert "(request 8f7bd7a1-3c1e-4a53-9a4b-1a0b2c3d4e5f)" in error.message


# the error codes as AWS documents them (docs/clouds/aws.md), written out independently of the
# table
DOCUMENTED = {
    "InsufficientInstanceCapacity": ErrorKind.CAPACITY,
    "InsufficientHostCapacity": ErrorKind.CAPACITY,
    "InsufficientCapacity": ErrorKind.CAPACITY,
    "Unsupported": ErrorKind.UNAVAILABLE,
    "VcpuLimitExceeded": ErrorKind.QUOTA,
    "InstanceLimitExceeded": ErrorKind.QUOTA,
    "MaxSpotInstanceCountExceeded": ErrorKind.QUOTA,
    "RequestLimitExceeded": ErrorKind.TRANSIENT,
    "InternalError": ErrorKind.TRANSIENT,
    "Unavailable": ErrorKind.TRANSIENT,
    "DependencyViolation": ErrorKind.TRANSIENT,
    "AuthFailure": ErrorKind.CREDENTIALS,
    "UnauthorizedOperation": ErrorKind.CREDENTIALS,
    "Blocked": ErrorKind.CREDENTIALS,
    "InvalidClientTokenId": ErrorKind.CREDENTIALS,
    "SignatureDoesNotMatch": ErrorKind.CREDENTIALS,
    "OptInRequired": ErrorKind.CREDENTIALS,
    "InvalidParameterValue": ErrorKind.INVALID_REQUEST,
    "InvalidParameterCombination": ErrorKind.INVALID_REQUEST,
    "InvalidAMIID.NotFound": ErrorKind.INVALID_REQUEST,
    "InvalidAMIID.Malformed": ErrorKind.INVALID_REQUEST,
    "InvalidAMIID.Unavailable": ErrorKind.INVALID_REQUEST,
    "InvalidKeyPair.NotFound": ErrorKind.INVALID_REQUEST,
    # a same-token request with other parameters may have made something
    "IdempotentParameterMismatch": ErrorKind.FAILED,
}


@pytest.mark.parametrize(("code", "kind"), sorted(DOCUMENTED.items()))
def test_every_documented_code_has_its_kind_whatever_the_status(code, kind):
    for status in (400, 500, 503):
        assert kind_for(code, status, "DescribeImages") is kind


@pytest.mark.parametrize(
    ("status", "kind"),
    [(500, ErrorKind.TRANSIENT), (503, ErrorKind.TRANSIENT), (429, ErrorKind.TRANSIENT)]
    + [(401, ErrorKind.CREDENTIALS), (403, ErrorKind.CREDENTIALS), (400, ErrorKind.FAILED)]
    + [(None, ErrorKind.FAILED)],
)
def test_unknown_codes_fall_back_on_the_status_and_never_claim_nothing_was_made(status, kind):
    assert kind_for("SomethingNew", status, "RunInstances") is kind


def test_a_new_group_or_key_not_yet_visible_to_run_instances_is_retried_not_aborted():
    # EC2 is eventually consistent: RunInstances right after prepare may not see them yet.
    for code in ("InvalidGroup.NotFound", "InvalidKeyPair.NotFound"):
        assert kind_for(code, 400, "RunInstances") is ErrorKind.TRANSIENT
        assert kind_for(code, 400, "DescribeSecurityGroups") is ErrorKind.INVALID_REQUEST


def test_retry_after_is_honoured_when_a_proxy_sends_one():
    error = client_error("request_limit_exceeded.xml", 503)
    error.response["ResponseMetadata"]["HTTPHeaders"] = {"retry-after": "7"}
    assert from_client_error(error, "DescribeInstances").retry_after == 7.0
    error.response["ResponseMetadata"]["HTTPHeaders"] = {"retry-after": "soon"}
    assert from_client_error(error, "DescribeInstances").retry_after is None


@pytest.mark.parametrize(
    ("exception", "kind"),
    [
        (boto.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), ErrorKind.TRANSIENT),
        (boto.ReadTimeoutError(endpoint_url="http://127.0.0.1:9"), ErrorKind.TRANSIENT),
        (boto.ConnectionClosedError(endpoint_url="http://127.0.0.1:9"), ErrorKind.TRANSIENT),
        (ResponseParserError("truncated XML"), ErrorKind.TRANSIENT),
        (TimeoutError(), ErrorKind.TRANSIENT),
        (boto.NoCredentialsError(), ErrorKind.CREDENTIALS),
        (boto.ProfileNotFound(profile="gpu"), ErrorKind.CREDENTIALS),
        (boto.ParamValidationError(report="MinCount: wrong type"), ErrorKind.INVALID_REQUEST),
        (KeyError("surprise"), ErrorKind.FAILED),
    ],
)
def test_sdk_and_network_failures_are_classified(exception, kind):
    error = from_exception(exception, "RunInstances")
    assert error.kind is kind
    assert error.message.startswith("RunInstances: ")


def test_a_rejected_parameter_is_named_but_its_value_never_repeated():
    error = boto.ParamValidationError(
        report="Invalid type for parameter UserData, value: GPUPROV_JOIN_TOKEN=s3cret, type: x"
    )
    provider_error = from_exception(error, "RunInstances")
    assert provider_error.kind is ErrorKind.INVALID_REQUEST
    assert provider_error.message == "RunInstances: invalid parameters: UserData"


def test_an_html_error_page_is_kept_whole_for_the_core_to_scrub_then_cut():
    error = client_error("error.xml", 502, code="BadGateway", message="x" * 50_000)
    provider_error = from_client_error(error, "DescribeInstances")
    assert provider_error.kind is ErrorKind.TRANSIENT
    assert "x" * 50_000 in provider_error.message

"""Classification: by errors[].reason and operation error codes, never HTTP status alone."""

from __future__ import annotations

import pytest

from providers.errors import BlockScope, ErrorKind
from providers.gce.errors import (
    HTTP_REASONS,
    OPERATION_CODES,
    GceApiError,
    http_error,
    operation_error,
    retry_after_seconds,
)
from tests.providers.gce import bodies


def classify(status: int, body: object, writes: bool = True, headers=None) -> GceApiError:
    return http_error(status, body, headers or {}, "insert x", writes)


def classify_operation(body: dict) -> GceApiError | None:
    return operation_error(body.get("error"), body.get("httpErrorStatusCode"), "insert x")


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (403, bodies.RATE_LIMITED, ErrorKind.TRANSIENT),
        (403, bodies.QUOTA_403, ErrorKind.QUOTA),
        (403, bodies.FORBIDDEN, ErrorKind.CREDENTIALS),
        (403, bodies.API_DISABLED, ErrorKind.CREDENTIALS),
        (401, bodies.UNAUTHENTICATED, ErrorKind.CREDENTIALS),
        (404, bodies.NOT_FOUND_MACHINE_TYPE, ErrorKind.INVALID_REQUEST),
        (400, bodies.INVALID, ErrorKind.INVALID_REQUEST),
        (503, bodies.BACKEND_ERROR, ErrorKind.TRANSIENT),
        (429, bodies.TOO_MANY, ErrorKind.TRANSIENT),
        (400, bodies.RESOURCE_NOT_READY, ErrorKind.TRANSIENT),
        (409, bodies.ALREADY_EXISTS, ErrorKind.FAILED),
    ],
)
def test_documented_http_errors_are_classified_by_reason(status, body, kind):
    error = classify(status, body)
    assert error.kind is kind
    assert body["error"]["message"].split()[0] in error.message  # the cloud's own words


def test_the_same_403_is_three_different_kinds_depending_on_the_reason():
    kinds = {
        classify(403, b).kind for b in (bodies.RATE_LIMITED, bodies.QUOTA_403, bodies.FORBIDDEN)
    }
    assert kinds == {ErrorKind.TRANSIENT, ErrorKind.QUOTA, ErrorKind.CREDENTIALS}


@pytest.mark.parametrize("reason", sorted(HTTP_REASONS))
def test_every_mapped_reason_decides_whatever_the_status(reason):
    for status in (400, 403, 500):
        assert classify(status, bodies.http_error(status, reason, "m")).kind is HTTP_REASONS[reason]


def test_quota_on_gpus_all_regions_blocks_the_whole_provider():
    assert classify(403, bodies.GPUS_ALL_REGIONS_403).block_scope is BlockScope.PROVIDER
    assert classify(403, bodies.QUOTA_403).block_scope is None  # a regional quota: policy default


def test_gone_and_exists_read_from_the_reason():
    assert classify(404, bodies.NOT_FOUND_INSTANCE).gone
    assert classify(409, bodies.ALREADY_EXISTS).exists
    assert not classify(403, bodies.FORBIDDEN).gone


@pytest.mark.parametrize(
    ("status", "writes", "kind"),
    [
        (401, True, ErrorKind.CREDENTIALS),
        (403, False, ErrorKind.CREDENTIALS),
        (403, True, ErrorKind.FAILED),  # an insert refused for an unknown reason: fail over
        (400, False, ErrorKind.INVALID_REQUEST),
        (400, True, ErrorKind.FAILED),
        (502, True, ErrorKind.TRANSIENT),
        (429, True, ErrorKind.TRANSIENT),
        (418, False, ErrorKind.TRANSIENT),
        (418, True, ErrorKind.FAILED),
    ],
)
def test_without_a_known_reason_the_status_and_the_kind_of_call_decide(status, writes, kind):
    assert classify(status, {"error": {"code": status, "message": "?"}}, writes).kind is kind
    assert classify(status, "<html>not json</html>", writes).kind is kind


def test_429_is_transient_and_honours_retry_after():
    error = classify(429, bodies.TOO_MANY, headers={"retry-after": "7"})
    assert (error.kind, error.retry_after) == (ErrorKind.TRANSIENT, 7.0)


def test_retry_after_reads_seconds_and_dates_and_ignores_nonsense():
    assert retry_after_seconds({"retry-after": "2.5"}) == 2.5
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after": "nan"}) is None
    assert retry_after_seconds({"retry-after": "1e9"}) == 300.0
    assert retry_after_seconds({}) is None


@pytest.mark.parametrize(
    ("body", "kind", "scope"),
    [
        (bodies.STOCKOUT_OPERATION, ErrorKind.CAPACITY, None),
        (bodies.STOCKOUT_DETAILS_OPERATION, ErrorKind.CAPACITY, None),
        (bodies.PREEMPTED_WHILE_CREATED, ErrorKind.CAPACITY, None),
        (bodies.GPUS_ALL_REGIONS_OPERATION, ErrorKind.QUOTA, BlockScope.PROVIDER),
        (bodies.REGION_QUOTA_OPERATION, ErrorKind.QUOTA, None),
        (bodies.RATE_OPERATION, ErrorKind.TRANSIENT, None),
        (bodies.IMAGE_NOT_FOUND_OPERATION, ErrorKind.INVALID_REQUEST, None),
        (bodies.EXISTS_OPERATION, ErrorKind.FAILED, None),
    ],
)
def test_documented_operation_errors_are_classified_by_code(body, kind, scope):
    error = classify_operation(body)
    assert error is not None
    assert (error.kind, error.block_scope) == (kind, scope)
    assert body["error"]["errors"][0]["code"] in error.message


@pytest.mark.parametrize("code", sorted(OPERATION_CODES))
def test_every_mapped_operation_code_decides(code):
    error = classify_operation(bodies.failed_operation(code, "m"))
    assert error is not None and error.kind is OPERATION_CODES[code]


@pytest.mark.parametrize(
    ("quota", "scope"),
    [
        ("CPUS_ALL_REGIONS", BlockScope.PROVIDER),
        ("FIREWALLS", BlockScope.PROVIDER),
        ("NVIDIA_L4_GPUS", None),
    ],
)
def test_project_wide_quotas_block_the_provider_regional_ones_do_not(quota, scope):
    body = bodies.http_error(403, "quotaExceeded", f"Quota '{quota}' exceeded. Limit: 8.0")
    assert classify(403, body).block_scope == scope


def test_gpus_all_regions_found_by_the_quota_name_when_details_are_missing():
    body = bodies.failed_operation("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded.")
    error = classify_operation(body)
    assert error is not None and error.block_scope is BlockScope.PROVIDER


def test_an_unknown_operation_error_is_failed_because_something_may_exist():
    error = classify_operation(bodies.failed_operation("SOMETHING_NEW", "what"))
    assert error is not None and error.kind is ErrorKind.FAILED


def test_an_operation_without_error_succeeded_and_an_unreadable_error_did_not():
    assert classify_operation(bodies.operation("DONE")) is None
    error = operation_error("boom", None, "insert x")
    assert error is not None and error.kind is ErrorKind.FAILED


def test_several_errors_the_most_telling_wins():
    body = bodies.operation(
        "DONE",
        error={
            "errors": [
                {"code": "RESOURCE_OPERATION_RATE_EXCEEDED", "message": "slow down"},
                {"code": "QUOTA_EXCEEDED", "message": "Quota 'CPUS' exceeded."},
            ]
        },
    )
    error = classify_operation(body)
    assert error is not None and error.kind is ErrorKind.QUOTA


def test_messages_keep_the_clouds_words_whole_for_the_core_to_scrub_then_cut():
    body = bodies.http_error(400, "invalid", "x" * 10_000)
    assert classify(400, body).message.endswith("x" * 10_000)

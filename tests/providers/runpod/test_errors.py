"""RunPod's error table: documented detail phrases first, then the status per operation."""

from __future__ import annotations

import pytest

from providers.errors import BlockScope, ErrorKind
from providers.runpod.errors import (
    CAPACITY_PHRASES,
    classify,
    parse_retry_after,
    problem_text,
)
from tests.providers.runpod import samples

CREATE = "POST /v2/pods"


@pytest.mark.parametrize(
    "body",
    [samples.STOCKOUT_400, samples.DISK_STOCKOUT_400, samples.HOST_GPUS_400],
    ids=["requested-specifications", "disk-space", "host-gpus"],
)
def test_documented_stockout_texts_on_create_are_capacity(body):
    error = classify("create", 400, body, CREATE)
    assert error.kind is ErrorKind.CAPACITY
    assert "no longer any instances" in error.message or "not enough free GPUs" in error.message


def test_dstack_variant_of_the_stockout_text_is_capacity():
    body = samples.problem(
        400,
        "Bad Request",
        "There are no longer any instances available with the request specifications. "
        "Please try again later.",
    )
    assert classify("create", 400, body, CREATE).kind is ErrorKind.CAPACITY


def test_stockout_phrase_matches_across_case_and_whitespace():
    body = samples.problem(400, "Bad Request", "THERE ARE  NO LONGER\nany instances AVAILABLE")
    assert classify("create", 400, body, CREATE).kind is ErrorKind.CAPACITY


def test_a_400_without_a_stockout_text_on_create_fails_over_as_unavailable():
    # createPod: 400 "either it breaks a cross-field rule, or this GPU and data center
    # combination could not be placed" -> "Try your next candidate".
    assert classify("create", 400, samples.RULE_400, CREATE).kind is ErrorKind.UNAVAILABLE
    assert classify("create", 400, samples.BAD_REQUEST_400, CREATE).kind is ErrorKind.UNAVAILABLE


def test_a_403_on_create_skips_the_candidate_but_a_401_stops():
    # createPod: 403 "Your account cannot access the requested pool" -> "Skip this candidate,
    # keep going"; 401 is the key itself.
    assert classify("create", 403, samples.FORBIDDEN_403, CREATE).kind is ErrorKind.UNAVAILABLE
    assert classify("create", 401, samples.UNAUTHORIZED_401, CREATE).kind is ErrorKind.CREDENTIALS


@pytest.mark.parametrize(
    ("operation", "status", "body", "kind"),
    [
        ("create", 401, samples.UNAUTHORIZED_401, ErrorKind.CREDENTIALS),
        ("read", 401, samples.UNAUTHORIZED_401, ErrorKind.CREDENTIALS),
        ("delete", 401, samples.UNAUTHORIZED_401, ErrorKind.CREDENTIALS),
        ("create", 403, samples.FORBIDDEN_403, ErrorKind.UNAVAILABLE),
        ("read", 403, samples.FORBIDDEN_403, ErrorKind.CREDENTIALS),
        ("delete", 403, samples.FORBIDDEN_403, ErrorKind.CREDENTIALS),
        ("create", 400, samples.RULE_400, ErrorKind.UNAVAILABLE),
        ("create", 402, samples.BALANCE_402, ErrorKind.QUOTA),
        ("create", 422, samples.VALIDATION_422, ErrorKind.INVALID_REQUEST),
        (
            "create",
            404,
            samples.problem(404, "Not Found", "template not found"),
            ErrorKind.INVALID_REQUEST,
        ),
        ("create", 409, samples.CLUSTER_409, ErrorKind.INVALID_REQUEST),
        ("create", 429, samples.RATE_LIMITED_429, ErrorKind.TRANSIENT),
        ("read", 429, samples.RATE_LIMITED_429, ErrorKind.TRANSIENT),
        ("create", 408, b"", ErrorKind.TRANSIENT),
        ("create", 500, samples.INTERNAL_500, ErrorKind.TRANSIENT),
        ("create", 502, samples.BAD_GATEWAY_HTML, ErrorKind.TRANSIENT),
        ("read", 500, samples.INTERNAL_500, ErrorKind.TRANSIENT),
        ("read", 503, samples.BAD_GATEWAY_HTML, ErrorKind.TRANSIENT),
        ("delete", 500, samples.INTERNAL_500, ErrorKind.TRANSIENT),
        ("read", 400, samples.RULE_400, ErrorKind.FAILED),
        ("read", 404, samples.NOT_FOUND_404, ErrorKind.FAILED),
        ("delete", 409, samples.CLUSTER_409, ErrorKind.FAILED),
        ("read", 418, b"teapot", ErrorKind.FAILED),
    ],
)
def test_status_table(operation, status, body, kind):
    assert classify(operation, status, body, "X /v2/y").kind is ErrorKind(kind)


def test_stockout_text_on_a_read_is_not_capacity():
    assert classify("read", 400, samples.STOCKOUT_400, "GET /v2/pods").kind is ErrorKind.FAILED


def test_insufficient_balance_blocks_the_whole_provider():
    error = classify("create", 402, samples.BALANCE_402, CREATE)
    assert (error.kind, error.block_scope) == (ErrorKind.QUOTA, BlockScope.PROVIDER)


def test_retry_after_is_kept_only_for_transient_errors():
    assert classify("read", 429, samples.RATE_LIMITED_429, "GET /v2/pods", 12.0).retry_after == 12
    assert classify("create", 400, samples.STOCKOUT_400, CREATE, 12.0).retry_after is None


def test_message_carries_status_operation_and_the_clouds_own_words():
    error = classify("create", 422, samples.VALIDATION_422, CREATE)
    assert error.message == (
        "RunPod 422 on POST /v2/pods: Unprocessable Entity: Request validation failed.: "
        "[$: additional properties 'bogus' not allowed]"
    )


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (samples.BAD_GATEWAY_HTML, "<html><body><h1>502 Bad Gateway</h1></body></html>"),
        (b"", "(empty body)"),
        (b"\xff\xfe not utf-8", "\ufffd\ufffd not utf-8"),
        (b'["a list"]', '["a list"]'),
        (b'{"detail": ""}', '{"detail": ""}'),
    ],
)
def test_problem_text_of_bodies_that_are_not_problem_documents(body, text):
    assert problem_text(body) == text


def test_problem_text_keeps_the_clouds_words_whole_for_the_core_to_scrub_then_cut():
    assert problem_text(samples.problem(400, "Bad Request", "x" * 10_000)).endswith("x" * 10_000)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("12", 12.0),
        (" 3 ", 3.0),
        ("0", 0.0),
        (None, None),
        ("soon", None),
        ("-1", None),
        ("nan", None),
        ("inf", None),
        ("99999", None),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),
    ],
)
def test_retry_after_parsing(header, seconds):
    assert parse_retry_after(header) == seconds


def test_capacity_phrases_are_lower_case_so_matching_is_case_insensitive():
    assert CAPACITY_PHRASES and all(phrase == phrase.lower() for phrase in CAPACITY_PHRASES)

"""The classification table: Prime's answers -> ErrorKind, scope, Retry-After, or gone."""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest

from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.prime.errors import (
    DETAIL_TABLE,
    PodGone,
    classify_status,
    classify_transport,
    detail_text,
    retry_after_seconds,
)
from tests.providers.prime import bodies


def answer(
    status: int, body: Any, method: str = "POST", path: str = "/api/v1/pods/", **headers: str
) -> httpx.Response:
    request = httpx.Request(method, f"https://api.primeintellect.ai{path}")
    if isinstance(body, str):
        return httpx.Response(status, text=body, headers=headers, request=request)
    return httpx.Response(status, json=body, headers=headers, request=request)


def kind_of(operation: str, response: httpx.Response) -> ErrorKind | str:
    verdict = classify_status(operation, response)
    return "gone" if isinstance(verdict, PodGone) else verdict.kind


@pytest.mark.parametrize(
    ("operation", "status", "body", "expected"),
    [
        ("create", 400, bodies.STOCKOUT, ErrorKind.CAPACITY),
        (
            "create",
            409,
            {"detail": "This configuration is no longer available"},
            ErrorKind.CAPACITY,
        ),
        ("create", 400, {"detail": "Out of stock"}, ErrorKind.CAPACITY),
        (
            "create",
            400,
            {
                "detail": "There are no longer any instances available with the requested "
                "specifications. Please refresh and try again."
            },
            ErrorKind.CAPACITY,
        ),
        ("create", 400, bodies.NO_BALANCE, ErrorKind.QUOTA),
        ("create", 402, {"detail": "Payment required"}, ErrorKind.QUOTA),
        ("create", 402, "", ErrorKind.QUOTA),
        ("create", 400, {"detail": "Team pod limit exceeded"}, ErrorKind.QUOTA),
        ("create", 401, bodies.UNAUTHORIZED, ErrorKind.CREDENTIALS),
        ("plan", 403, {"detail": "Not enough permissions"}, ErrorKind.CREDENTIALS),
        ("create", 400, {"detail": "Invalid API key"}, ErrorKind.CREDENTIALS),
        ("create", 422, bodies.VALIDATION, ErrorKind.INVALID_REQUEST),
        ("create", 400, bodies.MISSING_FIELD, ErrorKind.INVALID_REQUEST),
        ("create", 400, {"detail": "Image not available for this offer"}, ErrorKind.UNAVAILABLE),
        ("create", 429, {"detail": "Too many requests"}, ErrorKind.TRANSIENT),
        ("create", 500, {"detail": "Internal Server Error"}, ErrorKind.FAILED),
        ("create", 502, "<html>Bad Gateway</html>", ErrorKind.FAILED),
        ("create", 400, {"detail": "Something Prime never documented"}, ErrorKind.FAILED),
        ("observe", 500, {"detail": "Internal Server Error"}, ErrorKind.TRANSIENT),
        ("plan", 503, "", ErrorKind.TRANSIENT),
        ("observe", 404, {"detail": "Not Found"}, ErrorKind.FAILED),  # a wrong base URL
        ("delete", 404, bodies.NOT_FOUND, "gone"),
        ("delete", 400, {"detail": "Pod already terminated"}, "gone"),
        ("delete", 410, "", "gone"),
        ("delete", 404, {"detail": "Not Found"}, "gone"),
        ("delete", 500, {"detail": "Internal Server Error"}, ErrorKind.TRANSIENT),
        ("delete", 401, bodies.UNAUTHORIZED, ErrorKind.CREDENTIALS),
    ],
)
def test_classification_table(operation, status, body, expected):
    assert kind_of(operation, answer(status, body)) == expected


def test_account_wide_errors_block_the_whole_provider():
    for response in (answer(400, bodies.NO_BALANCE), answer(402, "")):
        error = classify_status("create", response)
        assert isinstance(error, ProviderError) and error.block_scope is BlockScope.PROVIDER
    stockout = classify_status("create", answer(400, bodies.STOCKOUT))
    assert stockout.block_scope is None  # the core's default: block this offer


def test_message_keeps_the_cloud_s_own_words_and_the_call():
    error = classify_status("create", answer(400, bodies.STOCKOUT))
    assert error.message == (
        "POST /api/v1/pods/ -> HTTP 400: No capacity: the selected GPU configuration is out of "
        "stock"
    )


def test_a_gone_phrase_outside_delete_is_not_success():
    error = classify_status("observe", answer(404, bodies.NOT_FOUND, method="GET"))
    assert isinstance(error, ProviderError) and error.kind is ErrorKind.FAILED


def test_throttling_carries_retry_after_seconds():
    error = classify_status("plan", answer(429, {"detail": "slow down"}, **{"Retry-After": "7"}))
    assert error.kind is ErrorKind.TRANSIENT and error.retry_after == 7.0
    assert classify_status("plan", answer(429, "")).retry_after is None


def test_retry_after_as_an_http_date():
    headers = {"retry-after": "Thu, 20 Aug 2026 12:00:30 GMT"}
    when = parsedate_to_datetime(headers["retry-after"]).timestamp()
    assert retry_after_seconds(headers, now=when - 30) == pytest.approx(30.0)
    assert retry_after_seconds(headers, now=when + 5) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after": "999999999"}) == 3600.0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"detail": "Out of stock"}, "Out of stock"),
        (bodies.VALIDATION, "pod.gpuCount: Input should be greater than 0"),
        (
            {"detail": [{"loc": ["body", "pod", "gpuCount"], "msg": "must be > 0", "type": "x"}]},
            "body.pod.gpuCount: must be > 0",
        ),
        ({"message": "upstream said no"}, "upstream said no"),
        ("plain text\n  answer", "plain text answer"),
        ({"unexpected": [1, 2]}, '{"unexpected": [1, 2]}'),
        (None, ""),
    ],
)
def test_detail_text_reads_every_error_shape(body, words):
    assert detail_text(body) == words


def test_detail_text_keeps_the_clouds_words_whole_for_the_core_to_scrub_then_cut():
    assert detail_text({"detail": "x" * 10_000}) == "x" * 10_000


def test_network_failures_are_transient_everywhere():
    for operation in ("plan", "create", "observe", "delete"):
        error = classify_transport(operation, "POST", "/api/v1/pods/", httpx.ReadTimeout("t"))
        assert error.kind is ErrorKind.TRANSIENT


def test_table_phrases_are_lower_case_and_unique():
    phrases = [phrase for phrase, _, _ in DETAIL_TABLE]
    assert phrases and all(phrase == phrase.lower() for phrase in phrases)
    assert len(phrases) == len(set(phrases))

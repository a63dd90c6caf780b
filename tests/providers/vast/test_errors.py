"""The Vast error table (pure): every documented code, the message's embedded code, the status
fallbacks, Retry-After and the scrubbing of secrets."""

from __future__ import annotations

import pytest

from providers.errors import BlockScope, ErrorKind
from providers.vast.errors import CODES, Op, classify, error_codes, is_gone, retry_after
from tests.providers.vast import fixtures


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (404, fixtures.NO_SUCH_ASK_404, ErrorKind.CAPACITY),
        (410, fixtures.NO_SUCH_ASK_410, ErrorKind.CAPACITY),
        (400, fixtures.INVALID_ARGS_400, ErrorKind.INVALID_REQUEST),
        (400, {"success": False, "error": "invalid_price", "msg": "x"}, ErrorKind.INVALID_REQUEST),
        (400, {"error": "no_ssh_key_for_vm", "msg": "add a key"}, ErrorKind.INVALID_REQUEST),
        (403, fixtures.NOT_YOUR_OWN_403, ErrorKind.INVALID_REQUEST),
        (401, fixtures.AUTH_ERROR_401, ErrorKind.CREDENTIALS),
        (429, fixtures.TOO_FREQUENT_429, ErrorKind.TRANSIENT),
        (429, fixtures.DESTROY_RATE_LIMITED_429, ErrorKind.TRANSIENT),
        (400, {"error": "insufficient_balance", "msg": "add credit"}, ErrorKind.QUOTA),
        (503, None, ErrorKind.TRANSIENT),
        (401, None, ErrorKind.CREDENTIALS),
        (403, {"msg": "forbidden"}, ErrorKind.CREDENTIALS),
        (404, {"msg": "no idea"}, ErrorKind.FAILED),
        (400, {"error": "never_seen_before"}, ErrorKind.FAILED),
        (200, {"success": False}, ErrorKind.FAILED),
    ],
)
def test_create_errors(status, body, kind):
    assert classify(Op.CREATE, status, body, "").kind is kind


def test_every_code_is_classified_as_a_known_kind():
    assert set(CODES.values()) <= set(ErrorKind)
    assert CODES["no_such_ask"] is ErrorKind.CAPACITY


@pytest.mark.parametrize("op", [Op.SEARCH, Op.LIST, Op.DESTROY])
def test_refused_arguments_outside_create_are_ours_so_failed_not_abort(op):
    assert classify(op, 400, fixtures.INVALID_ARGS_400, "").kind is ErrorKind.FAILED


def test_a_stale_page_token_lists_again():
    error = classify(Op.LIST, 400, fixtures.LIST_BAD_TOKEN_400, "")
    assert error.kind is ErrorKind.TRANSIENT


def test_the_message_carries_vasts_own_words_and_code():
    error = classify(Op.CREATE, 404, fixtures.NO_SUCH_ASK_404, "")
    assert error.message == (
        "create instance: HTTP 404 no_such_ask: error 404/3603: no_such_ask Instance type by id "
        "1234567 is not available."
    )
    plain = classify(Op.CREATE, 429, None, fixtures.TOO_FREQUENT_TEXT)
    assert plain.message.endswith("API requests too frequent endpoint threshold=4.5")
    assert plain.retry_after is None  # Vast sends no Retry-After: the core's backoff applies


def test_quota_for_credit_blocks_the_whole_provider():
    error = classify(Op.CREATE, 400, {"error": "insufficient_balance", "msg": "x"}, "")
    assert error.block_scope is BlockScope.PROVIDER
    assert classify(Op.CREATE, 404, fixtures.NO_SUCH_ASK_404, "").block_scope is None


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": " 2.5 "}, 2.5),
        ({"Retry-After": "99999"}, 300.0),
        ({"Retry-After": "-4"}, 0.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date in the past
        ({"Retry-After": "nan"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_retry_after(headers, seconds):
    assert retry_after(headers) == seconds


def test_retry_after_reaches_the_error_only_when_transient():
    assert classify(Op.LIST, 429, None, "", {"Retry-After": "3"}).retry_after == 3.0
    assert classify(Op.LIST, 401, None, "", {"Retry-After": "3"}).retry_after is None


def test_the_clouds_words_are_kept_whole_for_the_core_to_scrub_then_cut():
    body = {"error": "auth_error", "msg": "key refused " + "x" * 2000}
    error = classify(Op.SEARCH, 401, body, "")
    assert error.message == f"{Op.SEARCH.value}: HTTP 401 auth_error: key refused " + "x" * 2000


@pytest.mark.parametrize(
    ("body", "codes"),
    [
        (fixtures.NO_SUCH_ASK_404, ["no_such_ask", "invalid_args"]),
        (fixtures.INVALID_ARGS_400, ["invalid_args"]),
        ({"message": "error 410/3907: no_such_ask gone"}, ["no_such_ask"]),
        ({"error": 5, "msg": None}, []),
        (None, []),
    ],
)
def test_error_codes_read_the_message_first(body, codes):
    assert error_codes(body) == codes


def test_gone_codes():
    assert is_gone(fixtures.DESTROY_NOT_FOUND_404)
    assert is_gone({"error": "no_such_instance"})
    assert not is_gone(fixtures.AUTH_ERROR_401) and not is_gone(None)

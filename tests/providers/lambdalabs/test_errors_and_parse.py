"""Pure tests: the error table, Retry-After, identity names, GPU names, prices.

The launch's user data is built by providers/userdata.py (tests/providers/test_userdata.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from providers.base import InstanceStatus
from providers.errors import ErrorKind, ProviderError
from providers.lambdalabs import errors, parse

from . import fixtures as fx

Op = errors.Op
NOW = datetime(2026, 8, 1, tzinfo=UTC)


# ---------------------------------------------------------------- the error table

DOCUMENTED = [
    (fx.INSUFFICIENT_CAPACITY, 400, ErrorKind.CAPACITY),
    (fx.QUOTA_EXCEEDED, 400, ErrorKind.QUOTA),
    (fx.INVALID_PARAMETERS, 400, ErrorKind.INVALID_REQUEST),
    (fx.FILE_SYSTEM_WRONG_REGION, 400, ErrorKind.INVALID_REQUEST),
    (fx.LAUNCH_RESOURCE_MISSING, 404, ErrorKind.INVALID_REQUEST),
    (fx.INVALID_API_KEY, 401, ErrorKind.CREDENTIALS),
    (fx.FORBIDDEN, 403, ErrorKind.CREDENTIALS),
    (fx.ACCOUNT_INACTIVE, 403, ErrorKind.CREDENTIALS),
    (fx.INVALID_ADDRESS, 403, ErrorKind.CREDENTIALS),
    (fx.CONFLICT, 409, ErrorKind.FAILED),
    (fx.INTERNAL, 500, ErrorKind.TRANSIENT),
    (fx.PROVIDER_UNAVAILABLE, 503, ErrorKind.TRANSIENT),
]


@pytest.mark.parametrize(("body", "status", "kind"), DOCUMENTED)
def test_every_documented_launch_code_has_its_kind(body, status, kind):
    error = errors.classify(Op.LAUNCH, status, **body["error"])
    assert error.kind is kind and not isinstance(error, errors.Gone)
    assert body["error"]["code"] in error.message and body["error"]["message"] in error.message


@pytest.mark.parametrize("op", [Op.GET_INSTANCE, Op.TERMINATE, Op.DELETE_KEY])
@pytest.mark.parametrize("body", [fx.INSTANCE_NOT_FOUND, fx.NOT_FOUND])
def test_not_found_on_get_terminate_and_key_delete_is_gone(op, body):
    assert isinstance(errors.classify(op, 404, **body["error"]), errors.Gone)


@pytest.mark.parametrize("op", [op for op in Op if op not in (Op.LAUNCH, Op.ADD_KEY)])
def test_invalid_parameters_on_a_call_that_carries_only_our_own_parameters_is_failed(op):
    assert errors.classify(op, 400, **fx.INVALID_PARAMETERS["error"]).kind is ErrorKind.FAILED


@pytest.mark.parametrize("op", [Op.LAUNCH, Op.ADD_KEY])
def test_invalid_parameters_on_a_call_that_carries_the_jobs_ask_is_invalid_request(op):
    error = errors.classify(op, 400, **fx.INVALID_PARAMETERS["error"])
    assert error.kind is ErrorKind.INVALID_REQUEST


def test_not_found_on_launch_is_invalid_request_not_gone():
    error = errors.classify(Op.LAUNCH, 404, **fx.LAUNCH_RESOURCE_MISSING["error"])
    assert error.kind is ErrorKind.INVALID_REQUEST and not isinstance(error, errors.Gone)


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (429, None, ErrorKind.TRANSIENT),
        (502, None, ErrorKind.TRANSIENT),
        (401, None, ErrorKind.CREDENTIALS),
        (403, None, ErrorKind.CREDENTIALS),
        (400, None, ErrorKind.FAILED),
        (418, "global/something-new", ErrorKind.FAILED),
        (500, "global/quota-exceeded", ErrorKind.QUOTA),  # the code decides, not the status
        (200, "provider/network-outage", ErrorKind.TRANSIENT),
    ],
)
def test_unknown_codes_fall_back_on_status_and_known_codes_win(status, code, kind):
    assert errors.kind_for(Op.LAUNCH, status, code) is kind


def test_every_table_entry_is_a_real_kind_and_transient_keeps_retry_after():
    assert errors.CODE_KINDS
    assert all(isinstance(kind, ErrorKind) for kind in errors.CODE_KINDS.values())
    error = errors.classify(Op.LIST_INSTANCES, 429, None, None, retry_after=3.0)
    assert error.retry_after == 3.0
    assert (
        errors.classify(Op.LAUNCH, 400, "global/quota-exceeded", "q", None, 3.0).retry_after is None
    )


def test_unreadable_answers_are_failed_after_launch_and_transient_elsewhere():
    assert errors.malformed(Op.LAUNCH, "x").kind is ErrorKind.FAILED
    assert errors.malformed(Op.LIST_INSTANCES, "x").kind is ErrorKind.TRANSIENT


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("12", 12.0),
        (" 1.5 ", 1.5),
        ("Sat, 01 Aug 2026 00:00:30 GMT", 30.0),
        ("Fri, 31 Jul 2026 23:00:00 GMT", 0.0),  # in the past: now
        ("-4", None),
        ("nan", None),
        ("99999999", None),
        ("soon", None),
        (None, None),
    ],
)
def test_retry_after_accepts_seconds_and_dates_and_refuses_nonsense(header, seconds):
    assert errors.retry_after_seconds(header, now=NOW) == seconds


# ---------------------------------------------------------------- identity


def test_instance_name_is_the_label_and_long_ones_are_shortened_stably():
    assert parse.instance_name("train-a1-n0-abc123") == "gpuprov-train-a1-n0-abc123"
    vm = "a" * 40 + "-a123-n255-abcdef"  # the longest a job name allows: 65 with the prefix
    name = parse.instance_name(vm)
    assert len(name) == 64 and name == parse.instance_name(vm) and name.startswith("gpuprov-aaa")
    assert parse.instance_name(vm + "x") != name
    assert parse.vm_of({"name": name}) is None  # cannot be inverted: the tag carries it
    assert parse.vm_of({"name": name, "tags": [{"key": "gpuprov-vm", "value": vm}]}) == vm
    assert parse.carries({"name": name}, vm)


@pytest.mark.parametrize(
    ("raw", "vm"),
    [
        ({"name": "gpuprov-x-a1-n0-1"}, "x-a1-n0-1"),
        ({"name": "My Instance"}, None),
        ({"name": "gpuprov-"}, None),
        ({"tags": [{"key": "gpuprov-vm", "value": ""}]}, None),
        ({"tags": "gpuprov-vm"}, None),
        ([1, 2], None),
    ],
)
def test_vm_of_reads_identity_leniently(raw, vm):
    assert parse.vm_of(raw) == vm


# ---------------------------------------------------------------- offers


@pytest.mark.parametrize(
    ("description", "name", "memory"),
    [
        ("H100 (80 GB SXM5)", "H100 SXM5", 80.0),
        ("A10 (24 GB PCIe)", "A10 PCIe", 24.0),
        ("GH200 (96 GB)", "GH200", 96.0),
        ("Quadro RTX 6000 (24 GB)", "Quadro RTX 6000", 24.0),
        ("B200", "B200", None),
        ("weird ((", "weird ((", None),
    ],
)
def test_gpu_model_reads_lambdas_gpu_description(description, name, memory):
    assert parse.gpu_model(description) == (name, memory)


@pytest.mark.parametrize(
    ("cents", "usd"),
    [(2392, 23.92), (75, 0.75), (149.5, 1.495), (0, None), (-5, None), (10**400, None),
     (float("inf"), None), ("2392", None), (True, None), (None, None)],
)  # fmt: skip
def test_price_is_cents_over_100_or_none(cents, usd):
    quote = parse.price_quote(cents, NOW)
    assert (quote.amount if quote else None) == (pytest.approx(usd) if usd else None)
    if quote:
        assert quote.source == parse.PRICE_SOURCE and quote.observed_at == NOW


def test_offers_skip_an_unreadable_type_but_keep_the_rest():
    data = dict(fx.INSTANCE_TYPES) | {"broken": {"instance_type": {"name": 1}}}
    ids = [o.id for o in parse.offers(data, None, NOW)]
    assert len(ids) == 6 and not any("broken" in i for i in ids)
    with pytest.raises(ProviderError):
        parse.offers(["not", "a", "map"], None, NOW)


def test_an_active_instance_with_a_bogus_ip_is_not_given_an_ssh_host():
    instance = parse.Instance.model_validate(fx.instance("i", ip="evil; rm -rf /"))
    seen = parse.observed(instance)
    assert seen.status is InstanceStatus.PENDING and seen.ssh is None

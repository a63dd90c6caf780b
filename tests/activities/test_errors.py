"""ProviderError -> ApplicationError (and back), without a Temporal server."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ApplicationErrorCategory,
    TimeoutError,
    TimeoutType,
)

from activities.errors import classified, to_application_error, unwrap
from gpuprov.policy import Stage
from providers.errors import MAX_MESSAGE_CHARS, BlockScope, ErrorKind, ProviderError, truncate


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_type_is_the_kind_value(kind: ErrorKind) -> None:
    error = to_application_error(ProviderError(kind, "the cloud said no"))
    assert isinstance(error, ApplicationError)
    assert error.type == kind.value
    assert error.message == "the cloud said no"


def test_transient_is_retryable() -> None:
    assert to_application_error(ProviderError(ErrorKind.TRANSIENT, "503")).non_retryable is False


@pytest.mark.parametrize("kind", [k for k in ErrorKind if k is not ErrorKind.TRANSIENT])
def test_every_other_kind_is_non_retryable(kind: ErrorKind) -> None:
    assert to_application_error(ProviderError(kind, "no")).non_retryable is True


def test_retry_after_becomes_next_retry_delay() -> None:
    error = to_application_error(ProviderError(ErrorKind.TRANSIENT, "429", retry_after=12.5))
    assert error.next_retry_delay == timedelta(seconds=12.5)


def test_no_retry_after_means_no_next_retry_delay() -> None:
    assert to_application_error(ProviderError(ErrorKind.TRANSIENT, "503")).next_retry_delay is None


def test_zero_retry_after_is_kept() -> None:
    error = to_application_error(ProviderError(ErrorKind.TRANSIENT, "429", retry_after=0))
    assert error.next_retry_delay == timedelta(0)


def test_block_scope_travels_in_the_details() -> None:
    error = to_application_error(
        ProviderError(ErrorKind.QUOTA, "vCPU limit", block_scope=BlockScope.PROVIDER)
    )
    assert error.details == ({"block_scope": "provider"},)


def test_details_carry_no_block_scope_when_the_adapter_sets_none() -> None:
    error = to_application_error(ProviderError(ErrorKind.CAPACITY, "sold out"))
    assert error.details == ({"block_scope": None},)


def test_classified_errors_are_benign() -> None:
    error = to_application_error(ProviderError(ErrorKind.FAILED, "boom"))
    assert error.category is ApplicationErrorCategory.BENIGN


def test_long_messages_are_truncated() -> None:
    error = to_application_error(ProviderError(ErrorKind.FAILED, "x" * 10_000))
    assert len(error.message) <= MAX_MESSAGE_CHARS
    assert error.message.endswith("...(truncated)")
    assert error.message.startswith("x" * 100)


def test_message_at_the_limit_is_kept_whole() -> None:
    message = "y" * MAX_MESSAGE_CHARS
    assert to_application_error(ProviderError(ErrorKind.FAILED, message)).message == message


def test_truncate_respects_a_custom_limit() -> None:
    assert truncate("short", 100) == "short"
    cut = truncate("z" * 200, 50)
    assert len(cut) <= 50 and cut.endswith("...(truncated)")


def test_message_is_the_clouds_words_without_the_kind_prefix() -> None:
    provider_error = ProviderError(ErrorKind.CAPACITY, "InsufficientInstanceCapacity")
    assert str(provider_error) == "Capacity: InsufficientInstanceCapacity"
    assert to_application_error(provider_error).message == "InsufficientInstanceCapacity"


def test_provider_error_survives_pickling() -> None:
    original = ProviderError(
        ErrorKind.QUOTA, "limit", retry_after=3.0, block_scope=BlockScope.REGION
    )
    copy = pickle.loads(pickle.dumps(original))
    assert (copy.kind, copy.message, copy.retry_after, copy.block_scope) == (
        ErrorKind.QUOTA,
        "limit",
        3.0,
        BlockScope.REGION,
    )


# ---------------------------------------------------------------- classified()


def test_classified_turns_a_provider_error_into_an_application_error() -> None:
    cause = ProviderError(ErrorKind.CAPACITY, "sold out", block_scope=BlockScope.OFFER)
    with pytest.raises(ApplicationError) as caught, classified():
        raise cause
    assert caught.value.type == "Capacity"
    assert caught.value.non_retryable is True
    assert caught.value.details == ({"block_scope": "offer"},)
    assert caught.value.__cause__ is None  # history would record the cause's text again
    assert caught.value.message == cause.message


def test_classified_keeps_transient_retryable() -> None:
    with pytest.raises(ApplicationError) as caught, classified():
        raise ProviderError(ErrorKind.TRANSIENT, "throttled", retry_after=2)
    assert caught.value.non_retryable is False
    assert caught.value.next_retry_delay == timedelta(seconds=2)


def test_classified_leaves_other_exceptions_alone() -> None:
    with pytest.raises(KeyError), classified():
        raise KeyError("bug")


def test_classified_leaves_application_errors_alone() -> None:
    original = ApplicationError("already classified", type="Quota")
    with pytest.raises(ApplicationError) as caught, classified():
        raise original
    assert caught.value is original


def test_classified_is_silent_when_nothing_fails() -> None:
    with classified():
        result = 1 + 1
    assert result == 2


def test_a_timed_out_step_is_failed_but_blocks_nothing() -> None:
    # A heartbeat or start-to-close timeout is the worker's (overloaded, killed) or the
    # network's: tear down (Failed), but block no offer for every other job.
    timeout = TimeoutError(
        "activity heartbeat timeout", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[]
    )
    error = ActivityError(
        "activity error",
        scheduled_event_id=1,
        started_event_id=2,
        identity="worker",
        activity_type="wait_running",
        activity_id="1",
        retry_state=None,
    )
    error.__cause__ = timeout
    failure = unwrap("wait_running", Stage.ATTEMPT, error)
    assert failure.kind is ErrorKind.FAILED
    assert failure.message == "timed out (HEARTBEAT)"
    assert failure.scope is BlockScope.NONE

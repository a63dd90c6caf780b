"""Block scopes are typed from the adapters' tables to the ProviderError: a BlockScope, never a
string that happens to spell one."""

from __future__ import annotations

import pickle

from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.gce.errors import http_error as gce_http_error
from providers.prime.errors import DETAIL_TABLE, STATUS_TABLE
from providers.runpod.errors import BLOCK_SCOPES as RUNPOD_SCOPES
from providers.runpod.errors import classify as classify_runpod
from providers.vast.errors import BLOCK_SCOPES as VAST_SCOPES
from providers.vast.errors import Op
from providers.vast.errors import classify as classify_vast


def test_every_scope_in_an_adapters_table_is_a_block_scope() -> None:
    scopes = [
        *(scope for _, _, scope in DETAIL_TABLE),
        *(scope for _, scope in STATUS_TABLE.values()),
        *RUNPOD_SCOPES.values(),
        *VAST_SCOPES.values(),
    ]
    assert scopes and all(s is None or isinstance(s, BlockScope) for s in scopes)


def test_a_classified_error_carries_the_enum_itself() -> None:
    runpod = classify_runpod("create", 402, b'{"title": "Payment Required"}', "POST /v2/pods")
    vast = classify_vast(Op.CREATE, 402, {"error": "insufficient_balance", "msg": "no"}, "")
    body = {"error": {"errors": [{"reason": "quotaExceeded"}], "message": "Quota 'FIREWALLS'"}}
    gce = gce_http_error(403, body, {}, "insert", writes=True)
    assert runpod.block_scope is BlockScope.PROVIDER
    assert vast.block_scope is BlockScope.PROVIDER
    assert gce.block_scope is BlockScope.PROVIDER


def test_provider_error_keeps_the_scope_it_is_given_through_pickling() -> None:
    error = ProviderError(ErrorKind.QUOTA, "limit", block_scope=BlockScope.REGION)
    copy = pickle.loads(pickle.dumps(error))
    assert error.block_scope is BlockScope.REGION and copy.block_scope is BlockScope.REGION

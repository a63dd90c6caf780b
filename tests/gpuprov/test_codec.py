"""Payload encryption (gpuprov/sdk/codec.py), its settings, and the codec server for the UI.

The end-to-end tests run whole jobs on the session's real dev server with a client and a worker
that both use the codec converter, and look at the raw history: nothing of the job spec is
readable there, while the SDK with the keys reads everything as before."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DefaultFailureConverterWithEncodedAttributes
from temporalio.exceptions import ApplicationError

from gpuprov.api.app import serving
from gpuprov.api.codec_server import create_codec_app, endpoint_url, ui_origins
from gpuprov.cli.dev import dev_stack, free_port
from gpuprov.config import CodecSettings, ConfigError, FaultRule, Settings, load_settings
from gpuprov.models import JobSpec, JobState
from gpuprov.sdk.client import GpuprovClient
from gpuprov.sdk.codec import (
    ENCODING,
    KEY_ID,
    EncryptionCodec,
    PayloadDecryptionError,
    data_converter,
    generate_key,
)
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER
from providers.errors import ErrorKind
from tests.helpers import fake_worker, fast_cloud, job

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

UI = "http://localhost:8233"


def key() -> bytes:
    return os.urandom(32)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def plain(text: str = '{"secret": "s3cr3t-value"}') -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=text.encode())


def settings(**codec: Any) -> CodecSettings:
    return CodecSettings.model_validate(codec)


# ---------------------------------------------------------------- the codec


async def test_round_trip_encrypts_the_whole_payload_under_the_active_key():
    codec = EncryptionCodec({"k1": key()}, "k1")
    original = plain()
    original.metadata["messageType"] = b"gpuprov.JobSpec"

    [encrypted] = await codec.encode([original])
    assert dict(encrypted.metadata) == {"encoding": ENCODING, KEY_ID: b"k1"}
    assert b"s3cr3t-value" not in encrypted.SerializeToString()
    assert b"gpuprov.JobSpec" not in encrypted.SerializeToString()  # metadata too
    assert len(encrypted.data) == 12 + len(original.SerializeToString()) + 16

    [decoded] = await codec.decode([encrypted])
    assert decoded == original
    # A fresh nonce each time: the same payload never encrypts to the same bytes.
    [again] = await codec.encode([original])
    assert again.data != encrypted.data and again.data[:12] != encrypted.data[:12]


async def test_unencrypted_payloads_pass_through_decode_unchanged():
    codec = EncryptionCodec({"k1": key()}, "k1")
    old = [plain(), Payload(metadata={"encoding": b"binary/null"}), Payload()]
    assert await codec.decode(old) == old


async def test_unknown_key_id_is_a_clear_error_naming_it_and_the_configured_ones():
    [encrypted] = await EncryptionCodec({"retired": key()}, "retired").encode([plain()])
    reader = EncryptionCodec({"k1": key(), "k2": key()}, "k2")
    with pytest.raises(PayloadDecryptionError) as raised:
        await reader.decode([encrypted])
    message = str(raised.value)
    assert "key id 'retired'" in message and "not in [codec] keys" in message
    assert "configured: k1, k2" in message


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], id="flipped-ciphertext-bit"),
        pytest.param(lambda d: bytes([d[0] ^ 1]) + d[1:], id="flipped-nonce-bit"),
        pytest.param(lambda d: d[:-1], id="cut-tag"),
        pytest.param(lambda d: d + b"x", id="appended-byte"),
    ],
)
async def test_tampered_ciphertext_fails_authentication(damage):
    codec = EncryptionCodec({"k1": key()}, "k1")
    [encrypted] = await codec.encode([plain()])
    tampered = Payload(metadata=encrypted.metadata, data=damage(encrypted.data))
    with pytest.raises(PayloadDecryptionError, match="key id 'k1'.*failed authentication"):
        await codec.decode([tampered])


async def test_truncated_or_unlabelled_or_relabelled_payloads_are_refused():
    codec = EncryptionCodec({"k1": key(), "k2": key()}, "k1")
    [encrypted] = await codec.encode([plain()])
    truncated = Payload(metadata=encrypted.metadata, data=encrypted.data[:20])
    with pytest.raises(PayloadDecryptionError, match="truncated"):
        await codec.decode([truncated])
    unlabelled = Payload(metadata={"encoding": ENCODING}, data=encrypted.data)
    with pytest.raises(PayloadDecryptionError, match="without the encryption-key-id"):
        await codec.decode([unlabelled])
    # The key id is authenticated: pointing the payload at another key fails.
    relabelled = Payload(metadata={"encoding": ENCODING, KEY_ID: b"k2"}, data=encrypted.data)
    with pytest.raises(PayloadDecryptionError, match="failed authentication"):
        await codec.decode([relabelled])


async def test_key_rotation_old_key_still_decodes_and_the_new_active_key_encodes():
    old, new = key(), key()
    before = EncryptionCodec({"2024": old}, "2024")
    [written_before] = await before.encode([plain("before")])

    after = EncryptionCodec({"2024": old, "2025": new}, "2025")
    [written_after] = await after.encode([plain("after")])
    assert written_after.metadata[KEY_ID] == b"2025"
    assert await after.decode([written_before, written_after]) == [
        plain("before"),
        plain("after"),
    ]
    # A process that still has only the old key cannot read the new payloads...
    with pytest.raises(PayloadDecryptionError, match="key id '2025'"):
        await before.decode([written_after])
    # ...so every process gets the new key before any of them switches active_key to it.
    rollout = EncryptionCodec({"2024": old, "2025": new}, "2024")
    assert await rollout.decode([written_after]) == [plain("after")]


async def test_without_an_active_key_nothing_new_is_encrypted_but_old_payloads_read():
    k = key()
    [encrypted] = await EncryptionCodec({"k1": k}, "k1").encode([plain()])
    decode_only = EncryptionCodec({"k1": k}, None)
    assert await decode_only.encode([plain()]) == [plain()]
    assert await decode_only.decode([encrypted]) == [plain()]


def test_codec_rejects_bad_keys_and_never_shows_them():
    secret = key()
    with pytest.raises(ValueError, match="16 bytes"):
        EncryptionCodec({"k1": secret[:16]}, "k1")
    with pytest.raises(ValueError, match="active key 'k9'"):
        EncryptionCodec({"k1": secret}, "k9")
    codec = EncryptionCodec({"k1": secret}, "k1")
    assert repr(codec) == "EncryptionCodec(key_ids=['k1'], active_key='k1')"


# ---------------------------------------------------------------- the data converter


async def test_data_converter_is_the_pydantic_one_without_keys():
    assert data_converter(None) is PYDANTIC_DATA_CONVERTER
    assert data_converter(CodecSettings()) is PYDANTIC_DATA_CONVERTER


def test_the_converters_of_every_context_share_one_type_adapter_cache():
    """The SDK builds a payload converter per workflow activation and per activity; a typed
    decode must not build its pydantic TypeAdapter again in each."""
    first = PYDANTIC_DATA_CONVERTER.payload_converter_class()
    second = PYDANTIC_DATA_CONVERTER.payload_converter_class()
    json_first, json_second = first.converters[b"json/plain"], second.converters[b"json/plain"]
    assert json_first is json_second
    spec = job("cache-unit")
    [payload] = first.to_payloads([spec])
    assert second.from_payloads([payload], [JobSpec]) == [spec]
    hits = json_first._type_adapter.cache_info().hits
    assert first.from_payloads([payload], [JobSpec]) == [spec]
    assert json_first._type_adapter.cache_info().hits == hits + 1


async def test_the_wire_format_is_pydantic_data_converters():
    """Histories written by either converter read with the other."""
    spec = job("wire-unit")
    ours = await PYDANTIC_DATA_CONVERTER.encode([spec])
    theirs = await pydantic_data_converter.encode([spec])
    assert ours == theirs
    assert await pydantic_data_converter.decode(ours, [JobSpec]) == [spec]


async def test_data_converter_with_keys_encrypts_models_and_failure_messages():
    converter = data_converter(settings(keys={"k1": generate_key()}, active_key="k1"))
    assert converter.payload_converter_class is PYDANTIC_DATA_CONVERTER.payload_converter_class
    assert isinstance(converter.payload_codec, EncryptionCodec)
    assert isinstance(converter.failure_converter, DefaultFailureConverterWithEncodedAttributes)

    spec = job("codec-unit", placement={"regions": ["secret-region"]})
    [payload] = await converter.encode([spec])
    assert payload.metadata["encoding"] == ENCODING and b"secret-region" not in payload.data
    assert await converter.decode([payload], [JobSpec]) == [spec]

    from temporalio.api.failure.v1 import Failure

    failure = Failure()
    await converter.encode_failure(ApplicationError("quota secret-quota-42"), failure)
    assert b"secret-quota-42" not in failure.SerializeToString()
    assert failure.message == "Encoded failure"
    decoded = await converter.decode_failure(failure)
    assert "secret-quota-42" in str(decoded)


async def test_decode_only_converter_keeps_failure_messages_readable():
    converter = data_converter(settings(keys={"k1": generate_key()}))
    assert isinstance(converter.payload_codec, EncryptionCodec)
    assert not isinstance(converter.failure_converter, DefaultFailureConverterWithEncodedAttributes)
    [payload] = await converter.encode([{"a": 1}])
    assert payload.metadata["encoding"] == b"json/plain"


# ---------------------------------------------------------------- settings


def config_error(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, env=env)
    return str(caught.value)


def test_codec_settings_from_toml(tmp_path: Path):
    k1, k2 = generate_key(), generate_key()
    path = tmp_path / "gpuprov.toml"
    path.write_text(
        f'[codec]\nactive_key = "k2"\nport = 9091\nui_origins = ["https://temporal.example"]\n'
        f'[codec.keys]\nk1 = "{k1}"\nk2 = "{k2}"\n'
    )
    loaded = load_settings(path, env={}).codec
    assert loaded.enabled and loaded.active_key == "k2" and loaded.port == 9091
    assert loaded.key_bytes() == {"k1": base64.b64decode(k1), "k2": base64.b64decode(k2)}
    assert k1 not in repr(loaded) and k1 not in str(loaded.model_dump())


def test_codec_settings_from_the_environment_with_keys_as_an_inline_table():
    k1 = generate_key()
    env = {"GPUPROV_CODEC__KEYS": f'{{k1 = "{k1}"}}', "GPUPROV_CODEC__ACTIVE_KEY": "k1"}
    loaded = load_settings(None, env=env).codec
    assert loaded.enabled and loaded.key_bytes() == {"k1": base64.b64decode(k1)}
    assert not load_settings(None, env={}).codec.enabled
    assert load_settings(None, env={}).codec.keys == {}


def test_a_key_that_is_not_base64_names_the_setting_and_not_the_value():
    message = config_error({"GPUPROV_CODEC__KEYS": '{k1 = "not*base64!"}'})
    assert "codec.keys.k1" in message and "not valid base64" in message
    assert "not*base64!" not in message


def test_a_key_of_the_wrong_length_names_the_setting_and_not_the_value():
    short = b64(os.urandom(16))
    message = config_error({"GPUPROV_CODEC__KEYS": f'{{k1 = "{short}"}}'})
    assert "codec.keys.k1" in message and "16 bytes" in message and "32" in message
    assert short not in message


def test_an_active_key_that_is_not_a_key_names_the_setting():
    k1 = generate_key()
    message = config_error(
        {"GPUPROV_CODEC__KEYS": f'{{k1 = "{k1}"}}', "GPUPROV_CODEC__ACTIVE_KEY": "k2"}
    )
    assert "codec" in message and "active_key 'k2' is not one of the keys" in message
    assert "configured: k1" in message and k1 not in message
    assert "active_key 'k1' is not one of the keys (configured: none)" in config_error(
        {"GPUPROV_CODEC__ACTIVE_KEY": "k1"}
    )


def test_a_bad_key_id_names_the_setting():
    message = config_error({"GPUPROV_CODEC__KEYS": f'{{"k 1" = "{generate_key()}"}}'})
    assert "codec" in message and "key id 'k 1'" in message


# ---------------------------------------------------------------- the codec server


def payloads_json(payloads: list[Payload]) -> dict[str, Any]:
    return {
        "payloads": [
            {
                "metadata": {k: b64(v) for k, v in p.metadata.items()},
                "data": b64(p.data),
            }
            for p in payloads
        ]
    }


def from_json(body: dict[str, Any]) -> list[Payload]:
    return [
        Payload(
            metadata={k: base64.b64decode(v) for k, v in p.get("metadata", {}).items()},
            data=base64.b64decode(p.get("data", "")),
        )
        for p in body["payloads"]
    ]


@pytest.fixture
def codec() -> EncryptionCodec:
    return EncryptionCodec({"k1": key()}, "k1")


@pytest.fixture
async def http(codec) -> Any:
    app = create_codec_app(codec, [UI])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://codec") as client:
        yield client


async def test_codec_server_encode_then_decode_round_trips(http):
    originals = [plain(), plain("[1, 2]"), Payload(metadata={"encoding": b"binary/null"})]
    headers = {"X-Namespace": "default"}
    encoded = await http.post("/encode", json=payloads_json(originals), headers=headers)
    assert encoded.status_code == 200, encoded.text
    assert encoded.headers["content-type"] == "application/json"
    encrypted = from_json(encoded.json())
    assert [p.metadata["encoding"] for p in encrypted] == [ENCODING] * 3
    assert b"s3cr3t-value" not in b"".join(p.data for p in encrypted)

    # Only the last path segment counts (the protocol): a /<namespace>/ prefix works too.
    decoded = await http.post("/default/decode", json=encoded.json(), headers=headers)
    assert decoded.status_code == 200, decoded.text
    assert from_json(decoded.json()) == originals


async def test_codec_server_answers_bad_requests_with_400(http, codec):
    assert (await http.post("/decode", content=b"{not json")).status_code == 400
    assert (await http.post("/decode", json={"payloads": "nope"})).status_code == 400
    assert (await http.post("/decode", json={"payloads": []})).json() == {"payloads": []}

    [encrypted] = await EncryptionCodec({"other": key()}, "other").encode([plain()])
    unknown = await http.post("/decode", json=payloads_json([encrypted]))
    assert unknown.status_code == 400 and "key id 'other'" in unknown.json()["error"]

    [mine] = await codec.encode([plain()])
    tampered = Payload(metadata=mine.metadata, data=mine.data[:-1] + b"\x00")
    refused = await http.post("/decode", json=payloads_json([tampered]))
    assert refused.status_code == 400 and "failed authentication" in refused.json()["error"]
    assert (await http.get("/decode")).status_code == 405
    assert (await http.get("/health")).json() == {"status": "ok"}


async def test_codec_server_allows_the_ui_origin_only(http):
    preflight = {
        "Origin": UI,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-namespace",
    }
    allowed = await http.options("/decode", headers=preflight)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == UI
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "x-namespace" in allowed.headers["access-control-allow-headers"].lower()
    posted = await http.post("/decode", json={"payloads": []}, headers={"Origin": UI})
    assert posted.headers["access-control-allow-origin"] == UI

    evil = {**preflight, "Origin": "https://evil.example"}
    assert (await http.options("/decode", headers=evil)).status_code == 400
    posted = await http.post(
        "/decode", json={"payloads": []}, headers={"Origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in posted.headers


def test_ui_origins_default_to_the_local_ui_and_endpoint_urls_are_browsable():
    assert ui_origins(Settings()) == ["http://localhost:8233", "http://127.0.0.1:8233"]
    assert ui_origins(Settings(), ui_port=9999)[1] == "http://127.0.0.1:9999"
    configured = Settings.model_validate({"codec": {"ui_origins": ["https://t.example"]}})
    assert ui_origins(configured) == ["https://t.example"]
    assert endpoint_url("0.0.0.0", 8081) == "http://127.0.0.1:8081"
    assert endpoint_url("10.0.0.5", 8081) == "http://10.0.0.5:8081"


# ---------------------------------------------------------------- whole jobs, real dev server


def history_payloads(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every Payload in a history's JSON, with where it sits."""
    found = []
    if isinstance(node, dict):
        metadata = node.get("metadata")
        if isinstance(metadata, dict) and "encoding" in metadata:
            return [(path, node)]
        for name, value in node.items():
            found += history_payloads(value, (*path, name))
    elif isinstance(node, list):
        for value in node:
            found += history_payloads(value, path)
    return found


async def history_of(client: Client, workflow_id: str) -> tuple[bytes, str]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return b"".join(event.SerializeToString() for event in history.events), history.to_json()


@pytest.fixture
def codec_settings() -> CodecSettings:
    return settings(keys={"old": generate_key(), "k1": generate_key()}, active_key="k1")


@pytest.fixture
async def codec_client(client: Client, codec_settings: CodecSettings) -> Client:
    """A client of the session's dev server with the codec, as a service or worker builds one."""
    return await Client.connect(
        client.service_client.config.target_host,
        namespace=client.namespace,
        data_converter=data_converter(codec_settings),
    )


def sdk_marker_metadata(path: tuple[str, ...]) -> bool:
    """What the SDK core writes into markers itself, outside the data converter: a patch's id
    (`patch-data`) and a local activity's bookkeeping (`data`: type, id, attempt, times). The
    local activity's result (`result`) goes through the converter, and so the codec."""
    return "markerRecordedEventAttributes" in path and path[-2] in ("patch-data", "data")


def marked_job(name: str) -> tuple[JobSpec, bytes]:
    """A job spec carrying a distinctive value that is in no search attribute."""
    marker = f"{uuid.uuid4().int % 900 + 100}.{uuid.uuid4().int % 10**6:06d}7"  # < disk_gb
    assert repr(float(marker)) == marker
    spec = job(name, resources={"gpu": "H100", "gpus_per_node": 8, "min_disk_gb": float(marker)})
    return spec, marker.encode()


async def test_a_job_with_the_codec_leaves_no_job_spec_plaintext_in_history(
    client, codec_client, codec_settings, task_queue, job_name
):
    spec, marker = marked_job(job_name)
    async with fake_worker(codec_client, task_queue, fast_cloud()) as (sdk, cloud):
        handle = await sdk.submit(spec)
        ready = await handle.wait_ready(60)  # the SDK with the keys reads the status fine
        assert ready.state is JobState.READY and ready.nodes[0].provider == "fake"
        await handle.release()
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.COMPLETED and cloud.live_instances() == []

    raw, as_json = await history_of(client, spec.workflow_id)
    for text in (raw, as_json.encode()):
        assert marker not in text
        assert b"gpus_per_node" not in text  # no pydantic model's JSON, anywhere
        assert b"fake/r1-a/gpu8" not in text  # offers and instance specs
    payloads = history_payloads(json.loads(as_json))
    outside_search_attributes = [
        (path, p) for path, p in payloads if "searchAttributes" not in path
    ]
    assert len(outside_search_attributes) > 10
    encoding = b64(ENCODING)
    plaintext = [
        path
        for path, p in outside_search_attributes
        if p["metadata"]["encoding"] != encoding and not sdk_marker_metadata(path)
    ]
    assert plaintext == []
    # Local activities' results are in their markers, and encrypted like any payload.
    assert any(
        "markerRecordedEventAttributes" in path and "result" in path
        for path in [path for path, _ in outside_search_attributes]
    )
    # Search attributes are never encrypted: that is why the marker is not in one.
    assert any("searchAttributes" in path for path, _ in payloads)
    assert b'"H100"' in raw

    # The codec server gives the UI the original payloads back.
    start = json.loads(as_json)["events"][0]["workflowExecutionStartedEventAttributes"]
    codec = EncryptionCodec.from_settings(codec_settings)
    port = free_port()
    async with (
        serving(create_codec_app(codec, [UI]), "127.0.0.1", port),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        response = await http.post(
            "/decode", json=start["input"], headers={"X-Namespace": client.namespace}
        )
        assert response.status_code == 200, response.text
        [decoded] = from_json(response.json())
        assert decoded.metadata["encoding"] == b"json/plain" and marker in decoded.data
        assert JobSpec.model_validate_json(decoded.data) == spec

        reencoded = await http.post("/encode", json=response.json())
        assert from_json(reencoded.json())[0].metadata[KEY_ID] == b"k1"
        again = await http.post("/decode", json=reencoded.json())
        assert from_json(again.json()) == [decoded]


async def test_without_the_codec_the_same_job_is_plaintext_in_history(client, task_queue, job_name):
    """The control: what the test above proves absent is there without a codec."""
    spec, marker = marked_job(job_name)
    async with fake_worker(client, task_queue, fast_cloud()) as (sdk, _):
        handle = await sdk.submit(spec)
        await handle.wait_ready(60)
        await handle.release()
        await asyncio.wait_for(handle.result(), 60)
    raw, _ = await history_of(client, spec.workflow_id)
    assert marker in raw and b"gpus_per_node" in raw and b"fake/r1-a/gpu8" in raw


async def test_a_failed_jobs_messages_are_encrypted_and_still_read_by_the_sdk(
    client, codec_client, task_queue, job_name
):
    secret = f"image not found: secret-{uuid.uuid4().hex}"
    invalid = FaultRule(primitive="create", kind=ErrorKind.INVALID_REQUEST, message=secret)
    async with fake_worker(codec_client, task_queue, fast_cloud([invalid])) as (sdk, _):
        handle = await sdk.submit(job(job_name))
        final = await asyncio.wait_for(handle.result(), 60)
    assert final.state is JobState.FAILED and secret in (final.error or "")
    raw, as_json = await history_of(client, f"job-{job_name}")
    assert secret.encode() not in raw and secret not in as_json
    assert "Encoded failure" in as_json  # failure messages moved into encrypted attributes


async def test_dev_stack_with_keys_serves_the_codec_to_the_ui_and_encrypts_registrations(
    tmp_path, job_name
):
    """`gpuprov dev` with [codec] keys: the UI is told the codec endpoint, the codec server
    lets the UI's origin in, and a job whose simulated node registers through the API (the
    `register_worker` Update, sent by the API's client) runs with every payload encrypted."""
    config = Settings.model_validate(
        {
            "temporal": {
                "address": f"127.0.0.1:{free_port()}",
                "ui_port": free_port(),
                "data_dir": str(tmp_path / "data"),
            },
            "api": {"port": free_port()},
            "codec": {"keys": {"k1": generate_key()}, "active_key": "k1", "port": free_port()},
            "providers": {"fake": fast_cloud(simulate_agent=True).model_dump()},
        }
    )
    async with dev_stack(config) as stack, httpx.AsyncClient() as http:
        assert stack.codec_url == f"http://127.0.0.1:{config.codec.port}"
        ui_settings = (await http.get(f"{stack.ui_url}/api/v1/settings")).json()
        assert ui_settings["Codec"]["Endpoint"] == stack.codec_url
        preflight = await http.options(
            f"{stack.codec_url}/decode",
            headers={
                "Origin": stack.ui_url,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-namespace",
            },
        )
        assert preflight.headers["access-control-allow-origin"] == stack.ui_url

        sdk = GpuprovClient(stack.client, config.temporal.task_queue)
        handle = await sdk.submit(job(job_name))
        ready = await handle.wait_ready(60)
        assert ready.nodes[0].worker_id is not None  # the node registered through the API
        await handle.release()
        assert (await asyncio.wait_for(handle.result(), 60)).state is JobState.COMPLETED

        raw, as_json = await history_of(stack.client, f"job-{job_name}")
        assert b"gpus_per_node" not in raw and ready.nodes[0].worker_id.encode() not in raw
        events = json.loads(as_json)["events"]
        waits = {
            event["eventId"]
            for event in events
            if event.get("activityTaskScheduledEventAttributes", {})
            .get("activityType", {})
            .get("name")
            == "await_registrations"
        }
        results = [
            event["activityTaskCompletedEventAttributes"]
            for event in events
            if event.get("activityTaskCompletedEventAttributes", {}).get("scheduledEventId")
            in waits
        ]
        assert results, "the job never read its node's registration"
        [payload] = results[0]["result"]["payloads"]
        assert payload["metadata"]["encoding"] == b64(ENCODING)


GPUPROV = str(Path(sys.executable).parent / "gpuprov")


def clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUPROV_")}


async def test_gpuprov_codec_server_serves_until_interrupted():
    port = free_port()
    key_value = generate_key()
    env = {
        **clean_environment(),
        "GPUPROV_CODEC__KEYS": f'{{k1 = "{key_value}"}}',
        "GPUPROV_CODEC__ACTIVE_KEY": "k1",
        "GPUPROV_CODEC__PORT": str(port),
    }
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        "codec-server",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert process.stdout is not None
    try:
        seen = []
        while not any("Ctrl-C stops" in line for line in seen):
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            assert line, "gpuprov codec-server exited early:\n" + "".join(seen)
            seen.append(line.decode())
        output = "".join(seen)
        assert f"codec server at http://127.0.0.1:{port}; keys k1 (active: k1)" in output
        assert "http://localhost:8233" in output and key_value not in output
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            encoded = await http.post("/encode", json=payloads_json([plain()]))
            decoded = await http.post("/decode", json=encoded.json())
            assert from_json(decoded.json()) == [plain()]
    finally:
        process.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(process.stdout.read(), 30)
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0 and key_value.encode() not in rest


async def test_gpuprov_codec_server_without_keys_says_what_to_configure():
    env = clean_environment()
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        "codec-server",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert "codec-server needs [codec] keys" in stderr.decode()

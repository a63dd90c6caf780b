"""providers/userdata.py: the cloud-init user data aws, gce and lambda create machines with.
What cloud-init itself makes of it (decompression, parts, merging, the schema, the files it
writes, the unit that starts the agent) is in tests/providers/test_node_agent.py."""

from __future__ import annotations

import email
import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers import agent_artifact, node_agent
from providers.base import InstanceSpec, NodeBootstrap
from providers.errors import BlockScope, ErrorKind, ProviderError
from providers.userdata import JOIN_ENV_PATH, compressed_user_data, part_subtype, user_data

LIMIT = 64 * 1024  # room for the agent the bootstrap carries
BOOT = NodeBootstrap(api_url="https://api.example/x?y='\"", join_token="tok-s3cret")


def spec(**fields) -> InstanceSpec:
    return InstanceSpec(vm="v-a1-n0-1", job="v", node_index=0, attempt=1, **fields)


def build(node: InstanceSpec, max_bytes: int = LIMIT) -> str | None:
    return user_data(node, max_bytes=max_bytes, cloud="TestCloud")


def parts(document: str) -> list[email.message.Message]:
    archive = email.message_from_string(document)
    assert archive.get_content_type() == "multipart/mixed"
    return archive.get_payload()


def text_of(part: email.message.Message) -> str:
    return part.get_payload(decode=True).decode("utf-8")


def test_nothing_to_pass_is_none_and_the_specs_own_alone_goes_untouched():
    assert build(spec()) is None
    assert build(spec(user_data="")) is None
    assert build(spec(user_data="#cloud-config\n{}")) == "#cloud-config\n{}"
    assert build(spec(user_data="#!/bin/sh\necho hi\n")) == "#!/bin/sh\necho hi\n"


def bootstrap_files(config_text: str) -> dict[str, dict[str, str]]:
    return {
        entry["path"]: entry
        for entry in json.loads(config_text.removeprefix("#cloud-config\n"))["write_files"]
    }


def test_the_bootstrap_writes_a_root_only_join_env_the_agent_reads():
    (part,) = parts(build(spec(bootstrap=BOOT)))
    assert part.get_content_type() == "text/cloud-config"
    config = text_of(part)
    assert config.startswith("#cloud-config\n")
    write = bootstrap_files(config)[JOIN_ENV_PATH]
    assert write == {
        "path": JOIN_ENV_PATH,
        "permissions": "0600",
        "owner": "root:root",
        # the URL's quotes survive: JSON is YAML, nothing is quoted by hand
        "content": "GPUPROV_API_URL=https://api.example/x?y='\"\n"
        "GPUPROV_JOIN_TOKEN=tok-s3cret\nGPUPROV_VM=v-a1-n0-1\n",
    }
    assert JOIN_ENV_PATH == "/etc/gpuprov/join.env"


def test_the_bootstrap_carries_the_pinned_fetch_not_the_agent_and_starts_its_unit():
    (part,) = parts(build(spec(bootstrap=BOOT)))
    config = json.loads(text_of(part).removeprefix("#cloud-config\n"))
    files = bootstrap_files(text_of(part))
    assert node_agent.AGENT_PATH not in files  # fetched from the API by the unit
    fetch = files[node_agent.FETCH_PATH]
    assert (fetch["permissions"], fetch["owner"]) == ("0644", "root:root")
    assert fetch["content"].encode() == agent_artifact.fetch_source()
    unit = files[node_agent.UNIT_PATH]["content"]
    assert agent_artifact.sha256() in unit and "run --url" in unit
    fetch_url = node_agent.unit_command(unit, "ExecStartPre")[4]
    assert fetch_url == f"{BOOT.api_url}/v1/node/agent.pyz"
    assert node_agent.CA_PATH not in files and "--ca-file" not in unit  # no private CA here
    assert config["runcmd"] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "--no-block", "gpuprov-agent.service"],
    ]


def test_a_private_ca_goes_to_the_node_and_the_agent_pins_it():
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    boot = BOOT.model_copy(update={"ca_pem": pem})
    (part,) = parts(build(spec(bootstrap=boot)))
    files = bootstrap_files(text_of(part))
    assert files[node_agent.CA_PATH] == {
        "path": "/etc/gpuprov/api-ca.pem",
        "permissions": "0644",
        "owner": "root:root",
        "content": pem,
    }
    assert "--ca-file /etc/gpuprov/api-ca.pem" in files[node_agent.UNIT_PATH]["content"]


@pytest.mark.parametrize(
    "url", ["http://api:8080/\nExecStart=/bin/evil", "http://a b", "http://a\tb"]
)
def test_an_api_url_that_could_break_the_unit_is_refused(url):
    boot = NodeBootstrap(api_url=url, join_token="tok-s3cret")
    with pytest.raises(ProviderError) as caught:
        build(spec(bootstrap=boot))
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert "tok-s3cret" not in str(caught.value)


def test_a_byte_cloud_gets_the_bootstrap_gzip_compressed_and_a_spec_alone_as_it_is():
    node = spec(user_data="#!/bin/sh\necho hi\n", bootstrap=BOOT)
    plain = build(node)
    squeezed = compressed_user_data(node, max_bytes=len(plain.encode()), cloud="EC2")
    assert squeezed[:2] == b"\x1f\x8b" and gzip.decompress(squeezed) == plain.encode()
    assert len(squeezed) < len(plain.encode()) // 2
    assert squeezed == compressed_user_data(node.model_copy(), max_bytes=10**6, cloud="EC2")
    with pytest.raises(ProviderError) as caught:
        compressed_user_data(node, max_bytes=len(squeezed) - 1, cloud="EC2")
    assert f"is {len(squeezed)} bytes; EC2 accepts at most" in caught.value.message
    assert compressed_user_data(spec(), max_bytes=10, cloud="EC2") is None
    own = spec(user_data="#!/bin/sh\necho hi\n")  # no bootstrap, within the limit: as it is
    assert compressed_user_data(own, max_bytes=100, cloud="EC2") == b"#!/bin/sh\necho hi\n"
    over = compressed_user_data(own.model_copy(update={"user_data": "#!/bin/sh\n" + "x" * 200}),
                                max_bytes=100, cloud="EC2")  # fmt: skip
    assert over is not None and over[:2] == b"\x1f\x8b"


def test_with_both_the_specs_own_part_comes_first_then_the_bootstrap_appending():
    document = build(spec(user_data="#!/bin/sh\necho hi\n", bootstrap=BOOT))
    both = parts(document)
    assert [p.get_content_type() for p in both] == ["text/x-shellscript", "text/cloud-config"]
    assert text_of(both[0]) == "#!/bin/sh\necho hi\n"
    assert "GPUPROV_JOIN_TOKEN=tok-s3cret" in text_of(both[1])


def test_the_bootstrap_part_appends_to_the_specs_own_write_files():
    # cloud-init merges each part onto those before it; by default a later list replaces an
    # earlier one, so join.env would drop the spec's own files (or the reverse).
    own = '#cloud-config\nwrite_files: [{path: /etc/motd, content: "hi"}]\n'
    both = parts(build(spec(user_data=own, bootstrap=BOOT)))
    assert text_of(both[0]) == own
    config = json.loads(text_of(both[1]).removeprefix("#cloud-config\n"))
    assert {"name": "list", "settings": ["append"]} in config["merge_how"]
    assert JOIN_ENV_PATH in bootstrap_files(text_of(both[1]))


def test_the_same_spec_gives_byte_identical_user_data_and_another_token_another_boundary():
    # EC2 refuses a retried RunInstances whose ClientToken matches but whose user data differs.
    node = spec(user_data="#cloud-config\npackages: [htop]\n", bootstrap=BOOT)
    first, again = build(node), build(node.model_copy())
    assert first == again
    boundary = email.message_from_string(first).get_boundary()
    assert boundary.startswith("gpuprov-") and len(boundary) == len("gpuprov-") + 32
    other = node.model_copy(
        update={"bootstrap": NodeBootstrap(api_url=BOOT.api_url, join_token="tok-2")}
    )
    assert email.message_from_string(build(other)).get_boundary() != boundary


@pytest.mark.parametrize(
    ("text", "subtype"),
    [
        ("#cloud-config\n{}", "cloud-config"),
        ("#cloud-config-archive\n[]", "cloud-config-archive"),
        ("#!/usr/bin/env python3\n", "x-shellscript"),
        ("#include\nhttps://example.com/x", "x-include-url"),
        ("#include-once\nhttps://example.com/x", "x-include-once-url"),
        ("#cloud-boothook\n#!/bin/sh\n", "cloud-boothook"),
        ("#part-handler\n", "part-handler"),
        ("just words", "plain"),  # text/plain: cloud-init guesses the type itself
    ],
)
def test_a_part_is_typed_by_its_first_line_as_cloud_init_does(text, subtype):
    assert part_subtype(text) == subtype
    (part, _) = parts(build(spec(user_data=text, bootstrap=BOOT)))
    assert part.get_content_subtype() == subtype and text_of(part) == text


def test_non_ascii_user_data_survives_the_archive():
    text = "#!/bin/sh\necho 'héllo, 世界'\n"
    (part, _) = parts(build(spec(user_data=text, bootstrap=BOOT)))
    assert text_of(part) == text


def test_over_the_clouds_limit_is_unavailable_there_naming_sizes_not_the_token():
    with pytest.raises(ProviderError) as caught:
        build(spec(user_data="#!/bin/sh\n" + "x" * 2000, bootstrap=BOOT), max_bytes=1000)
    error = caught.value
    # another cloud may take a larger document: fail over, never abort
    assert (error.kind, error.block_scope) == (ErrorKind.UNAVAILABLE, BlockScope.PROVIDER)
    assert "TestCloud accepts at most 1000" in error.message and "v-a1-n0-1" in error.message
    assert "tok-s3cret" not in str(error)
    # exactly at the limit is fine; one byte past it is not
    own = "#!/bin/sh\n" + "x" * 90
    assert build(spec(user_data=own), max_bytes=100) == own
    with pytest.raises(ProviderError):
        build(spec(user_data=own + "x"), max_bytes=100)


def test_user_data_that_is_not_utf8_text_is_invalid_request():
    with pytest.raises(ProviderError) as caught:
        build(spec(user_data="#!/bin/sh\necho \udcff\n", bootstrap=BOOT))
    assert caught.value.kind is ErrorKind.INVALID_REQUEST


@settings(max_examples=60, deadline=None)
@given(own=st.text(max_size=300), token=st.text("abcdefXYZ0123456789-_", min_size=1, max_size=40))
def test_any_own_user_data_round_trips_beside_the_bootstrap(own, token):
    boot = NodeBootstrap(api_url="http://api:8080", join_token=token)
    node = spec(user_data=own, bootstrap=boot)
    try:
        own.encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(ProviderError):
            build(node, max_bytes=10**6)
        return
    document = build(node, max_bytes=10**6)
    assert document == build(node, max_bytes=10**6)
    texts = [text_of(p) for p in parts(document)]
    write = bootstrap_files(texts[-1])[JOIN_ENV_PATH]
    assert f"\nGPUPROV_JOIN_TOKEN={token}\n" in write["content"]
    assert texts[:-1] == ([own] if own else [])


def test_line_ends_reach_cloud_init_as_the_spec_wrote_them():
    text = "#!/bin/sh\r\necho hi\r\n"
    (part, _) = parts(build(spec(user_data=text, bootstrap=BOOT)))
    assert text_of(part) == text


@pytest.mark.parametrize(
    ("notices", "argv"),
    [
        (node_agent.NO_NOTICES, []),
        (node_agent.EC2_NOTICES, ["--notices", "ec2"]),
        (node_agent.GCE_NOTICES, ["--notices", "gce"]),
    ],
)
def test_a_node_on_ec2_or_gce_watches_its_clouds_notices_and_the_others_none(notices, argv):
    document = user_data(spec(bootstrap=BOOT), max_bytes=LIMIT, cloud="T", notices=notices)
    (part,) = parts(document)
    unit = bootstrap_files(text_of(part))[node_agent.UNIT_PATH]["content"]
    start = node_agent.unit_command(unit, "ExecStart")
    watched = start[start.index("--notices") :][:2] if "--notices" in start else []
    assert watched == argv
    assert "--metadata-url" not in start  # only the fake cloud's tests point it elsewhere

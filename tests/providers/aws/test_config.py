"""`[providers.aws]`: defaults, validation, and credentials from the standard AWS chain only."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuprov.config import ProvidersSettings, load_settings
from providers import build_all
from providers.aws.cloud import AwsCloud
from providers.aws.config import DEFAULT_INSTANCE_TYPES, AwsConfig
from providers.settings import MissingCredentials


@pytest.fixture
def empty_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An AWS chain with nothing in it: no keys, no files, no instance metadata."""
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


def test_the_section_alone_enables_us_east_1_with_the_gpu_catalogue():
    config = AwsConfig()
    assert config.regions == ["us-east-1"]
    assert config.instance_types == DEFAULT_INSTANCE_TYPES
    assert "p5.48xlarge" in config.instance_types
    assert config.spot is True and config.ssh_user == "ubuntu"
    assert (config.boot_timeout, config.delete_timeout, config.poll_interval) == (900, 600, 10)
    assert config.pricing_endpoint is None  # the real Price List API


def test_a_stand_in_endpoint_also_serves_pricing_so_tests_never_reach_aws():
    assert AwsConfig(endpoint_url="http://127.0.0.1:5000").pricing_endpoint == (
        "http://127.0.0.1:5000"
    )
    config = AwsConfig(endpoint_url="http://127.0.0.1:1", pricing_endpoint_url="http://[::1]:2")
    assert config.pricing_endpoint == "http://[::1]:2"


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({"regions": []}, "at least 1"),
        ({"regions": ["US East"]}, "not an AWS region name"),
        ({"regions": ["us-east-1", "us-east-1"]}, "more than once"),
        ({"zones": {"eu-west-1": ["eu-west-1a"]}}, "not in `regions`"),
        ({"zones": {"us-east-1": ["us-west-2a"]}}, "us-west-2a not in us-east-1"),
        ({"images": {"us-east-1": "ubuntu-22.04"}}, "not an AMI id"),
        ({"endpoint_url": "127.0.0.1:5000"}, "not an http(s) URL"),
        ({"root_volume_gb": 4}, "greater than or equal to 8"),
        ({"access_key_id": "AKIA..."}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_settings_are_refused_naming_the_problem(settings, complaint):
    with pytest.raises(ValidationError) as raised:
        AwsConfig(**settings)
    assert complaint in str(raised.value)


def test_the_toml_section_is_read_into_aws_config(tmp_path: Path):
    path = tmp_path / "gpuprov.toml"
    path.write_text(
        "[providers.aws]\n"
        'regions = ["us-east-1", "eu-west-1"]\n'
        'zones = {us-east-1 = ["us-east-1a"]}\n'
        'instance_types = ["p5.48xlarge"]\n'
        'images = {eu-west-1 = "ami-0abcdef1234567890"}\n'
        "spot = false\n"
    )
    aws = load_settings(path, env={}).providers.aws
    assert isinstance(aws, AwsConfig)
    assert aws.regions == ["us-east-1", "eu-west-1"]
    assert aws.images == {"eu-west-1": "ami-0abcdef1234567890"} and aws.spot is False


def test_no_credentials_anywhere_is_missing_credentials_saying_how_to_supply_them(empty_chain):
    with pytest.raises(MissingCredentials) as raised:
        AwsCloud(AwsConfig())
    assert "AWS_ACCESS_KEY_ID" in str(raised.value)
    assert "profile" in str(raised.value)


def test_an_unknown_profile_is_missing_credentials_naming_it(empty_chain):
    with pytest.raises(MissingCredentials, match="profile 'gpu-fleet' not found"):
        AwsCloud(AwsConfig(profile="gpu-fleet"))


async def test_the_registry_skips_aws_without_credentials_and_builds_it_with_them(
    empty_chain, monkeypatch
):
    settings = ProvidersSettings(aws=AwsConfig())
    built = build_all(settings)
    assert "aws" not in built.providers
    assert "no AWS credentials" in built.skipped["aws"]

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example-secret-never-logged")
    built = build_all(settings)
    cloud = built.providers["aws"]
    assert isinstance(cloud, AwsCloud) and built.skipped == {}
    assert "example-secret" not in repr(vars(cloud))
    await cloud.aclose()


def test_a_named_profile_in_the_shared_files_is_found(empty_chain):
    (empty_chain / "credentials").write_text(
        "[gpu-fleet]\naws_access_key_id = AKIAEXAMPLEEXAMPLE00\naws_secret_access_key = x\n"
    )
    AwsCloud(AwsConfig(profile="gpu-fleet"))  # no MissingCredentials

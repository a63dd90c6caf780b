"""Settings: the TOML file, environment overrides, and errors that name the setting.

Every test passes `env=` explicitly so the process environment never leaks in."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest

from gpuprov.config import (
    ConfigError,
    FakeProviderConfig,
    FaultRule,
    ProvidersSettings,
    Settings,
    TemporalSettings,
    default_data_dir,
    load_settings,
)
from gpuprov.engine.worker import node_ca_pem
from gpuprov.sdk.pem import SettingError
from providers.errors import ErrorKind
from tests.tls import Pki

CONFIG = """\
[temporal]
address = "temporal.internal:7233"
namespace = "gpu"
task_queue = "gpuprov-prod"

[database]
url = "postgresql://gpuprov@db/gpuprov"

[api]
host = "0.0.0.0"
port = 9090

[providers.fake]
boot_delay_seconds = 0.25
delete_delay_seconds = 0.1
state_path = "/tmp/fake.db"

[[providers.fake.regions]]
name = "r1"
zones = ["r1-a", "r1-b"]

[[providers.fake.instance_types]]
name = "gpu8"
gpu = "H100"
gpu_count = 8
price = 10.0
spot_price = 4.0

[[providers.fake.faults]]
primitive = "create"
kind = "Capacity"
message = "sold out"
region = "r1"
times = 2

[[providers.fake.faults]]
primitive = "observe"
effect = "delay"
delay_seconds = 1.5
after = 3
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "gpuprov.toml"
    path.write_text(CONFIG)
    return path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpuprov.toml"
    path.write_text(text)
    return path


def config_error(path: Path | None = None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env=env or {})
    return str(caught.value)


# ---------------------------------------------------------------- the file


def defaults(env: dict[str, str]) -> Settings:
    """Settings() as load_settings gives them: the data dir filled in, per user."""
    return Settings(temporal=TemporalSettings(data_dir=default_data_dir(env)))


def test_no_file_and_no_env_gives_the_defaults() -> None:
    settings = load_settings(env={})
    assert settings == defaults({})
    assert settings.temporal.address == "localhost:7233"
    assert settings.providers.fake is None
    assert settings.providers.enabled_ids() == []


def test_file_sections_are_read(config_file: Path) -> None:
    settings = load_settings(config_file, env={})
    assert settings.temporal.address == "temporal.internal:7233"
    assert settings.temporal.namespace == "gpu"
    assert settings.temporal.task_queue == "gpuprov-prod"
    assert settings.temporal.ui_port == 8233  # untouched settings keep their defaults
    assert settings.database.url == "postgresql://gpuprov@db/gpuprov"
    assert (settings.api.host, settings.api.port) == ("0.0.0.0", 9090)


def test_fake_provider_section_is_read(config_file: Path) -> None:
    fake = load_settings(str(config_file), env={}).providers.fake
    assert isinstance(fake, FakeProviderConfig)
    assert fake.enabled is True
    assert (fake.boot_delay_seconds, fake.delete_delay_seconds) == (0.25, 0.1)
    assert fake.state_path == "/tmp/fake.db"
    assert [(r.name, r.zones) for r in fake.regions] == [("r1", ["r1-a", "r1-b"])]
    (gpu8,) = fake.instance_types
    assert (gpu8.name, gpu8.gpu, gpu8.gpu_count, gpu8.price, gpu8.spot_price) == (
        "gpu8",
        "H100",
        8,
        10.0,
        4.0,
    )


def test_fault_rules_are_read(config_file: Path) -> None:
    fake = load_settings(config_file, env={}).providers.fake
    assert fake is not None
    assert fake.faults == [
        FaultRule(
            primitive="create", kind=ErrorKind.CAPACITY, message="sold out", region="r1", times=2
        ),
        FaultRule(primitive="observe", effect="delay", delay_seconds=1.5, after=3),
    ]
    assert fake.faults[1].kind is ErrorKind.TRANSIENT  # the default kind


def test_config_path_comes_from_gpuprov_config(config_file: Path) -> None:
    settings = load_settings(env={"GPUPROV_CONFIG": str(config_file)})
    assert settings.temporal.address == "temporal.internal:7233"


def test_explicit_path_wins_over_gpuprov_config(config_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text('[temporal]\naddress = "other:7233"\n')
    settings = load_settings(other, env={"GPUPROV_CONFIG": str(config_file)})
    assert settings.temporal.address == "other:7233"


# ---------------------------------------------------------------- environment overrides


def test_env_overrides_the_temporal_address(config_file: Path) -> None:
    env = {"GPUPROV_TEMPORAL__ADDRESS": "temporal:7233"}
    settings = load_settings(config_file, env=env)
    assert settings.temporal.address == "temporal:7233"
    assert settings.temporal.namespace == "gpu"  # the rest of the section stays


def test_env_overrides_a_fake_provider_number(config_file: Path) -> None:
    env = {"GPUPROV_PROVIDERS__FAKE__BOOT_DELAY_SECONDS": "5"}
    fake = load_settings(config_file, env=env).providers.fake
    assert fake is not None
    assert fake.boot_delay_seconds == 5.0
    assert len(fake.faults) == 2 and fake.regions[0].name == "r1"


def test_env_alone_can_enable_the_fake_provider() -> None:
    settings = load_settings(env={"GPUPROV_PROVIDERS__FAKE__BOOT_DELAY_SECONDS": "0.5"})
    assert settings.providers.fake is not None
    assert settings.providers.fake.boot_delay_seconds == 0.5
    assert settings.providers.enabled_ids() == ["fake"]


def test_env_values_parse_as_toml_literals() -> None:
    env = {
        "GPUPROV_API__PORT": "8181",
        "GPUPROV_PROVIDERS__FAKE__ENABLED": "false",
        "GPUPROV_PROVIDERS__FAKE__REGIONS": '[{name = "r9"}]',
    }
    settings = load_settings(env=env)
    assert settings.api.port == 8181
    fake = settings.providers.fake
    assert fake is not None and fake.enabled is False
    assert [r.name for r in fake.regions] == ["r9"]


def test_env_names_are_case_insensitive_below_the_prefix() -> None:
    settings = load_settings(env={"GPUPROV_Temporal__Namespace": "prod"})
    assert settings.temporal.namespace == "prod"


def test_unrelated_env_variables_are_ignored() -> None:
    env = {"HOME": "/root", "GPUPROV_VERBOSE": "1", "OTHER__THING": "x", "GPUPROV_CONFIG": ""}
    assert load_settings(env=env) == defaults(env)


def test_env_override_of_a_string_setting_keeps_numeric_looking_values() -> None:
    # BUG: _parse_env_value reads every value as a TOML literal, so a namespace or task queue
    # that looks like a number or boolean becomes int/bool and the str field rejects it:
    # ConfigError "temporal.namespace: Input should be a valid string". Every setting is meant
    # to be overridable by an environment variable (gpuprov/config.py).
    env = {"GPUPROV_TEMPORAL__NAMESPACE": "2024", "GPUPROV_TEMPORAL__TASK_QUEUE": "true"}
    try:
        settings = load_settings(env=env)
    except ConfigError as error:
        pytest.fail(f"numeric-looking string override rejected: {error}")
    assert (settings.temporal.namespace, settings.temporal.task_queue) == ("2024", "true")


def test_env_below_a_scalar_setting_is_an_error_naming_the_variable(config_file: Path) -> None:
    message = config_error(config_file, env={"GPUPROV_TEMPORAL__ADDRESS__HOST": "x"})
    assert message == "GPUPROV_TEMPORAL__ADDRESS__HOST: address is not a section"


def test_bad_env_value_is_a_config_error_naming_the_setting() -> None:
    message = config_error(env={"GPUPROV_API__PORT": "eighty"})
    assert message.startswith("invalid config: api.port:")


# ---------------------------------------------------------------- errors


def test_unknown_setting_is_rejected_naming_it(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, '[temporal]\nadress = "x:7233"\n'))
    assert message == "invalid config: temporal.adress: Extra inputs are not permitted"


def test_unknown_section_is_rejected_naming_it(tmp_path: Path) -> None:
    assert "temporl: Extra inputs are not permitted" in config_error(
        write(tmp_path, '[temporl]\naddress = "x"\n')
    )


def test_unknown_provider_section_is_rejected_naming_it(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "[providers.azure]\nenabled = true\n"))
    assert "providers.azure: Extra inputs are not permitted" in message


def test_unknown_fault_field_is_rejected_naming_its_path(tmp_path: Path) -> None:
    text = '[providers.fake]\n[[providers.fake.faults]]\nprimitive = "create"\ntimez = 1\n'
    message = config_error(write(tmp_path, text))
    assert "providers.fake.faults.0.timez: Extra inputs are not permitted" in message


def test_bad_fault_effect_is_rejected_naming_it(tmp_path: Path) -> None:
    text = '[[providers.fake.faults]]\nprimitive = "create"\neffect = "explode"\n'
    assert "providers.fake.faults.0.effect:" in config_error(write(tmp_path, text))


def test_unknown_env_setting_is_rejected_naming_it() -> None:
    message = config_error(env={"GPUPROV_TEMPORAL__ADRESS": "x"})
    assert "temporal.adress: Extra inputs are not permitted" in message


def test_malformed_file_is_rejected_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "[temporal\naddress = \n")
    assert config_error(path).startswith(f"malformed config {path}:")


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    # BUG: load_settings catches OSError and TOMLDecodeError around read_text(), not
    # UnicodeDecodeError, so a config file that is not UTF-8 escapes as a raw traceback.
    path = tmp_path / "gpuprov.toml"
    path.write_bytes(b"\xff\xfe[temporal]\n")
    try:
        load_settings(path, env={})
    except ConfigError as error:
        assert str(path) in str(error)
    except UnicodeDecodeError as error:
        pytest.fail(f"load_settings leaked {error!r} instead of raising ConfigError")
    else:
        pytest.fail("a non-UTF-8 config file was accepted")


def test_missing_file_is_rejected_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    assert config_error(path) == f"cannot read config {path}: No such file or directory"


def test_missing_file_named_by_gpuprov_config_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    assert config_error(env={"GPUPROV_CONFIG": str(path)}).startswith(f"cannot read config {path}")


# ---------------------------------------------------------------- enabled_ids


def test_enabled_ids_lists_present_enabled_sections() -> None:
    assert ProvidersSettings(fake=FakeProviderConfig()).enabled_ids() == ["fake"]


def test_enabled_ids_skips_disabled_and_absent_sections() -> None:
    assert ProvidersSettings().enabled_ids() == []
    assert ProvidersSettings(fake=FakeProviderConfig(enabled=False)).enabled_ids() == []


def test_enabled_ids_from_a_file(tmp_path: Path) -> None:
    enabled = load_settings(write(tmp_path, "[providers.fake]\n"), env={})
    disabled = load_settings(write(tmp_path, "[providers.fake]\nenabled = false\n"), env={})
    assert enabled.providers.enabled_ids() == ["fake"]
    assert disabled.providers.enabled_ids() == []


# ---------------------------------------------------------------- secure connections


def test_temporal_tls_and_api_key_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[temporal]\naddress = "ns.acct.tmprl.cloud:7233"\n'
        '[temporal.tls]\nclient_cert_file = "/etc/gpuprov/client.pem"\n'
        'client_key_file = "/etc/gpuprov/client.key"\nserver_name = "ns.acct.tmprl.cloud"\n',
    )
    env = {"GPUPROV_TEMPORAL__TLS__SERVER_CA_FILE": "/etc/gpuprov/ca.pem"}
    tls = load_settings(path, env=env).temporal.tls
    assert tls.client_cert_file == "/etc/gpuprov/client.pem"
    assert tls.server_ca_file == "/etc/gpuprov/ca.pem" and tls.configured

    key = "abc.DEF-123_456"
    temporal = load_settings(env={"GPUPROV_TEMPORAL__API_KEY": key}).temporal
    assert temporal.api_key is not None and temporal.api_key.get_secret_value() == key
    assert key not in repr(temporal) and key not in str(temporal)  # a SecretStr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"GPUPROV_TEMPORAL__API_KEY": "k", "GPUPROV_TEMPORAL__API_KEY_FILE": "/k"},
            "temporal: Value error, give api_key or api_key_file, not both",
        ),
        (
            {"GPUPROV_TEMPORAL__TLS__CLIENT_CERT_FILE": "/c.pem"},
            "temporal.tls: Value error, client_cert(_file) and client_key(_file) go together",
        ),
        (
            {
                "GPUPROV_TEMPORAL__TLS__SERVER_CA": "-----BEGIN",
                "GPUPROV_TEMPORAL__TLS__SERVER_CA_FILE": "/ca.pem",
            },
            "temporal.tls: Value error, give server_ca or server_ca_file, not both",
        ),
        (
            {"GPUPROV_API__TLS_CERT_FILE": "/api.pem"},
            "api: Value error, tls_cert_file and tls_key_file go together (HTTPS)",
        ),
    ],
)
def test_half_a_secure_connection_is_rejected_naming_it(env: dict[str, str], expected: str) -> None:
    assert config_error(env=env).startswith(f"invalid config: {expected}")


def test_the_api_url_is_https_once_it_has_a_certificate() -> None:
    env = {"GPUPROV_API__TLS_CERT_FILE": "/a.pem", "GPUPROV_API__TLS_KEY_FILE": "/a.key"}
    assert load_settings(env=env).api.url == "https://127.0.0.1:8080"
    assert load_settings(env={}).api.url == "http://127.0.0.1:8080"


# ---------------------------------------------------------------- the SSH client key


def test_the_ssh_client_key_comes_from_the_file_or_the_environment_as_a_secret(
    tmp_path: Path,
) -> None:
    pem = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    ssh = load_settings(env={"GPUPROV_SSH__CLIENT_KEY": pem}).ssh
    assert ssh.client_key is not None and ssh.client_key.get_secret_value() == pem
    assert ssh.configured and pem not in repr(ssh) and pem.splitlines()[1] not in str(ssh)

    path = write(tmp_path, '[ssh]\nclient_key_file = "/run/secrets/gpuprov-ssh-key"\n')
    from_file = load_settings(path, env={}).ssh
    assert from_file.client_key_file == "/run/secrets/gpuprov-ssh-key" and from_file.configured
    assert not load_settings(env={}).ssh.configured


def test_an_ssh_client_key_given_twice_is_rejected_without_quoting_it() -> None:
    env = {"GPUPROV_SSH__CLIENT_KEY": "secret-key-text", "GPUPROV_SSH__CLIENT_KEY_FILE": "/k"}
    message = config_error(env=env)
    assert message.startswith(
        "invalid config: ssh: Value error, give client_key or client_key_file, not both"
    )
    assert "secret-key-text" not in message


def test_the_ca_nodes_pin_goes_with_an_https_api_only() -> None:
    env = {"GPUPROV_API__PUBLIC_URL": "https://api.internal:8443", "GPUPROV_API__CA_FILE": "/ca"}
    assert load_settings(env=env).api.ca_file == "/ca"
    plain = {"GPUPROV_API__CA_FILE": "/ca"}  # nodes would reach http://127.0.0.1:8080
    assert "ca_file pins the CA of an https API" in config_error(env=plain)


def test_the_workers_read_the_ca_file_once_and_refuse_one_that_is_no_certificate(
    tmp_path: Path,
) -> None:
    pki = Pki(tmp_path / "pki")
    assert node_ca_pem(None) is None
    assert node_ca_pem(str(pki.ca)) == pki.ca.read_text()
    with pytest.raises(SettingError, match=r"api.ca_file \(.*\): not a PEM certificate"):
        node_ca_pem(str(pki.path("server.key")))
    with pytest.raises(SettingError, match=r"api.ca_file \(.*\): cannot read it"):
        node_ca_pem(str(tmp_path / "missing.pem"))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://x", "must be http:// or https://, not ftp scheme"),
        ("cp.example:8080", "must be http:// or https://"),
        ("https://", "names no host"),
        ("http://ops:hunter2-pass@cp.example", "must not carry credentials"),
    ],
)
def test_a_public_url_nodes_cannot_use_is_refused_naming_the_field(tmp_path, url, said):
    error = config_error(write(tmp_path, f'[api]\npublic_url = "{url}"\n'))
    assert error.startswith("invalid config: api.public_url: Value error, "), error
    assert said in error
    assert "hunter2" not in error


# ---------------------------------------------------------------- the data dir, the client


def test_the_data_dir_never_depends_on_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    home = {"HOME": "/home/ada"}
    assert load_settings(env=home).temporal.data_dir == "/home/ada/.local/share/gpuprov"
    xdg = {**home, "XDG_DATA_HOME": "/var/xdg"}
    assert load_settings(env=xdg).temporal.data_dir == "/var/xdg/gpuprov"
    relative_xdg = {**home, "XDG_DATA_HOME": "xdg"}  # the spec: a relative one is ignored
    assert load_settings(env=relative_xdg).temporal.data_dir == "/home/ada/.local/share/gpuprov"
    settings = load_settings(env=home)
    assert settings.database_url == "sqlite:////home/ada/.local/share/gpuprov/gpuprov.db"

    elsewhere = tmp_path / "etc" / "gpuprov.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text('[temporal]\ndata_dir = "state"\n')
    from_file = load_settings(elsewhere, env=home).temporal.data_dir
    assert from_file == str(tmp_path / "etc" / "state")  # next to the file, not the cwd
    elsewhere.write_text('[temporal]\ndata_dir = "/srv/gpuprov"\n')
    assert load_settings(elsewhere, env=home).temporal.data_dir == "/srv/gpuprov"
    elsewhere.write_text("[api]\nport = 9000\n")  # a file that names none: the user's
    assert load_settings(elsewhere, env=home).temporal.data_dir == "/home/ada/.local/share/gpuprov"

    env = {**home, "GPUPROV_TEMPORAL__DATA_DIR": "/tmp/d"}
    assert load_settings(elsewhere, env=env).temporal.data_dir == "/tmp/d"
    assert TemporalSettings().data_dir == ".data"  # settings built in code, as before


def test_the_client_section_and_its_fallbacks(tmp_path: Path) -> None:
    settings = load_settings(env={})
    assert settings.client.api_key is None
    assert (settings.client_api_url, settings.client_ca_file) == ("http://127.0.0.1:8080", None)

    path = write(
        tmp_path,
        '[api]\npublic_url = "https://cp.internal:8443"\nca_file = "/etc/ca.pem"\n'
        '[client]\napi_key = "gpo_from_file"\n',
    )
    settings = load_settings(path, env={})
    assert settings.client.api_key is not None
    assert settings.client.api_key.get_secret_value() == "gpo_from_file"
    assert "gpo_from_file" not in repr(settings) and "gpo_from_file" not in str(settings)
    assert (settings.client_api_url, settings.client_ca_file) == (
        "https://cp.internal:8443",
        "/etc/ca.pem",
    )

    env = {
        "GPUPROV_CLIENT__API_URL": "https://other:9443",
        "GPUPROV_CLIENT__CA_FILE": "/etc/other.pem",
        "GPUPROV_API_KEY": "gpo_plain",
    }
    settings = load_settings(path, env=env)
    assert settings.client.api_key is not None
    assert settings.client.api_key.get_secret_value() == "gpo_plain"
    assert (settings.client_api_url, settings.client_ca_file) == (
        "https://other:9443",
        "/etc/other.pem",
    )
    both = {**env, "GPUPROV_CLIENT__API_KEY": "gpo_nested"}  # the section's own name wins
    key = load_settings(path, env=both).client.api_key
    assert key is not None and key.get_secret_value() == "gpo_nested"

    message = config_error(env={"GPUPROV_CLIENT__API_URL": "https://user:pw@cp:8443"})
    assert "client.api_url" in message and "pw" not in message

"""docker-compose.yml and the Dockerfile, checked against the code (no Docker engine needed).

Every service built from this repository must run a real entry point, every GPUPROV_* variable
must be a setting that lands where compose means it to, ports must be the ports the code
listens on, the image must install from the lock file, and no secret may be written down.
"""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from gpuprov.api.app import create_app
from gpuprov.cli import main as cli
from gpuprov.config import CONFIG_ENV, ENV_PREFIX, Settings, load_settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
# What the operator exports before `docker compose up` (docs/operations.md).
OPERATOR_ENV = {
    "POSTGRES_PASSWORD": "pw-from-operator-env",
    "GPUPROV_API__PUBLIC_URL": "https://gpuprov.example.com",
}
SECRET_NAME = re.compile(r"PASSWORD|PWD|TOKEN|SECRET|API_KEY|ACCESS_KEY|PRIVATE_KEY", re.I)
INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")
BUILT = sorted(name for name, service in SERVICES.items() if "build" in service)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?error} and $$ escapes."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if env.get(name):
            return env[name]
        if op and op.endswith("?"):
            raise KeyError(f"compose needs {name}: {arg}")
        return arg if op and op.endswith("-") else ""

    parts = value.split("$$")
    return "$".join(INTERPOLATION.sub(one, part) for part in parts)


def environment(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {name: str(value) for name, value in raw.items()}


def resolved_environment(name: str) -> dict[str, str]:
    return {k: interpolate(v, OPERATOR_ENV) for k, v in environment(SERVICES[name]).items()}


def settings_of(name: str) -> Settings:
    """The settings the service's process would load (its config file aside)."""
    env = {k: v for k, v in resolved_environment(name).items() if k != CONFIG_ENV}
    return load_settings(env=env)


def command(service: dict[str, Any]) -> list[str]:
    raw = service.get("command")
    if raw is None:
        return dockerfile_cmd()
    return shlex.split(raw) if isinstance(raw, str) else [str(part) for part in raw]


def dockerfile_cmd() -> list[str]:
    match = re.search(r"^CMD\s+(\[.*\])\s*$", DOCKERFILE, re.M)
    assert match, "the Dockerfile has no exec-form CMD"
    return yaml.safe_load(match[1])


def copy_sources() -> list[list[str]]:
    """The sources of each COPY instruction (the last word is the destination)."""
    return [line.split()[:-1] for line in re.findall(r"^COPY\s+(.*)$", DOCKERFILE, re.M)]


def subcommands() -> set[str]:
    parser = cli.build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name for action in actions for name in action.choices}


def published(service: dict[str, Any]) -> list[tuple[str | None, int, int]]:
    """(host interface or None for all, host port, container port) per `ports` entry, in the
    short syntax ("8080", "8080:80", "127.0.0.1:8080:80")."""
    entries = []
    for entry in service.get("ports", []):
        parts = str(entry).split("/")[0].split(":")
        interface = (":".join(parts[:-2]) or None) if len(parts) > 2 else None
        host_port = parts[-2] if len(parts) > 1 else parts[-1]
        entries.append((interface, int(host_port), int(parts[-1])))
    return entries


def port_mappings(service: dict[str, Any]) -> dict[int, int]:
    """container port -> published host port."""
    return {container: host for _, host, container in published(service)}


def host_and_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def assert_entry_point(argv: list[str]) -> None:
    if argv[:2] == ["python", "worker.py"]:
        assert (REPO / "worker.py").is_file()
        import worker

        assert callable(worker.main)
    elif argv[0] == "gpuprov":
        assert len(argv) > 1 and argv[1] in subcommands(), f"no `gpuprov {argv[1:]}` command"
        cli.build_parser().parse_args(argv[1:])  # its flags parse too
    else:
        pytest.fail(f"{argv} is not an entry point of this project")


# ---------------------------------------------------------------- commands


def test_some_services_are_built_from_this_repository() -> None:
    assert {"setup", "worker", "api"} <= set(BUILT)


@pytest.mark.parametrize("name", BUILT)
def test_every_built_service_runs_a_real_entry_point(name: str) -> None:
    assert SERVICES[name]["build"] in (".", {"context": "."})
    assert_entry_point(command(SERVICES[name]))


def test_the_image_default_is_the_worker() -> None:
    assert dockerfile_cmd() == ["python", "worker.py"]
    assert_entry_point(dockerfile_cmd())


def test_setup_runs_once_after_temporal_and_postgres_and_gates_the_rest() -> None:
    setup = SERVICES["setup"]
    assert command(setup) == ["gpuprov", "setup"]
    assert setup["restart"] == "no"
    assert setup["depends_on"]["temporal"]["condition"] == "service_healthy"
    assert setup["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("worker", "api"):
        condition = SERVICES[name]["depends_on"]["setup"]["condition"]
        assert condition == "service_completed_successfully"


# ---------------------------------------------------------------- environment and ports


@pytest.mark.parametrize("name", BUILT)
def test_every_gpuprov_variable_is_a_setting_and_lands_where_meant(name: str) -> None:
    env = resolved_environment(name)
    settings = settings_of(name)  # unknown names raise: every section forbids extra keys
    dumped = settings.model_dump()
    for variable, value in env.items():
        assert variable.startswith(ENV_PREFIX), f"{name}: {variable} is not read by gpuprov"
        if variable == CONFIG_ENV:
            continue
        path = variable[len(ENV_PREFIX) :].lower().split("__")
        landed: Any = dumped
        for part in path:
            landed = landed[part]
        assert str(landed) == value, f"{name}: {variable}={value!r} landed as {landed!r}"


def test_gpuprov_variables_named_by_interpolation_are_settings_too() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    names = {m["name"] for m in INTERPOLATION.finditer(text) if m["name"].startswith(ENV_PREFIX)}
    assert names  # GPUPROV_API__PUBLIC_URL at least
    for variable in names:
        # A value each setting accepts: a URL where one is asked for (public_url must be http(s)).
        value = "http://x" if variable.endswith("_URL") else "x"
        load_settings(env={variable: value})


@pytest.mark.parametrize("name", BUILT)
def test_gpuprov_services_reach_temporal_and_postgres_by_service_name(name: str) -> None:
    settings = settings_of(name)
    temporal_host, temporal_port = host_and_port(settings.temporal.address)
    assert settings.temporal.address == "temporal:7233"
    assert temporal_host in SERVICES and temporal_port in port_mappings(SERVICES[temporal_host])

    url = make_url(settings.database_url)
    postgres = environment(SERVICES["postgres"])
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port) == ("postgres", 5432)
    assert url.username == postgres["POSTGRES_USER"]
    assert url.database == postgres["POSTGRES_DB"]
    assert url.password == OPERATOR_ENV["POSTGRES_PASSWORD"]
    assert settings.api.url == OPERATOR_ENV["GPUPROV_API__PUBLIC_URL"]


def test_every_gpuprov_service_agrees_on_cluster_namespace_queue_and_database() -> None:
    shared = {
        (s.temporal.address, s.temporal.namespace, s.temporal.task_queue, s.database_url)
        for s in map(settings_of, BUILT)
    }
    assert len(shared) == 1


def test_the_api_listens_where_compose_publishes_and_probes() -> None:
    api = SERVICES["api"]
    settings = settings_of("api")
    assert settings.api.host == "0.0.0.0"
    assert settings.api.port in port_mappings(api)  # GPUPROV_API__PORT, else ApiSettings' 8080
    assert port_mappings(api)[settings.api.port] == 8080
    probe = " ".join(api["healthcheck"]["test"])
    url = re.search(r"http://[\w.]+:(\d+)(/\S*?)'", probe)
    assert url, probe
    assert int(url[1]) == settings.api.port
    routes = {route.path for route in create_app(None).routes}  # type: ignore[arg-type]
    assert url[2] in routes
    assert re.search(rf"^EXPOSE\b.*\b{settings.api.port}\b", DOCKERFILE, re.M)


def test_the_worker_reads_its_config_from_a_mounted_secret() -> None:
    worker = SERVICES["worker"]
    path = resolved_environment("worker")[CONFIG_ENV]
    name = path.removeprefix("/run/secrets/")
    assert path.startswith("/run/secrets/") and name in worker["secrets"]
    assert name in COMPOSE["secrets"] and "file" in COMPOSE["secrets"][name]
    # The file stays on the host: never in the image, never committed.
    config_file = COMPOSE["secrets"][name]["file"].removeprefix("./")
    assert config_file in (REPO / ".dockerignore").read_text().split()
    for sources in copy_sources():
        assert config_file not in sources and "." not in sources


# Published on every interface on purpose: GPU nodes must reach the API, which authenticates
# every call. Everything else is published on loopback or not at all.
PUBLIC_SERVICES = {"api"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_what_has_no_authentication_is_published_on_loopback_only(name: str) -> None:
    for interface, host_port, _ in published(SERVICES[name]):
        if name in PUBLIC_SERVICES:
            continue
        assert interface == "127.0.0.1", (
            f"{name} publishes {host_port} on every interface; it has no authentication"
        )


def test_temporal_and_its_ui_stay_reachable_from_this_host() -> None:
    assert published(SERVICES["temporal"]) == [("127.0.0.1", 7233, 7233)]
    assert published(SERVICES["temporal-ui"]) == [("127.0.0.1", 8233, 8080)]
    assert SERVICES["postgres"].get("ports") is None  # the compose network only


def test_temporal_ui_points_at_the_temporal_frontend() -> None:
    ui = environment(SERVICES["temporal-ui"])
    host, port = host_and_port(ui["TEMPORAL_ADDRESS"])
    assert host == "temporal" and port in port_mappings(SERVICES["temporal"])
    assert ui["TEMPORAL_ADDRESS"] == settings_of("worker").temporal.address


def test_temporal_is_backed_by_the_postgres_service() -> None:
    temporal = environment(SERVICES["temporal"])
    postgres = environment(SERVICES["postgres"])
    assert temporal["DB"] == "postgres12" and temporal["POSTGRES_SEEDS"] == "postgres"
    assert temporal["POSTGRES_USER"] == postgres["POSTGRES_USER"]
    assert temporal["POSTGRES_PWD"] == postgres["POSTGRES_PASSWORD"]


# ---------------------------------------------------------------- secrets


def secret_values() -> list[tuple[str, str]]:
    found = []
    for service_name, service in SERVICES.items():
        for variable, value in environment(service).items():
            found.append((f"{service_name}.{variable}", value))
    for anchor in ("x-gpuprov-environment",):
        found += [(f"{anchor}.{k}", str(v)) for k, v in COMPOSE.get(anchor, {}).items()]
    return found


def assert_from_environment(where: str, value: str) -> None:
    match = INTERPOLATION.fullmatch(value)
    assert match, f"{where} must come from the environment, not be written down: {value!r}"
    assert match["op"] in (None, ":?", "?"), f"{where} must not have a committed default"


@pytest.mark.parametrize(
    ("where", "value"), secret_values(), ids=[where for where, _ in secret_values()]
)
def test_no_secret_is_written_into_compose(where: str, value: str) -> None:
    if SECRET_NAME.search(where.rsplit(".", 1)[1]):
        assert_from_environment(where, value)
    if "://" in value and "@" in value:  # a URL with credentials: the password part
        userinfo = value.split("://", 1)[1].rsplit("@", 1)[0]
        if ":" in userinfo:
            assert_from_environment(where, userinfo.split(":", 1)[1])


def test_secrets_are_required_from_the_operator() -> None:
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        interpolate(environment(SERVICES["postgres"])["POSTGRES_PASSWORD"], {})


def test_the_dockerfile_installs_from_the_lock_file_as_a_non_root_user() -> None:
    assert re.search(r"^FROM python:3\.11-slim\b", DOCKERFILE, re.M)
    assert any("constraints.txt" in sources for sources in copy_sources())
    install = re.search(r"^RUN pip install (.*)$", DOCKERFILE, re.M)
    assert install and re.search(r"(^|\s)-c constraints\.txt(\s|$)", install[1])
    assert "--no-cache-dir" in install[1]
    user = re.findall(r"^USER\s+(\S+)", DOCKERFILE, re.M)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"^EXPOSE\b.*\b9464\b", DOCKERFILE, re.M)  # the worker's metrics
    for line in re.findall(r"^(?:ENV|ARG)\s+(.*)$", DOCKERFILE, re.M):
        assert not SECRET_NAME.search(line), f"secret-looking build setting: {line}"


def test_the_dockerfile_copies_everything_the_distribution_needs() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    needed = {pattern.rstrip("*") for pattern in setuptools["packages"]["find"]["include"]}
    needed |= {f"{module}.py" for module in setuptools["py-modules"]}
    needed |= {"pyproject.toml", project["project"]["readme"]}
    copied = {Path(src).as_posix() for sources in copy_sources() for src in sources}
    assert needed <= copied, f"missing from the image: {sorted(needed - copied)}"


# ---------------------------------------------------------------- wiring


def test_every_depends_on_target_exists_and_can_satisfy_its_condition() -> None:
    for name, service in SERVICES.items():
        depends = service.get("depends_on") or {}
        for target, spec in depends.items() if isinstance(depends, dict) else []:
            assert target in SERVICES, f"{name} depends on unknown service {target}"
            condition = spec.get("condition", "service_started")
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[target], f"{target} has no healthcheck"
            if condition == "service_completed_successfully":
                assert SERVICES[target].get("restart") == "no", f"{target} must run once"


@pytest.mark.parametrize("name", ["postgres", "temporal", "api"])
def test_healthchecks_are_present(name: str) -> None:
    assert SERVICES[name]["healthcheck"]["test"]


def test_postgres_keeps_its_data_in_a_declared_volume() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for service in SERVICES.values():
        for mount in service.get("volumes", []):
            source = str(mount).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"volume {source} is not declared"
    mounts = {str(m).split(":")[1] for m in SERVICES["postgres"]["volumes"]}
    assert "/var/lib/postgresql/data" in mounts
    assert SERVICES["postgres"]["image"] == "postgres:15"


def test_the_worker_keeps_its_data_dir_where_the_image_puts_it() -> None:
    """A generated SSH client key survives a re-created worker container (the data_dir the
    image names, /app/.data, created for the image's user; a config file cannot move it)."""
    mounts = {str(m).split(":")[1]: str(m).split(":")[0] for m in SERVICES["worker"]["volumes"]}
    assert mounts["/app/.data"] in set(COMPOSE.get("volumes") or {})
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "WORKDIR /app" in dockerfile and "mkdir /app/.data" in dockerfile
    assert "ENV GPUPROV_TEMPORAL__DATA_DIR=/app/.data" in dockerfile
    for service in SERVICES.values():  # nothing in compose overrides it
        assert "GPUPROV_TEMPORAL__DATA_DIR" not in (service.get("environment") or {})

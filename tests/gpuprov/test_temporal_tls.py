"""Reaching Temporal over mTLS and with an API key, through a real TLS terminator (nginx, from
tests/tls.py) in front of the suite's dev server: the production worker (worker.py) and the CLI
connect with the right certificate and run a job; a wrong certificate, CA, key, server name or
API key, or none, fails at once with one line that names the setting."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from temporalio.testing import WorkflowEnvironment

from gpuprov.cli.dev import free_port
from gpuprov.config import TemporalSettings, TemporalTlsSettings
from gpuprov.models import JobState, JobStatus
from gpuprov.sdk.client import GpuprovClient, GpuprovError
from gpuprov.sdk.connection import TemporalSettingError, connect_temporal
from gpuprov.sdk.pem import SettingError
from tests.tls import SERVER_NAME, Pki, TlsFront, running_nginx

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[2]
GPUPROV = str(Path(sys.executable).parent / "gpuprov")
API_KEY = "tmprl-test-key.0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def front(
    temporal_env: WorkflowEnvironment, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsFront]:
    upstream = temporal_env.client.service_client.config.target_host
    with running_nginx(tmp_path_factory.mktemp("nginx"), upstream, pki, API_KEY) as running:
        yield running


def mtls_env(front: TlsFront, pki: Pki, **overrides: str) -> dict[str, str]:
    """GPUPROV_ settings of a worker or CLI that reaches Temporal through the mTLS port."""
    env = {
        "GPUPROV_TEMPORAL__ADDRESS": front.mtls_address,
        "GPUPROV_TEMPORAL__TLS__CLIENT_CERT_FILE": str(pki.path("client.pem")),
        "GPUPROV_TEMPORAL__TLS__CLIENT_KEY_FILE": str(pki.path("client.key")),
        "GPUPROV_TEMPORAL__TLS__SERVER_CA_FILE": str(pki.ca),
        "GPUPROV_TEMPORAL__TLS__SERVER_NAME": SERVER_NAME,
    }
    env.update(overrides)
    return {name: value for name, value in env.items() if value}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without GPUPROV_ settings, plus `extra` (empty: unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROV_")}
    return env | {name: value for name, value in extra.items() if value}


async def gpuprov(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(**env),
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def run_worker(env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "worker.py"),
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log.open("wb"),
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(**env),
    )


def settings(front: TlsFront, pki: Pki, **tls: object) -> TemporalSettings:
    good: dict[str, object] = {
        "client_cert_file": str(pki.path("client.pem")),
        "client_key_file": str(pki.path("client.key")),
        "server_ca_file": str(pki.ca),
        "server_name": SERVER_NAME,
    }
    good.update(tls)
    return TemporalSettings(
        address=front.mtls_address,
        tls=TemporalTlsSettings.model_validate({k: v for k, v in good.items() if v is not None}),
    )


# ---------------------------------------------------------------- the right certificate


async def test_worker_and_cli_run_a_job_through_mtls(
    front: TlsFront, pki: Pki, client, task_queue: str, job_name: str, tmp_path: Path
):
    env = mtls_env(
        front,
        pki,
        GPUPROV_TEMPORAL__TASK_QUEUE=task_queue,
        GPUPROV_TEMPORAL__DATA_DIR=str(tmp_path / "data"),
        GPUPROV_DATABASE__URL=f"sqlite:///{tmp_path / 'gpuprov.db'}",
        GPUPROV_PROVIDERS__FAKE__BOOT_DELAY_SECONDS="0.2",
        GPUPROV_PROVIDERS__FAKE__POLL_INTERVAL="0.1",
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: {job_name}\nnodes: 1\nresources:\n  gpu: h100\n  gpus_per_node: 8\n"
        "placement:\n  providers: [fake]\n"
    )
    log = tmp_path / "worker.log"
    worker = await run_worker(env, log)
    try:
        code, out, err = await gpuprov("submit", str(spec), "--wait", env=env)
        assert code == 0, err + log.read_text()
        assert f"job {job_name}: ready" in out
        code, out, err = await gpuprov("release", job_name, env=env)
        assert code == 0, err
        handle = client.get_workflow_handle(f"job-{job_name}", result_type=JobStatus)
        assert (await asyncio.wait_for(handle.result(), 60)).state is JobState.COMPLETED
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 30)
    assert worker.returncode == 0, log.read_text()
    assert "cannot reach Temporal" not in log.read_text()


async def test_the_sdk_connects_with_an_inline_key_from_the_environment(front: TlsFront, pki: Pki):
    """PEM text in the setting itself (GPUPROV_TEMPORAL__TLS__CLIENT_KEY) works like a file."""
    inline = settings(
        front,
        pki,
        client_key_file=None,
        client_key=SecretStr(pki.path("client.key").read_text()),
    )
    sdk = await GpuprovClient.connect(settings=inline)
    assert await sdk.list(limit=1) is not None


async def test_an_api_key_is_sent_as_a_bearer_token(front: TlsFront, pki: Pki, tmp_path: Path):
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    env = {
        "GPUPROV_TEMPORAL__ADDRESS": front.api_key_address,
        "GPUPROV_TEMPORAL__API_KEY_FILE": str(key_file),
        "GPUPROV_TEMPORAL__TLS__SERVER_CA_FILE": str(pki.ca),
    }
    code, out, err = await gpuprov("list", env=env)
    assert code == 0, err

    wrong = {"GPUPROV_TEMPORAL__API_KEY_FILE": "", "GPUPROV_TEMPORAL__API_KEY": "wrong-key-42"}
    code, out, err = await gpuprov("list", env=env | wrong)
    assert (code, out) == (2, "")
    assert err == "error: temporal.api_key: the server refused the API key: invalid API key\n"


# ---------------------------------------------------------------- refused: worker and CLI


WRONG_CLIENT = {
    "none": (
        {
            "GPUPROV_TEMPORAL__TLS__CLIENT_CERT_FILE": "",
            "GPUPROV_TEMPORAL__TLS__CLIENT_KEY_FILE": "",
        },
        "temporal.tls: {address} wants a client certificate or an API key "
        "(temporal.tls.client_cert_file, temporal.api_key_file): client certificate refused",
    ),
    "untrusted": (
        {
            "GPUPROV_TEMPORAL__TLS__CLIENT_CERT_FILE": "{intruder.pem}",
            "GPUPROV_TEMPORAL__TLS__CLIENT_KEY_FILE": "{intruder.key}",
        },
        "temporal.tls.client_cert_file ({intruder.pem}): the server refused the client "
        "certificate: client certificate refused",
    ),
}


def _fill(text: str, front: TlsFront, pki: Pki) -> str:
    for name in ("intruder.pem", "intruder.key"):
        text = text.replace("{" + name + "}", str(pki.path(name)))
    return text.replace("{address}", front.mtls_address)


@pytest.mark.parametrize("case", sorted(WRONG_CLIENT))
async def test_cli_without_a_trusted_client_certificate_is_refused_in_one_line(
    front: TlsFront, pki: Pki, case: str
):
    overrides, expected = WRONG_CLIENT[case]
    env = mtls_env(front, pki, **{k: _fill(v, front, pki) for k, v in overrides.items()})
    code, out, err = await gpuprov("list", env=env)
    assert (code, out) == (2, "")
    assert err == f"error: {_fill(expected, front, pki)}\n"


@pytest.mark.parametrize("case", sorted(WRONG_CLIENT))
async def test_worker_without_a_trusted_client_certificate_stops_at_once(
    front: TlsFront, pki: Pki, case: str, tmp_path: Path
):
    """Refused is not unreachable: the worker does not retry, it says why and exits 2."""
    overrides, expected = WRONG_CLIENT[case]
    env = mtls_env(front, pki, **{k: _fill(v, front, pki) for k, v in overrides.items()})
    env["GPUPROV_DATABASE__URL"] = f"sqlite:///{tmp_path / 'gpuprov.db'}"
    log = tmp_path / "worker.log"
    worker = await run_worker(env, log)
    await asyncio.wait_for(worker.wait(), 60)
    said = log.read_text()
    assert worker.returncode == 2, said
    assert f"error: {_fill(expected, front, pki)}" in said
    assert "Traceback" not in said and "retrying" not in said


# ---------------------------------------------------------------- refused: which setting


def _refusals(pki: Pki) -> dict[str, tuple[dict[str, object], str]]:
    missing = pki.directory / "missing.pem"
    return {
        "unreadable-cert": (
            {"client_cert_file": str(missing)},
            f"temporal.tls.client_cert_file ({missing}): cannot read it: No such file or directory",
        ),
        "cert-not-pem": (
            {"client_cert_file": str(pki.path("client.key"))},
            f"temporal.tls.client_cert_file ({pki.path('client.key')}): not a PEM certificate",
        ),
        "key-not-pem": (
            {"client_key_file": str(pki.ca)},
            f"temporal.tls.client_key_file ({pki.ca}): not a PEM private key",
        ),
        "key-of-another-pair": (
            {"client_key_file": str(pki.path("intruder.key"))},
            f"temporal.tls.client_key_file ({pki.path('intruder.key')}): not the private key of "
            f"temporal.tls.client_cert_file ({pki.path('client.pem')})",
        ),
        "expired-cert": (
            {
                "client_cert_file": str(pki.path("expired.pem")),
                "client_key_file": str(pki.path("expired.key")),
            },
            f"temporal.tls.client_cert_file ({pki.path('expired.pem')}): expired at",
        ),
        "ca-not-pem": (
            {"server_ca_file": str(pki.path("client.key"))},
            f"temporal.tls.server_ca_file ({pki.path('client.key')}): not a PEM certificate",
        ),
        "wrong-ca": (
            {"server_ca_file": str(pki.path("other-ca.pem"))},
            f"temporal.tls.server_ca_file ({pki.path('other-ca.pem')}): the server's "
            "certificate is not signed by this CA",
        ),
        "no-ca": (
            {"server_ca_file": None},
            "temporal.tls.server_ca: the server's certificate is not signed by a CA this "
            "system trusts (set temporal.tls.server_ca_file)",
        ),
        "wrong-server-name": (
            {"server_name": "other.test"},
            "temporal.tls.server_name: the server's certificate is not valid for other.test",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unreadable-cert",
        "cert-not-pem",
        "key-not-pem",
        "key-of-another-pair",
        "expired-cert",
        "ca-not-pem",
        "wrong-ca",
        "no-ca",
        "wrong-server-name",
    ],
)
async def test_a_wrong_setting_fails_fast_naming_it(front: TlsFront, pki: Pki, case: str):
    tls, expected = _refusals(pki)[case]
    with pytest.raises(SettingError) as refused:
        await connect_temporal(settings(front, pki, **tls))
    message = str(refused.value)
    assert message.startswith(expected), message
    assert "\n" not in message
    # The SDK says the same, as its own error type.
    with pytest.raises(GpuprovError, match="^temporal.tls."):
        await GpuprovClient.connect(settings=settings(front, pki, **tls))


async def test_tls_to_a_plaintext_server_names_the_tls_setting(
    temporal_env: WorkflowEnvironment, pki: Pki
):
    plain = temporal_env.client.service_client.config.target_host
    tls = TemporalTlsSettings(server_ca_file=str(pki.ca))
    expected = f"^temporal.tls.enabled: TLS is on, but {plain} does not answer TLS"
    with pytest.raises(TemporalSettingError, match=expected):
        await connect_temporal(TemporalSettings(address=plain, tls=tls))


async def test_an_unreachable_server_is_not_blamed_on_a_setting(pki: Pki):
    """Nothing listening: temporalio's RuntimeError, which the worker retries."""
    tls = TemporalTlsSettings(server_ca_file=str(pki.ca))
    with pytest.raises(RuntimeError, match="Connection refused"):
        await connect_temporal(TemporalSettings(address=f"127.0.0.1:{free_port()}", tls=tls))


# ---------------------------------------------------------------- the API process


async def test_the_api_reaches_temporal_over_mtls_serves_https_and_honours_operator_keys(
    front: TlsFront, pki: Pki, tmp_path: Path
):
    port = free_port()
    env = mtls_env(
        front,
        pki,
        GPUPROV_DATABASE__URL=f"sqlite:///{tmp_path / 'gpuprov.db'}",
        GPUPROV_API__PORT=str(port),
        GPUPROV_API__TLS_CERT_FILE=str(pki.path("server.pem")),
        GPUPROV_API__TLS_KEY_FILE=str(pki.path("server.key")),
    )
    code, out, err = await gpuprov("apikey", "create", "--name", "ops", env=env)
    assert code == 0, err
    [key] = out.split()  # stdout is the key alone
    assert key.startswith("gpo_") and key not in err and "shown only now" in err

    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        "api",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(**env),
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert f"control-plane API at https://127.0.0.1:{port}" in line
        pinned = ssl.create_default_context(cafile=str(pki.ca))
        url = f"https://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url, verify=pinned) as http:
            assert (await http.get("/v1/workers")).status_code == 401
            listed = await http.get("/v1/workers", headers={"Authorization": f"Bearer {key}"})
            assert (listed.status_code, listed.json()) == (200, {"workers": []})

            code, out, err = await gpuprov("apikey", "list", env=env)
            assert code == 0 and " ops " in out and key not in out
            code, out, err = await gpuprov("apikey", "revoke", "ops", env=env)
            assert code == 0 and out.startswith("revoked ") and out.rstrip().endswith("(ops)")

            revoked = await http.get("/v1/workers", headers={"Authorization": f"Bearer {key}"})
            assert revoked.status_code == 401
        code, out, err = await gpuprov("apikey", "revoke", "ops", env=env)
        assert (code, err) == (2, "error: no live operator API key has the id or name 'ops'\n")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        out_bytes, err_bytes = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err_bytes.decode()
    assert key not in out_bytes.decode() + err_bytes.decode()

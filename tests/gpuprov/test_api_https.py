"""The control-plane API over HTTPS (uvicorn with a certificate from a CA the test makes), and
the node agent as bootstrap runs it (one file, `python3 -I -S`, stdlib ssl): with the CA pinned
it registers and keeps its credential; without it, or pinned to another CA, it is refused at
once and the database does not change."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.node.credentials import CREDENTIAL_FILE
from gpuprov.sdk.pem import SettingError
from gpuprov.store.credentials import Credentials
from gpuprov.store.records import Records
from tests.gpuprov.test_agent import H100X8, agent_env, install_agent, install_nvidia_smi
from tests.gpuprov.test_api import LABEL, TTL, snapshot
from tests.tls import Pki

pytestmark = [
    pytest.mark.slow,  # measured: docs/testing.md, "The fast lane"
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),  # not about it
]


@dataclass
class HttpsApi:
    url: str
    records: Records
    pki: Pki


@pytest.fixture
async def https_api(records: Records, tmp_path: Path) -> AsyncIterator[HttpsApi]:
    pki = Pki(tmp_path / "pki")
    port = free_port()
    app = create_app(records)
    tls = {
        "tls_cert_file": str(pki.path("server.pem")),
        "tls_key_file": str(pki.path("server.key")),
    }
    async with serving(app, "127.0.0.1", port, **tls):
        yield HttpsApi(f"https://127.0.0.1:{port}", records, pki)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The agent installed alone in a private directory, as bootstrap does; nvidia-smi shows
    eight H100s."""
    bin_dir = install_nvidia_smi(tmp_path / "bin", H100X8)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    directory = tmp_path / "node"
    directory.mkdir(mode=0o700)
    return install_agent(directory)


async def run_agent(installed: Path, *args: str, stdin: str = "") -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", str(installed), *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=agent_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_agent_with_the_pinned_ca_registers_and_then_uses_its_credential(
    https_api: HttpsApi, node: Path
):
    token = https_api.records.mint_token(label=LABEL, ttl=TTL)
    ca = str(https_api.pki.ca)

    code, out, err = await run_agent(
        node, "register", "--url", https_api.url, "--ca-file", ca, "--libcuda", "none",
        stdin=token + "\n",
    )  # fmt: skip

    assert code == 0, err
    shown = json.loads(out)
    assert shown["label"] == LABEL and "credential" not in shown
    kept = node.parent / CREDENTIAL_FILE
    assert kept.stat().st_mode & 0o777 == 0o600
    credential = kept.read_text().strip()
    worker = Credentials(https_api.records.db).worker(credential)
    assert worker is not None and worker.id == shown["worker_id"]
    assert token not in out + err and credential not in out + err

    code, out, err = await run_agent(node, "whoami", "--url", https_api.url, "--ca-file", ca)
    assert code == 0, err
    assert json.loads(out)["id"] == shown["worker_id"]
    assert credential not in out + err


@pytest.mark.parametrize("pinned", [None, "other-ca.pem"])
async def test_the_agent_refuses_an_api_it_cannot_verify_and_nothing_changes(
    https_api: HttpsApi, node: Path, pinned: str | None
):
    """Not retried: a certificate that does not verify will not start verifying."""
    token = https_api.records.mint_token(label=LABEL, ttl=TTL)
    before = snapshot(https_api.records)
    pin = ["--ca-file", str(https_api.pki.path(pinned))] if pinned else []

    code, out, err = await run_agent(
        node, "register", "--url", https_api.url, "--libcuda", "none", *pin, stdin=token + "\n"
    )

    assert (code, out) == (2, "")
    assert f"the API's certificate at {https_api.url}/v1/workers/register is not trusted" in err
    assert "pass --ca-file with the CA that signed it" in err
    assert "retrying" not in err and token not in err
    assert snapshot(https_api.records) == before  # the token is still unused
    assert not (node.parent / CREDENTIAL_FILE).exists()


async def test_an_operator_calls_the_api_over_https(https_api: HttpsApi):
    _, key = Credentials(https_api.records.db).create_operator_key("ops")
    pinned = ssl.create_default_context(cafile=str(https_api.pki.ca))
    async with httpx.AsyncClient(base_url=https_api.url, verify=pinned) as http:
        assert (await http.get("/v1/health")).json() == {"status": "ok"}
        assert (await http.get("/v1/workers")).status_code == 401
        listed = await http.get("/v1/workers", headers={"Authorization": f"Bearer {key}"})
        assert listed.status_code == 200 and listed.json() == {"workers": []}
    async with httpx.AsyncClient(base_url=https_api.url) as unpinned:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await unpinned.get("/v1/health")


@pytest.mark.parametrize(
    ("cert", "key", "expected"),
    [
        ("missing.pem", "server.key", "api.tls_cert_file ({missing.pem}): cannot read it"),
        ("server.key", "server.key", "api.tls_cert_file ({server.key}): not a PEM certificate"),
        ("server.pem", "ca.pem", "api.tls_key_file ({ca.pem}): not a PEM private key"),
        (
            "server.pem",
            "client.key",
            "api.tls_key_file ({client.key}): not the private key of "
            "api.tls_cert_file ({server.pem})",
        ),
    ],
)
async def test_a_wrong_api_certificate_setting_is_named(
    records: Records, tmp_path: Path, cert: str, key: str, expected: str
):
    pki = Pki(tmp_path / "pki")
    for name in ("missing.pem", "server.key", "ca.pem", "client.key", "server.pem"):
        expected = expected.replace("{" + name + "}", str(pki.path(name)))
    app = create_app(records)
    with pytest.raises(SettingError) as wrong:
        async with serving(
            app,
            "127.0.0.1",
            free_port(),
            tls_cert_file=str(pki.path(cert)),
            tls_key_file=str(pki.path(key)),
        ):
            pass
    assert str(wrong.value).startswith(expected)

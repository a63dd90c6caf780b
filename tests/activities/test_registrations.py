"""The registration wait's view of the control plane: the API's health endpoint, over HTTPS
with the private CA the nodes pin (`[api] ca_file`), so a healthy API behind its own CA is not
mistaken for an outage (which would keep a failed node's offer from being blocked)."""

from __future__ import annotations

from pathlib import Path

from activities.registrations import ControlPlaneProbe
from gpuprov.api.app import create_app, serving
from gpuprov.engine.worker import open_records
from tests.sshd import free_port
from tests.tls import Pki


async def test_the_probe_trusts_the_apis_private_ca_and_sees_an_outage_without_it(tmp_path: Path):
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    pki = Pki(tmp_path / "pki")
    port = free_port()
    tls = {
        "tls_cert_file": str(pki.path("server.pem")),
        "tls_key_file": str(pki.path("server.key")),
    }
    url = f"https://127.0.0.1:{port}"  # the test server certificate names 127.0.0.1 too
    try:
        async with serving(create_app(records), "127.0.0.1", port, **tls):
            trusted = ControlPlaneProbe(url, interval=0, ca_pem=pki.ca.read_text())
            assert await trusted.outage() is None
            untrusted = ControlPlaneProbe(url, interval=0)
            said = await untrusted.outage()
            assert said is not None and "did not answer" in said
        down = ControlPlaneProbe(url, interval=0, ca_pem=pki.ca.read_text())
        assert "did not answer" in (await down.outage() or "")
    finally:
        records.db.dispose()

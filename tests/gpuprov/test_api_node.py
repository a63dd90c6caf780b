"""GET /v1/node/agent.pyz: the API serves the agent artifact, the bytes every node pins, to a
caller with no credential at all."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from gpuprov.api.app import create_app
from providers import agent_artifact
from providers.node_agent import AGENT_ROUTE


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # not about the database
async def test_the_api_serves_agent_pyz_without_a_credential(records):
    transport = httpx.ASGITransport(app=create_app(records))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
        response = await api.get(AGENT_ROUTE)
    assert response.status_code == 200
    assert response.content == agent_artifact.artifact()
    assert response.headers["content-type"] == "application/zip"
    assert response.headers["etag"] == f'"{hashlib.sha256(response.content).hexdigest()}"'
    assert response.headers["etag"].strip('"') == agent_artifact.sha256()

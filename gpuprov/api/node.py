"""The node agent as the nodes fetch it: GET /v1/node/agent.pyz, open.

The body is agent.pyz (providers/agent_artifact.py: the standard-library agent, built
deterministically from gpuprov/node/), the same bytes every delivery path runs. It holds no
secret, and a node fetches it before it has any credential (the cloud-init unit's ExecStartPre,
`gpuprov join`), so like /v1/health it asks for none. What makes it safe to run is not who
served it but its SHA-256: every node checks the bytes against the pin it was given beside its
join token, and refuses them otherwise, its token unspent. The ETag is that SHA-256.
"""

from __future__ import annotations

import hashlib

from fastapi import FastAPI, Response

from providers import agent_artifact, node_agent

MEDIA_TYPE = "application/zip"


def agent_pyz() -> bytes:
    """What the route serves: this API's own build of the agent."""
    return agent_artifact.artifact()


def add_routes(app: FastAPI) -> None:
    @app.get(
        node_agent.AGENT_ROUTE,
        response_class=Response,
        responses={200: {"content": {MEDIA_TYPE: {}}, "description": "agent.pyz"}},
    )
    async def node_agent_pyz() -> Response:
        body = agent_pyz()
        etag = hashlib.sha256(body).hexdigest()
        return Response(body, media_type=MEDIA_TYPE, headers={"ETag": f'"{etag}"'})

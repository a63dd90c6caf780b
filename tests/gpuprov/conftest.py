"""Fixtures for the control-plane API tests in this folder: `api`, an in-process client to the
test module's own `app` fixture (each module builds the app with the settings it tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from tests.gpuprov.in_process import client_for


@pytest.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(app) as client:
        yield client

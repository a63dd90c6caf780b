"""Compute Engine's documented error reasons on calls made of our own parameters (delete, the
instance lists), over respx: Failed, never InvalidRequest, and `notFound` on delete still gone."""

from __future__ import annotations

import pytest
import respx

from providers.base import Location
from providers.errors import ErrorKind, ProviderError
from tests.providers.gce import bodies
from tests.providers.gce.fake_gce import BASE_URL

P = f"{BASE_URL}/projects/{bodies.PROJECT}"
ZONE, VM, NAME = bodies.ZONE, bodies.VM, bodies.NAME
INSTANCES = f"{P}/zones/{ZONE}/instances"
HERE = Location(provider="gce", region="us-central1", zone=ZONE)
REGION = Location(provider="gce", region="us-central1")
INVALID_NAME = bodies.http_error(
    400, "invalid", f"Invalid value for field 'instance': '{NAME}'. Must be a match of regex."
)
NO_SUCH_ZONE = bodies.http_error(
    404, "notFound", f"The resource 'projects/{bodies.PROJECT}/zones/{ZONE}' was not found"
)
BAD_FILTER = bodies.http_error(400, "invalid", "Invalid value for field 'filter': 'labels.x'.")


@pytest.fixture
def api() -> respx.MockRouter:
    return respx.MockRouter(assert_all_called=True)


async def failure(coroutine: object) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await coroutine  # type: ignore[misc]
    return caught.value


async def test_invalid_on_delete_is_failed_so_the_teardown_goes_on(api, cloud):
    api.delete(url__startswith=f"{INSTANCES}/{NAME}").respond(400, json=INVALID_NAME)
    error = await failure(cloud.delete(HERE, VM, [f"{ZONE}/{NAME}"]))
    assert error.kind is ErrorKind.FAILED
    assert "invalid" in error.message


async def test_a_delete_whose_operation_fails_invalid_is_failed(api, cloud):
    failed = bodies.failed_operation("INVALID_FIELD_VALUE", "Invalid value for field 'name'.")
    api.delete(url__startswith=f"{INSTANCES}/{NAME}").respond(200, json=failed)
    error = await failure(cloud.delete(HERE, VM, [f"{ZONE}/{NAME}"]))
    assert error.kind is ErrorKind.FAILED


async def test_not_found_on_delete_of_our_instance_is_still_gone(api, cloud):
    api.delete(url__startswith=f"{INSTANCES}/{NAME}").respond(404, json=bodies.NOT_FOUND_INSTANCE)
    await cloud.delete(HERE, VM, [f"{ZONE}/{NAME}"])


async def test_invalid_on_cleanup_of_our_rule_is_failed(api, cloud):
    api.delete(f"{P}/global/firewalls/{NAME}-ssh").respond(400, json=INVALID_NAME)
    assert (await failure(cloud.cleanup(HERE, VM))).kind is ErrorKind.FAILED


@pytest.mark.parametrize("body", [NO_SUCH_ZONE, BAD_FILTER], ids=["notFound", "invalid"])
async def test_the_zone_list_refusing_our_zone_or_filter_is_failed(api, cloud, body):
    api.get(url__startswith=INSTANCES).respond(body["error"]["code"], json=body)
    assert (await failure(cloud.observe(HERE, VM))).kind is ErrorKind.FAILED


async def test_the_aggregated_list_refusing_our_filter_is_failed(api, cloud):
    api.get(url__startswith=f"{P}/aggregated/instances").respond(400, json=BAD_FILTER)
    assert (await failure(cloud.observe_region(REGION))).kind is ErrorKind.FAILED
    assert (await failure(cloud.observe(REGION, VM))).kind is ErrorKind.FAILED

"""examples/sdk_service.py runs as written against a real dev server and a fake-cloud worker."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from gpuprov.models import JobState
from tests.helpers import assert_nothing_left, fake_worker, fast_cloud

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_sdk_service_example_gets_ready_releases_and_prints_the_nodes(
    client, task_queue, job_name, capsys
):
    example = load_example("sdk_service")
    address = client.service_client.config.target_host
    async with fake_worker(client, task_queue, fast_cloud()) as (_, cloud):
        final = await example.main(
            address=address, task_queue=task_queue, namespace=client.namespace, name=job_name
        )
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)

    out = capsys.readouterr().out
    assert f"submitted {job_name} (workflow job-{job_name})" in out
    # progress while waiting: queued (planning), then provisioning (an offer being tried)
    assert re.search(r"^  (queued|provisioning): \S", out, re.MULTILINE), out
    assert "ready: 10.00 USD/hour" in out
    vm = final.nodes[0].vm  # <job>-a1-n0-<run tag>
    assert vm.startswith(f"{job_name}-a1-n0-")
    assert f"node 0: {vm} on fake/r1 (root@" in out
    assert f"{job_name}: completed" in out
    assert f"  {vm}: terminated" in out

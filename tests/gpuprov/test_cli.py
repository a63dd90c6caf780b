"""The `gpuprov` CLI as a user runs it: a subprocess against the suite's real dev server."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gpuprov.cli.dev import free_port
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, JobStatus
from tests.helpers import fake_worker, fast_cloud

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

GPUPROV = str(Path(sys.executable).parent / "gpuprov")


async def gpuprov(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


BAD_SPECS = {
    "nodes-zero.yaml": ("name: x\nnodes: 0\n", "nodes: Input should be greater than or equal to 1"),
    "unknown-provider.yaml": (
        "name: x\nplacement:\n  providers: [nocloud]\n",
        "placement.providers: Value error, unknown provider 'nocloud'",
    ),
    "negative-cap.toml": (
        'name = "x"\nmax_hourly_cost = -1.0\n',
        "max_hourly_cost: Input should be",
    ),
    "unknown-field.yaml": ("name: x\nresources:\n  gpuz: H100\n", "resources.gpuz: Extra inputs"),
    "malformed.yaml": ("name: [x\n", "malformed job spec"),
    "malformed.toml": ("name = \n", "malformed job spec"),
    "not-a-mapping.yaml": ("- a\n- b\n", "a job spec must be a mapping"),
}


@pytest.mark.parametrize("filename", sorted(BAD_SPECS))
async def test_submit_rejects_bad_spec_naming_the_field(tmp_path, filename):
    text, expected = BAD_SPECS[filename]
    spec = tmp_path / filename
    spec.write_text(text)
    # An unreachable address proves the spec is refused before anything is contacted.
    code, out, err = await gpuprov("--address", "127.0.0.1:1", "submit", str(spec))
    assert code == 2, (out, err)
    assert expected in err
    assert "Traceback" not in err


async def test_submit_of_a_missing_file_says_so(tmp_path):
    code, _, err = await gpuprov("submit", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "cannot read job spec" in err


async def test_cli_submit_wait_status_list_offers_release(client, task_queue, job_name, tmp_path):
    address = client.service_client.config.target_host
    env = {"GPUPROV_TEMPORAL__TASK_QUEUE": task_queue, "GPUPROV_TEMPORAL__ADDRESS": address}
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: {job_name}\nnodes: 1\nresources:\n  gpu: h100\n  gpus_per_node: 8\n"
        "placement:\n  providers: [fake]\n"
    )
    async with fake_worker(client, task_queue, fast_cloud()):
        code, out, err = await gpuprov("submit", str(spec), "--wait", env=env)
        assert code == 0, err
        assert f"submitted job-{job_name}" in out
        assert f"job {job_name}: ready" in out

        code, out, _ = await gpuprov("status", job_name, env=env)
        assert code == 0 and "#1 fake/r1-a/gpu8 (fake/r1): succeeded" in out

        code, out, _ = await gpuprov("list", "--state", "ready", env=env)
        assert code == 0 and job_name in out

        code, out, _ = await gpuprov("offers", "--gpu", "H100", "--gpus-per-node", "8", env=env)
        assert code == 0
        lines = out.splitlines()
        assert [line.split()[0] for line in lines[1:]] == [
            "fake/r1-a/gpu8",
            "fake/r1-b/gpu8",
            "fake/r2-a/gpu8",
        ]
        assert "10.00 USD/hour (simulated)" in lines[1]

        code, out, _ = await gpuprov("release", job_name, env=env)
        assert code == 0
        handle = client.get_workflow_handle(f"job-{job_name}", result_type=JobStatus)
        final = await handle.result()
        assert final.state is JobState.COMPLETED

        code, out, _ = await gpuprov("status", job_name, "--json", env=env)
        assert code == 0 and '"state": "completed"' in out


async def test_offers_say_which_clouds_cannot_open_a_jobs_ports(client, task_queue):
    address = client.service_client.config.target_host
    env = {"GPUPROV_TEMPORAL__TASK_QUEUE": task_queue, "GPUPROV_TEMPORAL__ADDRESS": address}
    asked = ("offers", "--gpu", "H100", "--gpus-per-node", "8", "--image", "registry.example/x:1")
    async with fake_worker(client, task_queue, fast_cloud(unsupported=["ports"])):
        code, out, err = await gpuprov(*asked, "--port", "8080", "--port", "6006", env=env)
        assert code == 0, err
        assert out.splitlines() == [
            "no compatible offers",
            "refused fake/*: fake cannot open ports",
        ]
        code, out, _ = await gpuprov(*asked, env=env)  # an image it can run: offered
        assert code == 0 and "fake/r1-a/gpu8" in out and "refused" not in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [(("--port", "0"), "must be 1-65535"), (("--image", " "), "must not be empty")],
)
async def test_offers_refuses_a_bad_port_or_image_before_any_call(args, expected):
    code, _, err = await gpuprov("--address", "127.0.0.1:1", "offers", *args)
    assert code == 2 and expected in err and "Traceback" not in err


async def test_status_of_unknown_job_is_a_clear_error(client, task_queue):
    env = {"GPUPROV_TEMPORAL__ADDRESS": client.service_client.config.target_host}
    code, _, err = await gpuprov("status", "no-such-job", env=env)
    assert code == 2
    assert "no job named 'no-such-job'" in err


async def test_submit_wait_follows_a_job_that_runs_its_work_to_its_end(
    client, task_queue, job_name, tmp_path
):
    from tests.workflows.test_running import worker_with_api

    address = client.service_client.config.target_host
    env = {"GPUPROV_TEMPORAL__TASK_QUEUE": task_queue, "GPUPROV_TEMPORAL__ADDRESS": address}
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"name: {job_name}\nresources:\n  gpu: h100\n  gpus_per_node: 8\n"
        "placement:\n  providers: [fake]\nrun: echo hello from rank $GPUPROV_NODE_RANK\n"
    )
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    try:
        # the simulated agents run the work for real (run_work), as a node's agent does
        async with worker_with_api(client, task_queue, records, run_work=True):
            code, out, err = await gpuprov("submit", str(spec), "--wait", env=env)
    finally:
        records.db.dispose()
    assert code == 0, (out, err)
    assert f"job {job_name}: completed" in out


DATABASE_COMMANDS = [
    ("workers",),
    ("workers", "drain", "w-1"),
    ("apikey", "list"),
    ("token", "create", "--label", "box-1"),
    ("cost",),
    ("orphans",),
    ("logs", "some-job"),
]


@pytest.mark.parametrize("args", DATABASE_COMMANDS, ids=[" ".join(a) for a in DATABASE_COMMANDS])
async def test_a_command_whose_database_is_unreachable_says_so_in_one_line(args):
    port = free_port()  # nothing listens there
    env = {"GPUPROV_DATABASE__URL": f"postgresql://ops:hunter2-pass@127.0.0.1:{port}/gpuprov"}
    code, out, err = await gpuprov(*args, env=env)
    assert code == 2, (out, err)
    [line] = err.strip().splitlines()
    assert line.startswith(
        f"error: cannot open the database postgresql://ops:***@127.0.0.1:{port}/gpuprov: "
    ), line
    assert "hunter2" not in out + err


@pytest.mark.parametrize("follow", [False, True], ids=["once", "follow"])
async def test_logs_of_no_such_job_is_an_error_naming_it(client, tmp_path, follow):
    database_url = f"sqlite:///{tmp_path / 'gpuprov.db'}"
    open_records(database_url).db.dispose()  # a database that holds no output at all
    env = {
        "GPUPROV_TEMPORAL__ADDRESS": client.service_client.config.target_host,
        "GPUPROV_DATABASE__URL": database_url,
    }
    code, out, err = await gpuprov(
        "logs", "no-such-job", *(["--follow"] if follow else []), env=env
    )
    assert (code, out) == (2, ""), err
    assert err.strip() == "error: no job named 'no-such-job'"

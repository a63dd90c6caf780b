"""No secret enters Temporal history: whole jobs with real agents, the real API and a worker
built by `running_worker` from Settings holding a live value of each kind of secret, and one
scan (tests/secret_scan.py) of every run's history, every payload decoded, for all of them.

What was live in each run (`deployed`; docs/testing.md, "No secret in history", says where the
scan takes each value from): the nodes' join tokens and worker credentials; an operator API key
read with during the job; `[providers.lambda] api_key`, which the worker plans with against a
Lambda API on loopback that answers only it; `[ssh] client_key`, loaded into the worker's
KeyStore (held, not used: the fake nodes boot from user data, none is reached over SSH); a vault
value the job's `env` refers to as `${{ secrets.WANDB }}`; the vault's and the codec's keys.
Temporal's TLS client key and API key are live on two clients of the one namespace, each
through nginx (tests/tls.py) in front of the dev server: the worker's client on the mTLS port,
which refuses a caller without `[temporal.tls] client_cert_file` / `client_key_file`'s pair
(the value scanned for is that key's PEM text), and the client that submits, queries and
cancels on the API-key port, which refuses any bearer key but `[temporal] api_key`; nginx
cannot check both on one port.

Real runs must scan clean; the positive control plants every value in a job's `env` and must
be found for every kind, through the codec; unit tests find each encoding and follow
continue-as-new.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import asyncssh
import fastapi
import httpx
import pytest
from fastapi.responses import JSONResponse
from pydantic import SecretStr
from temporalio import workflow
from temporalio.api.common.v1 import Header, Memo, Payload, Payloads, SearchAttributes
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import (
    ActivityTaskFailedEventAttributes,
    HistoryEvent,
    WorkflowExecutionStartedEventAttributes,
)
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.liveness import SweepReport
from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import (
    ApiSettings,
    CodecSettings,
    JobsSettings,
    ProvidersSettings,
    SecretsSettings,
    Settings,
    SshSettings,
    TemporalSettings,
    TemporalTlsSettings,
    WorkersSettings,
)
from gpuprov.contract import WatchInput
from gpuprov.engine.worker import connect, open_records, running_worker
from gpuprov.models import JobState, JobStatus
from gpuprov.sdk.client import GpuprovClient, JobHandle
from gpuprov.sdk.codec import EncryptionCodec, codec_for, generate_key
from gpuprov.sdk.connection import connect_temporal
from gpuprov.store.credentials import Credentials
from gpuprov.store.secrets import Vault
from providers.fake import FakeCloud
from providers.fake.node import cloud_init_files
from providers.lambdalabs.config import LambdaConfig
from providers.userdata import JOIN_ENV_PATH
from tests.helpers import eventually, fast_cloud, job, until
from tests.secret_scan import Scan, UnreadablePayload, forms, histories, scan
from tests.tls import SERVER_NAME, Pki, TlsFront, running_nginx
from workflows.liveness import WatchWorkers

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

FAST = WorkersSettings(heartbeat_interval_seconds=0.3, lost_after_seconds=2)
JOBS = JobsSettings(stop_grace_seconds=3)
TEMPORAL_API_KEY = f"tmprl-scan.{secrets.token_hex(24)}"
WAIT = 60  # seconds: the budget of each wait
# The work's own lines: the value (which the API must hide as ***) and its SHA-256.
PRINTS_THE_SECRET = (
    'echo "rank $GPUPROV_NODE_RANK has key $WANDB_API_KEY"; '
    'printf %s "$WANDB_API_KEY" | sha256sum | sed "s/^/sha256 /"; '
)
SECRET_ENV = {"WANDB_API_KEY": "${{ secrets.WANDB }}"}


# ---------------------------------------------------------------- the deployment


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def front(
    temporal_env: WorkflowEnvironment, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsFront]:
    upstream = temporal_env.client.service_client.config.target_host
    with running_nginx(tmp_path_factory.mktemp("nginx"), upstream, pki, TEMPORAL_API_KEY) as up:
        yield up


def lambda_api(api_key: str, answered: list[str]) -> fastapi.FastAPI:
    """Lambda's GET /api/v1/instance-types for one bearer key (no instance types: the fake
    cloud carries the jobs), any other key 401; each call answered is counted in `answered`."""
    app = fastapi.FastAPI()

    @app.get("/api/v1/instance-types")
    async def instance_types(authorization: Annotated[str, fastapi.Header()] = "") -> Any:
        if authorization != f"Bearer {api_key}":
            return JSONResponse({"error": {"code": "global/invalid-api-key"}}, status_code=401)
        answered.append("instance-types")
        return {"data": {}}

    return app


@dataclass
class Deployment:
    gpuprov: GpuprovClient  # over the API-key client
    client: Client
    cloud: FakeCloud
    api_url: str
    operator_key: str
    user_secret: str
    codec: EncryptionCodec | None
    fixed: dict[str, list[str]]  # the secrets known before any node boots
    lambda_calls: list[str]
    tokens: set[str] = field(default_factory=set)
    credentials: set[str] = field(default_factory=set)

    def harvest(self) -> None:
        """Every node's join token (its user data) and worker credential (its disk)."""
        for row in self.cloud.state.instances():
            for entry in cloud_init_files(row.user_data or ""):
                if entry["path"] == JOIN_ENV_PATH:
                    for line in str(entry.get("content", "")).splitlines():
                        if line.startswith("GPUPROV_JOIN_TOKEN="):
                            self.tokens.add(line.partition("=")[2].strip())
        for machine in self.cloud.nodes.values():
            path = machine.state_dir / "worker-credential"
            if path.exists() and (credential := path.read_text().strip()):
                self.credentials.add(credential)

    def secrets(self) -> dict[str, list[str]]:
        self.harvest()
        return {
            **self.fixed,
            "join token": sorted(self.tokens),
            "worker credential": sorted(self.credentials),
        }

    async def scan(self, job_name: str) -> Scan:
        return scan(await histories(self.client, f"job-{job_name}"), self.secrets(), self.codec)

    async def references_seen(self, job_name: str) -> bool:
        """The same histories show the spec's `${{ secrets.WANDB }}`: what the real scans
        read is the job's decoded input, not nothing."""
        runs = await histories(self.client, f"job-{job_name}")
        return bool(scan(runs, {"reference": list(SECRET_ENV.values())}, self.codec).findings)

    async def logs(self, job_name: str) -> list[str]:
        """The job's stored output, read with the operator key as an operator would."""
        headers = {"Authorization": f"Bearer {self.operator_key}"}
        async with httpx.AsyncClient(base_url=self.api_url, headers=headers) as http:
            answer = await http.get(f"/v1/jobs/{job_name}/logs")
        assert answer.status_code == 200, answer.text
        return [chunk["data"] for chunk in answer.json()["chunks"]]


class Planted:
    """The secrets a deployment is built with, fresh for each test."""

    def __init__(self) -> None:
        self.ssh_key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
        self.cloud_key = f"secret_{uuid.uuid4().hex}"
        self.user_secret = f"wandb-{secrets.token_urlsafe(24)}"
        self.vault_key, self.codec_key = generate_key(), generate_key()


def worker_settings(
    planted: Planted, front: TlsFront, pki: Pki, task_queue: str, *, api_url: str,
    lambda_url: str, tmp_path: Path, encrypted: bool,
) -> Settings:  # fmt: skip
    """The worker's Settings: mTLS to Temporal through nginx, the fake cloud (real agents)
    and Lambda with its API key, the SSH key, the vault's keys, the codec's where `encrypted`."""
    codec = CodecSettings(keys={"c1": planted.codec_key}, active_key="c1")
    tls = TemporalTlsSettings(
        client_cert_file=str(pki.path("client.pem")),
        client_key_file=str(pki.path("client.key")),
        server_ca_file=str(pki.ca),
        server_name=SERVER_NAME,
    )
    lambda_section = LambdaConfig(api_key=SecretStr(planted.cloud_key), base_url=lambda_url)
    return Settings(
        temporal=TemporalSettings(
            address=front.mtls_address,
            task_queue=task_queue,
            data_dir=str(tmp_path / "data"),
            workflow_sandbox=True,
            tls=tls,
        ),
        api=ApiSettings(public_url=api_url),
        jobs=JOBS,
        workers=FAST,
        codec=codec if encrypted else CodecSettings(),
        ssh=SshSettings(client_key=SecretStr(planted.ssh_key)),
        secrets=SecretsSettings(keys={"v1": planted.vault_key}, active_key="v1"),
        providers=ProvidersSettings.model_validate(
            {"fake": fast_cloud(agent="real", boot_timeout=60), "lambda": lambda_section}
        ),
    )


async def api_key_client(front: TlsFront, pki: Pki, settings: Settings) -> Client:
    """A client reaching Temporal through nginx's API-key port, with the worker's codec."""
    tls = TemporalTlsSettings(server_ca_file=str(pki.ca), server_name=SERVER_NAME)
    temporal = TemporalSettings(
        address=front.api_key_address, api_key=SecretStr(TEMPORAL_API_KEY), tls=tls
    )
    return await connect_temporal(temporal, codec=settings.codec)


@asynccontextmanager
async def deployed(
    tmp_path: Path, front: TlsFront, pki: Pki, task_queue: str, *, encrypted: bool
) -> AsyncIterator[Deployment]:
    """The API (with the vault) and a worker built from Settings holding every secret, both
    reaching Temporal through nginx; `encrypted`: payloads under the codec."""
    planted, port, lambda_port, lambda_calls = Planted(), free_port(), free_port(), []
    lambda_url = f"http://127.0.0.1:{lambda_port}"
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    async with serving(lambda_api(planted.cloud_key, lambda_calls), "127.0.0.1", lambda_port):
        settings = worker_settings(
            planted, front, pki, task_queue, api_url=f"http://127.0.0.1:{port}",
            lambda_url=lambda_url, tmp_path=tmp_path, encrypted=encrypted,
        )  # fmt: skip
        vault = Vault(records.db, settings.secrets.key_bytes(), "v1")
        vault.set("default", "WANDB", planted.user_secret)
        _, operator_key = Credentials(records.db).create_operator_key("secret-scan")
        worker_client = await connect(settings.temporal, codec=settings.codec)
        fixed = {
            "operator API key": [operator_key],
            "cloud API key": [planted.cloud_key],
            "SSH client key": [planted.ssh_key],
            "Temporal TLS client key": [pki.path("client.key").read_text()],
            "Temporal API key": [TEMPORAL_API_KEY],
            "user secret": [planted.user_secret],
            "vault key": [planted.vault_key],
        } | ({"payload codec key": [planted.codec_key]} if encrypted else {})
        app = create_app(records, workers=FAST, jobs=JOBS, temporal=worker_client, vault=vault)
        async with (
            serving(app, "127.0.0.1", port),
            running_worker(worker_client, settings, records) as runtime,  # closes the records
        ):
            cloud = runtime.providers["fake"]
            assert isinstance(cloud, FakeCloud) and "lambda" in runtime.providers
            submitter = await api_key_client(front, pki, settings)
            yield Deployment(
                gpuprov=GpuprovClient(submitter, task_queue),
                client=submitter,
                cloud=cloud,
                api_url=settings.api.url,
                operator_key=operator_key,
                user_secret=planted.user_secret,
                codec=codec_for(settings.codec),
                fixed=fixed,
                lambda_calls=lambda_calls,
            )


def holds_no_form_of(text: str, secret: str) -> bool:
    return not any(form in text for form in forms(secret).values())


async def sweep_until_lost(client: Client, task_queue: str) -> SweepReport:
    """The liveness sweep (WatchWorkers), again and again, until it finds a worker lost."""

    async def once() -> SweepReport:
        return await client.execute_workflow(
            WatchWorkers.run,
            WatchInput(lost_after_seconds=FAST.lost_after_seconds),
            id=f"liveness-{uuid.uuid4().hex[:12]}",
            task_queue=task_queue,
            execution_timeout=timedelta(minutes=1),
        )

    async def lost() -> SweepReport | None:
        report = await once()
        return report if report.lost else None

    return await eventually(lost, "the killed node's worker lost", WAIT, interval=0.3)


def assert_every_kind_live(deployment: Deployment, nodes: int) -> None:
    """Every kind was planted with a real value of the run."""
    found = deployment.secrets()
    assert len(found["join token"]) >= nodes and len(found["worker credential"]) >= nodes
    assert all(found.values()), [kind for kind, values in found.items() if not values]
    assert deployment.lambda_calls, "the worker never planned on Lambda with its key"


def assert_clean(result: Scan) -> None:
    assert result.findings == [], result.report()
    assert result.events > 20 and result.payloads > 10, result  # it read a whole job


async def followed(deployment: Deployment, handle: JobHandle) -> JobStatus:
    """The job's final status, harvesting its nodes' secrets every 0.2 s all along (a node's
    disk goes with it)."""
    result = asyncio.ensure_future(asyncio.wait_for(handle.result(), 180))
    while not result.done():
        deployment.harvest()
        await asyncio.sleep(0.2)
    deployment.harvest()
    return result.result()


# ---------------------------------------------------------------- the real runs


async def test_a_restarted_two_node_run_leaves_no_secret_in_any_run_of_its_history(
    front, pki, task_queue, job_name, tmp_path
):
    shared = tmp_path / "shared"
    shared.mkdir()
    # Each rank's first run holds on; after the restart its second one ends at once.
    run = (
        f"{PRINTS_THE_SECRET}if mkdir {shared}/ran-$GPUPROV_NODE_RANK 2>/dev/null; "
        "then exec sleep 3600; fi; echo second run done"
    )
    spec = job(job_name, 2, run=run, env=SECRET_ENV, recovery={"max_restarts": 1},
               health_check_interval_seconds=1)  # fmt: skip
    async with deployed(tmp_path, front, pki, task_queue, encrypted=False) as deployment:
        handle = await deployment.gpuprov.submit(spec)
        running = await until(handle, lambda s: s.state is JobState.RUNNING, WAIT * 2)
        await eventually(lambda: len(list(shared.iterdir())) == 2, "both ranks' work", WAIT)
        digest = hashlib.sha256(deployment.user_secret.encode()).hexdigest()
        printed = await eventually(
            lambda: _both_hashes(deployment, job_name, digest), "both ranks' hash lines", WAIT
        )
        assert all(holds_no_form_of(chunk, deployment.user_secret) for chunk in printed)
        deployment.harvest()
        first = running.live_nodes()[0]
        [instance] = [row for row in deployment.cloud.live_instances() if row.vm == first.vm]
        await asyncio.to_thread(deployment.cloud.nodes[instance.id].kill)  # the node is lost
        report = await sweep_until_lost(deployment.client, task_queue)
        assert len(report.lost) == 1 and report.signalled == [job_name]
        final = await followed(deployment, handle)
        assert final.state is JobState.COMPLETED, final.error
        assert len(final.restarts) == 1 and "silent" in final.restarts[0].cause
        assert len(final.attempts) >= 2
        assert_every_kind_live(deployment, nodes=4)
        assert_clean(await deployment.scan(job_name))
        assert await deployment.references_seen(job_name)
        assert holds_no_form_of(final.model_dump_json(), deployment.user_secret)


async def _both_hashes(deployment: Deployment, job_name: str, digest: str) -> list[str] | None:
    chunks = await deployment.logs(job_name)
    text = "".join(chunks)
    return chunks if text.count(f"sha256 {digest}") == 2 and "has key ***" in text else None


async def test_a_failing_work_that_prints_the_user_secret_leaves_it_nowhere(
    front, pki, task_queue, job_name, tmp_path
):
    run = f'echo "starting"; {PRINTS_THE_SECRET}echo "some output"; echo "giving up" >&2; exit 1'
    spec = job(job_name, 1, run=run, env=SECRET_ENV)
    async with deployed(tmp_path, front, pki, task_queue, encrypted=True) as deployment:
        handle = await deployment.gpuprov.submit(spec)
        final = await followed(deployment, handle)
        assert final.state is JobState.FAILED
        assert final.error is not None and "code 1" in final.error, final.error
        status = await handle.status()  # the query, answered by the closed workflow
        chunks = await deployment.logs(job_name)
        text = "".join(chunks)
        digest = hashlib.sha256(deployment.user_secret.encode()).hexdigest()
        assert f"sha256 {digest}" in text  # the agent got the right value...
        assert "rank 0 has key ***" in text and "some output" in text  # ...and it was hidden
        for seen in (text, final.error, status.model_dump_json(), final.model_dump_json()):
            assert holds_no_form_of(seen, deployment.user_secret)
        assert_every_kind_live(deployment, nodes=1)
        result = await deployment.scan(job_name)
        assert_clean(result)
        assert result.decrypted > 10  # the payloads were encrypted, and opened
        assert await deployment.references_seen(job_name)


# ---------------------------------------------------------------- the scan can fail


async def test_a_job_carrying_every_kind_of_secret_in_its_env_is_found_for_each_kind(
    front, pki, task_queue, job_name, tmp_path
):
    async with deployed(tmp_path, front, pki, task_queue, encrypted=True) as deployment:
        # A node first, for a real join token and worker credential.
        carrier = await deployment.gpuprov.submit(job(f"{job_name}-n"))
        await until(carrier, lambda s: s.state is JobState.READY, WAIT * 2)
        await eventually(lambda: deployment.harvest() or deployment.credentials, "a credential")
        planted = deployment.secrets()
        env = {
            f"PLANTED_{index}": values[0]
            for index, (kind, values) in enumerate(sorted(planted.items()))
        }
        leaky = await deployment.gpuprov.submit(job(job_name, env=env))
        await leaky.cancel()
        await carrier.release()
        for handle in (leaky, carrier):
            await asyncio.wait_for(handle.result(), WAIT)
        result = await deployment.scan(job_name)
        assert result.kinds() == set(planted), result.report()
        assert result.decrypted > 0
        with pytest.raises(UnreadablePayload):  # without the codec: an error, never "clean"
            scan(await histories(deployment.client, f"job-{job_name}"), planted)
        assert_clean(await deployment.scan(f"{job_name}-n"))


SECRET = 's3cr3t-Value/with+odd=chars"and\\quotes'


def payload(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=text.encode())


def synthetic_history() -> WorkflowHistory:
    """Two events: the start, with the secret raw in a memo, base64 inside a search attribute
    and JSON-escaped in a header (its input clean); an activity failure naming it."""
    encoded = base64.b64encode(b"prefix:" + SECRET.encode()).decode()
    started = WorkflowExecutionStartedEventAttributes(
        input=Payloads(payloads=[payload('{"plain": "nothing here"}')]),
        memo=Memo(fields={"note": payload(json.dumps(f"raw {SECRET} raw", ensure_ascii=False))}),
        search_attributes=SearchAttributes(indexed_fields={"Tag": payload(json.dumps(encoded))}),
        header=Header(fields={"auth": payload(json.dumps({"token": SECRET}))}),
    )
    failed = ActivityTaskFailedEventAttributes(failure=Failure(message=f"boom: {SECRET}"))
    return WorkflowHistory(
        "wf-unit",
        [
            HistoryEvent(
                event_id=1,
                event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                workflow_execution_started_event_attributes=started,
            ),
            HistoryEvent(
                event_id=2,
                event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
                activity_task_failed_event_attributes=failed,
            ),
        ],
    )


async def test_the_scanner_finds_each_encoding_names_the_place_and_never_prints_the_secret():
    result = scan([synthetic_history()], {"unit": [SECRET], "absent": ["never-in-it-0123"]})
    places = {(f.event_id, f.form, f.where.split(" ", 2)[2]) for f in result.findings}
    assert {f.kind for f in result.findings} == {"unit"}
    assert (1, "raw", "workflow_execution_started_event_attributes.memo.fields['note'].data"
            "(json string 0)") in places  # fmt: skip
    assert any(event == 1 and form == "base64" and "search_attributes" in where
               for event, form, where in places)  # fmt: skip
    assert any(event == 1 and form == "json-escaped" and "header.fields['auth'].data" in where
               for event, form, where in places)  # fmt: skip
    assert (2, "raw", "activity_task_failed_event_attributes.failure.message") in places
    assert SECRET not in result.report() and SECRET not in repr(result)
    assert result.events == 2 and result.payloads == 4

    codec = EncryptionCodec({"k": base64.b64decode(generate_key())}, "k")
    history = synthetic_history()
    started = history.events[0].workflow_execution_started_event_attributes
    started.input.payloads[0].CopyFrom(codec.encrypt(payload(json.dumps({"key": SECRET}))))
    with pytest.raises(UnreadablePayload):
        scan([history], {"unit": [SECRET]})
    opened = scan([history], {"unit": [SECRET]}, codec)
    assert opened.decrypted == 1
    assert any("input.payloads[0](decrypted).data" in f.where for f in opened.findings)
    with pytest.raises(ValueError, match="vacuous"):
        scan([history], {"unit": []}, codec)
    assert set(forms("x" * 12)) >= {"raw", "json-escaped", "base64+0", "base64+1", "base64+2"}


@workflow.defn(name="SecretScanContinues")
class Continues:
    """Carries its input into the first run only, then continues as new without it."""

    @workflow.run
    async def run(self, carried: str) -> str:
        if carried != "clean":
            workflow.continue_as_new("clean")
        return "done"


async def test_the_scan_follows_continue_as_new_back_to_the_first_run(client, task_queue):
    workflow_id = f"scan-{uuid.uuid4().hex[:12]}"
    runner = UnsandboxedWorkflowRunner()
    async with Worker(client, task_queue=task_queue, workflows=[Continues], workflow_runner=runner):
        await client.execute_workflow(Continues.run, SECRET, id=workflow_id, task_queue=task_queue)
    runs = await histories(client, workflow_id)
    assert len(runs) == 2 and runs[0].run_id != runs[1].run_id
    result = scan(runs, {"unit": [SECRET]})
    assert result.findings and {f.where.split(" ")[0] for f in result.findings} == {
        f"{workflow_id}/{runs[0].run_id}"
    }
    assert scan(runs[1:], {"unit": [SECRET]}).findings == []  # the latest run alone holds none

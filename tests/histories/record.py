"""Record the replay suite's histories: `make histories` (python -m tests.histories.record).

Starts its own Temporal dev server, runs each scenario below on the fake cloud (a fresh SQLite
records DB per scenario, so blocks never leak from one into the next), and writes the finished
workflow's history to tests/histories/<scenario>.json. tests/test_replay.py replays every file
through the current workflow code, so a change to the command sequence fails the build.

Regenerate only for a new scenario, or after a change that is intended and guarded by
`workflow.patched(...)` (docs/architecture.md, "Changing workflow code safely"): rerecording
an unguarded change hides exactly the break the suite exists to catch.

    python -m tests.histories.record                  # every scenario
    python -m tests.histories.record happy_path ...   # only these

Before writing, each history is checked: it replays against the current code, and no join token
(the ones the fake cloud's instances were given, and any minted for an existing worker) appears
in it, plain or JSON-escaped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from gpuprov import contract
from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import FakeProviderConfig, FaultRule, JobsSettings
from gpuprov.contract import OffersQuery
from gpuprov.engine.binaries import temporal_binary
from gpuprov.engine.worker import WORKFLOWS, open_records
from gpuprov.models import JobSpec, JobState, WorkerCapabilities
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from providers.base import ResourceRequest
from providers.errors import ErrorKind
from providers.fake import FakeCloud
from tests.helpers import (
    OFFER_A,
    OFFER_B,
    decoded_history,
    fake_worker,
    fast_cloud,
    job,
    ready_then_release,
    until,
)
from tests.workflows.test_running import nodes_running
from workflows.offers import PlanOffers

HERE = Path(__file__).resolve().parent
# A fixed identity instead of the default pid@hostname: the histories name no machine.
IDENTITY = "gpuprov-history-recorder"
TASK_QUEUE = "replay"  # scenarios run one after another, each with its own worker
LARGEST_JOB = JobSpec.model_fields["nodes"].metadata[-1].le  # the spec's upper bound


@dataclass
class Run:
    """What one scenario gets: the dev server's client, its own records and task queue."""

    client: Client
    records: Records
    name: str  # the job name (workflow id job-<name>)
    task_queue: str
    secrets: set[str] = field(default_factory=set)  # must not appear in the history

    def job(self, nodes: int = 1, **overrides: object) -> JobSpec:
        return job(self.name, nodes, **overrides)

    @asynccontextmanager
    async def worker(
        self, config: FakeProviderConfig, *, api: bool = False, jobs: JobsSettings | None = None
    ) -> AsyncIterator[tuple[GpuprovClient, FakeCloud, str | None]]:
        """A worker on the fake cloud; with `api`, the real control-plane API in-process."""
        if not api:
            async with self._worker(config, "http://127.0.0.1:9", jobs) as (gpuprov, cloud):
                yield gpuprov, cloud, None
            return
        port = free_port()
        app = create_app(self.records)
        async with serving(app, "127.0.0.1", port):
            url = f"http://127.0.0.1:{port}"
            async with self._worker(config, url) as (gpuprov, cloud):
                yield gpuprov, cloud, url

    @asynccontextmanager
    async def _worker(
        self, config: FakeProviderConfig, api_url: str, jobs: JobsSettings | None = None
    ) -> AsyncIterator[tuple[GpuprovClient, FakeCloud]]:
        async with fake_worker(
            self.client, self.task_queue, config, self.records, api_url, jobs=jobs
        ) as (gpuprov, cloud):
            try:
                yield gpuprov, cloud
            finally:  # every token the cloud's instances were given (the ledger)
                self.secrets.update(r.join_token for r in cloud.state.instances() if r.join_token)


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    play: Callable[[Run], Awaitable[None]]
    workflow: str = "ProvisionJob"

    @property
    def job_name(self) -> str:
        return f"replay-{self.name.replace('_', '-')}"

    @property
    def workflow_id(self) -> str:
        prefix = "offers" if self.workflow == "PlanOffers" else "job"
        return f"{prefix}-{self.job_name}"

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.json"


# ---------------------------------------------------------------- the scenarios


def _expect(condition: bool, what: str) -> None:
    """A scenario that did not take its path would record the wrong history: stop."""
    if not condition:
        raise AssertionError(f"scenario went astray: {what}")


async def _ready_and_release(run: Run, config: FakeProviderConfig, nodes: int = 1, **spec) -> None:
    async with run.worker(config) as (gpuprov, _cloud, _):
        at_ready, final = await ready_then_release(await gpuprov.submit(run.job(nodes, **spec)))
        _expect(at_ready.state is JobState.READY, f"ready, got {at_ready.state}: {at_ready.error}")
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")


async def happy_path(run: Run) -> None:
    await _ready_and_release(run, fast_cloud())


async def multi_node(run: Run) -> None:
    await _ready_and_release(run, fast_cloud(), nodes=3)


async def health_checks(run: Run) -> None:
    """Ready with a 1 s health interval: two checks (timer + check_health) before release."""
    async with run.worker(fast_cloud()) as (gpuprov, _cloud, _):
        handle = await gpuprov.submit(run.job(health_check_interval_seconds=1))
        await until(handle, lambda s: len(s.health) == 1, 30)
        checked = await until(handle, lambda s: s.health[0].checked_at is not None, 30)
        await asyncio.sleep(1.2)  # one more check
        await handle.release()
        final = await asyncio.wait_for(handle.result(), 60)
        _expect(checked.state is JobState.READY, f"ready, got {checked.state}")
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")


async def cleanup_orphan(run: Run) -> None:
    """A cleanup that fails for good (Credentials) is recorded as an orphan; the job completes."""
    fault = FaultRule(primitive="cleanup", kind=ErrorKind.CREDENTIALS, times=1)
    async with run.worker(fast_cloud([fault])) as (gpuprov, _cloud, _):
        _, final = await ready_then_release(await gpuprov.submit(run.job()))
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")
        _expect(len(run.records.open_orphans()) == 1, "one open orphan")


async def shared_block_wait(run: Run) -> None:
    """Every offer blocked by another job's (expiring) block: wait for it to lapse, then run."""
    run.records.record_block(
        scope="provider",
        key="fake",
        kind=ErrorKind.CAPACITY.value,
        message="another job's stockout",
        job="someone-else",
        ttl=timedelta(seconds=2),
    )
    await _ready_and_release(run, fast_cloud())


def _failover(kind: ErrorKind, winner: str) -> Callable[[Run], Awaitable[None]]:
    async def play(run: Run) -> None:
        fault = FaultRule(
            primitive="create", kind=kind, message=f"injected {kind.value}", offer=OFFER_A
        )
        async with run.worker(fast_cloud([fault])) as (gpuprov, _cloud, _):
            at_ready, final = await ready_then_release(await gpuprov.submit(run.job()))
            offers = [a.offer.id for a in at_ready.attempts]
            _expect(offers[0] == OFFER_A and offers[-1] == winner, f"{offers} ending on {winner}")
            _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")

    return play


async def capacity_wait(run: Run) -> None:
    """Both offers sold out three times: the job waits for the blocks (a second here) to lapse,
    asks the launch budget, tries again and gets its machine."""
    stockout = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, times=3, message="sold out")
    quick = JobsSettings(capacity_backoff_seconds=1, capacity_backoff_max_seconds=1)
    async with run.worker(fast_cloud([stockout]), jobs=quick) as (gpuprov, _cloud, _):
        at_ready, final = await ready_then_release(await gpuprov.submit(run.job()))
        tries = len(at_ready.attempts)
        _expect(at_ready.state is JobState.READY and tries == 4, f"ready on try 4, {tries} tries")
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")


async def hedge_race(run: Run) -> None:
    """Offer A never boots; a hedge starts B a second later, B wins and A is torn down."""
    hang = FaultRule(primitive="create", effect="boot_hang", offer=OFFER_A)
    hedge = {"max_parallel": 2, "after_seconds": 1}
    async with run.worker(fast_cloud([hang])) as (gpuprov, cloud, _):
        spec = run.job(placement={"hedge": hedge})
        at_ready, final = await ready_then_release(await gpuprov.submit(spec))
        offers = [a.offer.id for a in at_ready.attempts]
        _expect(at_ready.state is JobState.READY and offers == [OFFER_A, OFFER_B], f"{offers}")
        _expect(final.state is JobState.COMPLETED and cloud.live_instances() == [], "all gone")


async def transient_retry(run: Run) -> None:
    once = FaultRule(primitive="create", offer=OFFER_A, message="injected Transient", times=1)
    async with run.worker(fast_cloud([once])) as (gpuprov, _cloud, _):
        at_ready, final = await ready_then_release(await gpuprov.submit(run.job()))
        _expect([a.offer.id for a in at_ready.attempts] == [OFFER_A], "retried on offer A")
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")


def _abort(kind: ErrorKind) -> Callable[[Run], Awaitable[None]]:
    async def play(run: Run) -> None:
        fault = FaultRule(
            primitive="create", kind=kind, message=f"injected {kind.value}", offer=OFFER_A
        )
        async with run.worker(fast_cloud([fault])) as (gpuprov, cloud, _):
            final = await asyncio.wait_for((await gpuprov.submit(run.job())).result(), 60)
            _expect(final.state is JobState.FAILED, f"failed, got {final.state}")
            _expect(f"aborted by {kind.value}" in (final.error or ""), final.error or "")
            _expect(cloud.live_instances() == [], "nothing left running")

    return play


async def cancel_waiting_running(run: Run) -> None:
    async with run.worker(fast_cloud(boot_delay_seconds=30)) as (gpuprov, _cloud, _):
        handle = await gpuprov.submit(run.job())
        await until(handle, lambda s: (s.waiting_for or "").startswith("running"), 30)
        await handle.cancel()
        final = await asyncio.wait_for(handle.result(), 60)
        _expect(final.state is JobState.CANCELLED, f"cancelled, got {final.state}")


async def provisioning_timeout(run: Run) -> None:
    hang = FaultRule(primitive="create", effect="boot_hang")
    async with run.worker(fast_cloud([hang], boot_timeout=120)) as (gpuprov, _cloud, _):
        handle = await gpuprov.submit(run.job(provisioning_timeout_seconds=2))
        final = await asyncio.wait_for(handle.result(), 60)
        _expect("provisioning timed out" in (final.error or ""), final.error or "")


async def release_keep(run: Run) -> None:
    await _ready_and_release(run, fast_cloud(), release="keep")


async def agent_registration(run: Run) -> None:
    async with run.worker(fast_cloud(simulate_agent=True), api=True) as (gpuprov, _cloud, _):
        at_ready, final = await ready_then_release(await gpuprov.submit(run.job()))
        _expect(all(n.worker_id for n in at_ready.nodes), "every node registered")
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")


async def run_completes(run: Run) -> None:
    """Two nodes run the work (played through the database) and exit 0: completed by itself."""
    config = fast_cloud(simulate_agent=True)
    async with run.worker(config, api=True) as (gpuprov, _cloud, _):
        async with nodes_running(run.client, run.records, run.name, lambda rank, epoch: 0):
            handle = await gpuprov.submit(run.job(2, run="echo $GPUPROV_NODE_RANK"))
            final = await asyncio.wait_for(handle.result(), 60)
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}: {final.error}")


async def run_restarts(run: Run) -> None:
    """The node is preempted while it runs the work: a restart on the next offer, completed."""
    config = fast_cloud(simulate_agent=True)
    async with run.worker(config, api=True) as (gpuprov, cloud, _):
        behaviour = lambda rank, epoch: 0 if epoch == 1 else None  # noqa: E731
        async with nodes_running(run.client, run.records, run.name, behaviour) as nodes:
            spec = run.job(
                run="sleep 3600", health_check_interval_seconds=1, recovery={"max_restarts": 1}
            )
            handle = await gpuprov.submit(spec)
            await until(handle, lambda s: s.state is JobState.RUNNING and bool(nodes.started))
            [instance] = cloud.live_instances()
            cloud.state.preempt(instance.id)
            final = await asyncio.wait_for(handle.result(), 90)
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}: {final.error}")
        _expect(len(final.restarts) == 1, f"one restart, got {final.restarts}")


async def large_job(run: Run) -> None:
    """The largest job a spec allows: every node registers through the API, then release."""
    config = fast_cloud(simulate_agent=True, boot_timeout=300, delete_timeout=300)
    async with run.worker(config, api=True) as (gpuprov, _cloud, _):
        handle = await gpuprov.submit(run.job(LARGEST_JOB))
        at_ready, final = await ready_then_release(handle, timeout=600)
        _expect(at_ready.state is JobState.READY, f"ready, got {at_ready.state}: {at_ready.error}")
        _expect(all(n.worker_id for n in at_ready.nodes), "every node registered")
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")


async def invalid_spec(run: Run) -> None:
    """Started raw (as the temporal CLI does) with an invalid spec: failed at once."""
    async with run.worker(fast_cloud()):
        handle = await run.client.start_workflow(
            "ProvisionJob",
            {"name": run.name, "nodes": "many"},
            id=f"job-{run.name}",
            task_queue=run.task_queue,
        )
        try:
            await asyncio.wait_for(handle.result(), 30)
        except WorkflowFailureError as failed:
            _expect("nodes" in str(failed.cause), f"names the field: {failed.cause}")
        else:
            _expect(False, "the workflow failed")


async def existing_worker(run: Run) -> None:
    async with run.worker(fast_cloud(), api=True) as (gpuprov, cloud, api_url):
        token = run.records.mint_token(label="replay-box", ttl=timedelta(minutes=5))
        run.secrets.add(token)
        capabilities = WorkerCapabilities.model_validate(
            {
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}] * 8,
                "cpu_count": 64,
                "memory_gb": 512,
                "gpu_runtime_ok": True,
            }
        )
        async with httpx.AsyncClient(base_url=api_url) as http:
            body = {"token": token, "capabilities": capabilities.model_dump(mode="json")}
            response = await http.post("/v1/workers/register", json=body)
        _expect(response.status_code == 200, response.text)
        at_ready, final = await ready_then_release(await gpuprov.submit(run.job()))
        _expect(len(at_ready.existing_workers) == 1 and not at_ready.attempts, "reserved")
        _expect(final.state is JobState.COMPLETED, f"completed, got {final.state}")
        _expect(cloud.state.creates_per_vm() == {}, "no cloud machine")


async def plan_offers(run: Run) -> None:
    # GpuprovClient.offers, with a fixed workflow id instead of a random one.
    async with run.worker(fast_cloud()) as (_gpuprov, _cloud, _):
        result = await run.client.execute_workflow(
            PlanOffers.run,
            OffersQuery(request=ResourceRequest(gpu="H100")),
            id=f"offers-{run.name}",
            task_queue=run.task_queue,
            execution_timeout=timedelta(seconds=60),
        )
        _expect(len(result.offers) == 3, f"three offers, got {result.offers}")


K = ErrorKind
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("happy_path", "one node: plan, create, run, ready, release", happy_path),
        Scenario("multi_node", "three nodes on one offer", multi_node),
        Scenario("health_checks", "ready with a 1 s health interval, then release", health_checks),
        Scenario("cleanup_orphan", "cleanup fails for good: recorded orphan", cleanup_orphan),
        Scenario("shared_block_wait", "offers blocked by another job: wait", shared_block_wait),
        Scenario(
            "failover_capacity",
            "Capacity on offer A: blocked, B wins",
            _failover(K.CAPACITY, "fake/r1-b/gpu8"),
        ),
        Scenario(
            "failover_quota",
            "Quota on offer A: region r1 blocked, C wins",
            _failover(K.QUOTA, "fake/r2-a/gpu8"),
        ),
        Scenario(
            "failover_unavailable",
            "Unavailable on offer A: no teardown, B wins",
            _failover(K.UNAVAILABLE, "fake/r1-b/gpu8"),
        ),
        Scenario(
            "failover_failed",
            "Failed on offer A: torn down, B wins",
            _failover(K.FAILED, "fake/r1-b/gpu8"),
        ),
        Scenario("transient_retry", "Transient at create: retried on A", transient_retry),
        Scenario("capacity_wait", "every offer sold out: wait, try again, ready", capacity_wait),
        Scenario("hedge_race", "a hedge beside a slow offer wins; the loser goes", hedge_race),
        Scenario(
            "abort_invalid_request",
            "InvalidRequest at create: abort; cleanup only, no terminate",
            _abort(K.INVALID_REQUEST),
        ),
        Scenario(
            "abort_credentials",
            "Credentials at create: full teardown (terminate by identity), then abort",
            _abort(K.CREDENTIALS),
        ),
        Scenario(
            "cancel_waiting_running",
            "cancelled while the instance boots: teardown",
            cancel_waiting_running,
        ),
        Scenario(
            "provisioning_timeout",
            "boot hangs past provisioning_timeout_seconds",
            provisioning_timeout,
        ),
        Scenario("release_keep", "release=keep: machines marked kept", release_keep),
        Scenario(
            "agent_registration",
            "the node registers through the API; the job reads its worker row",
            agent_registration,
        ),
        Scenario("large_job", f"{LARGEST_JOB} nodes through registration to release", large_job),
        Scenario("run_completes", "two nodes run the work and exit 0: completed", run_completes),
        Scenario(
            "run_restarts", "a node preempted while it runs: restart, then done", run_restarts
        ),
        Scenario("invalid_spec", "a raw start with an invalid spec fails at once", invalid_spec),
        Scenario(
            "existing_worker",
            "an idle existing worker is reserved; no cloud machine",
            existing_worker,
        ),
        Scenario("plan_offers", "PlanOffers lists the ranked offers", plan_offers, "PlanOffers"),
    ]
}


# ---------------------------------------------------------------- recording


def leaked_secrets(text: str, secrets: set[str]) -> list[str]:
    """The secrets found in `text`, plain or JSON-escaped (their first characters only)."""
    found = []
    for secret in secrets:
        if secret in text or json.dumps(secret)[1:-1] in text:
            found.append(secret[:4] + "...")
    return found


def one_event_per_line(text: str) -> str:
    """`to_json()`'s document, one compact event per line: a third of the indented size, and a
    rerecording still diffs event by event."""
    document = json.loads(text)
    if set(document) != {"events"}:
        raise ValueError(f"unexpected history keys {sorted(document)}")
    events = ",\n".join(json.dumps(e, separators=(",", ":")) for e in document["events"])
    return f'{{"events":[\n{events}\n]}}\n'


async def replays(scenario: Scenario, text: str) -> None:
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    await replayer.replay_workflow(WorkflowHistory.from_json(scenario.workflow_id, text))


async def record_one(client: Client, scenario: Scenario) -> tuple[int, int]:
    """Play the scenario, check its history, write it: (bytes written, tokens scanned for)."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-history-") as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        run = Run(client, records, scenario.job_name, TASK_QUEUE)
        try:
            await scenario.play(run)
        finally:
            records.db.dispose()
    history = await client.get_workflow_handle(scenario.workflow_id).fetch_history()
    text = one_event_per_line(history.to_json())
    leaked = leaked_secrets(decoded_history(history), run.secrets)  # payloads decoded
    if leaked:
        raise AssertionError(f"{scenario.name}: join tokens in history: {leaked}")
    await replays(scenario, text)
    scenario.path.write_text(text)
    return len(text.encode()), len(run.secrets)


async def record(names: list[str]) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=list(contract.SEARCH_ATTRIBUTES),
        identity=IDENTITY,
    )
    try:
        total = 0
        for name in names:
            size, tokens = await record_one(env.client, SCENARIOS[name])
            total += size
            print(f"{name + '.json':28} {size / 1024:5.1f} KiB  {tokens} token(s) absent")
        print(f"{len(names)} histories, {total / 1024:.1f} KiB in {HERE}")
    finally:
        await env.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.histories.record", description=__doc__)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=", ".join(SCENARIOS))
    names = parser.parse_args(argv).scenarios or list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    asyncio.run(record(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())

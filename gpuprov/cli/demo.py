"""`gpuprov demo`: the README's first command, the whole story on the fake cloud.

A Temporal dev server (with UI), a worker and the API start; a 2-node H100 job with a command to
run is submitted; the cheapest offer has room for one node and answers the second create with a
capacity stockout; the job tears that attempt down (the one instance that landed included),
blocks the offer, fails over, reaches `ready`. Every booted machine runs the real node agent
(agent.pyz `run`, as a local process with a stub nvidia-smi replaying an 8 x H100 node):
the demo prints each node's registration with what its probe found, and its heartbeats. Then
the agents run the job's work (a few "training steps" in shell, on this machine) and the demo
streams its output from the database as the nodes send it (`gpuprov logs --follow`). The job
ends `completed` on its own once both nodes exited 0, and releases its machines itself; the
demo prints the final status, the cloud's ledger (nothing left) and the UI link, and shuts
everything down.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable

from gpuprov.cli.common import Commands
from gpuprov.cli.dev import dev_stack
from gpuprov.cli.render import progress_line, status_text
from gpuprov.config import (
    DatabaseSettings,
    FakeInstanceType,
    FakeProviderConfig,
    FakeRegion,
    FaultRule,
    ProvidersSettings,
    Settings,
    TemporalSettings,
    WorkersSettings,
)
from gpuprov.models import JobSpec, JobState, JobStatus, Resources, capabilities_text
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.credentials import Credentials
from gpuprov.store.logs import prefixed, read_lines
from gpuprov.store.records import Records
from providers.errors import ErrorKind
from providers.fake import FakeCloudState

DEMO_JOB = "demo-train"
HEARTBEAT = 1.0  # seconds between a node's heartbeats (30 in production)
SHOWN_BEATS = 3
STOCKOUT = (
    "InsufficientInstanceCapacity: We currently do not have sufficient h100x8 capacity in the "
    "Availability Zone you requested (us-east-1a)."
)


def demo_cloud(state_path: str | None = None) -> FakeProviderConfig:
    h100 = dict(gpu="H100", gpu_count=8, gpu_memory_gb=80, vcpus=208, memory_gb=1800, disk_gb=2000)
    return FakeProviderConfig(
        regions=[
            FakeRegion(name="us-east-1", zones=["us-east-1a", "us-east-1b"]),
            FakeRegion(name="us-west-2", zones=["us-west-2a"]),
        ],
        instance_types=[
            FakeInstanceType(name="h100x8", price=23.92, regions=["us-east-1"], **h100),
            FakeInstanceType(name="h100x8", price=24.48, regions=["us-west-2"], **h100),
            FakeInstanceType(
                name="a100x8",
                gpu="A100",
                gpu_count=8,
                gpu_memory_gb=80,
                vcpus=96,
                memory_gb=1152,
                disk_gb=1000,
                price=14.32,
            ),
        ],
        boot_delay_seconds=3.0,
        agent="real",
        delete_delay_seconds=2.0,
        poll_interval=0.5,
        boot_timeout=60,
        delete_timeout=30,
        state_path=state_path,
        # us-east-1a has room for one of the two nodes: the first create lands, the second
        # hits the stockout, so the attempt's one instance must be torn down before failover.
        faults=[
            FaultRule(
                primitive="create",
                offer="fake/us-east-1a/h100x8",
                after=1,
                kind=ErrorKind.CAPACITY,
                message=STOCKOUT,
            )
        ],
    )


# What each node runs: a stand-in for a training script, a step a second.
SETUP = 'echo "node $GPUPROV_NODE_RANK of $GPUPROV_NUM_NODES ready; master $GPUPROV_MASTER_ADDR"'
RUN = """for step in 1 2 3 4 5; do
  loss=$(awk -v s=$step -v r=$GPUPROV_NODE_RANK 'BEGIN { printf "%.3f", 2.5 / (s + r / 10) }')
  echo "rank $GPUPROV_NODE_RANK step $step/5 loss $loss"
  sleep 1
done
echo "rank $GPUPROV_NODE_RANK done"
"""


def demo_job() -> JobSpec:
    # No CPU or memory minimum: the agents probe this machine, whatever it is.
    return JobSpec(
        name=DEMO_JOB,
        nodes=2,
        resources=Resources(gpu="H100", gpus_per_node=8),
        max_hourly_cost=60.0,
        provisioning_timeout_seconds=300,
        setup=SETUP,
        run=RUN,
    )


async def run_demo(
    out: Callable[[str], None] = print, hold: Callable[[], object] | None = None
) -> JobStatus:
    with tempfile.TemporaryDirectory(prefix="gpuprov-demo-") as data_dir:
        settings = Settings(
            temporal=TemporalSettings(data_dir=data_dir),
            database=DatabaseSettings(url=f"sqlite:///{data_dir}/gpuprov.db"),
            providers=ProvidersSettings(fake=demo_cloud(f"{data_dir}/fake-cloud.db")),
            workers=WorkersSettings(heartbeat_interval_seconds=HEARTBEAT, lost_after_seconds=10),
        )
        async with dev_stack(settings) as stack:
            out(f"Temporal dev server at {stack.address}, Web UI at {stack.ui_url}")
            # A key for this demo's throwaway database only: it goes when the demo ends.
            _, key = Credentials(stack.records.db).create_operator_key("demo")
            out(f"dashboard at {stack.api_url}/ui (sign in with this demo's admin key {key})")
            client = GpuprovClient(stack.client, settings.temporal.task_queue)
            spec = demo_job()
            handle = await client.submit(spec)
            out(f"submitted {spec.nodes}x {spec.resources.gpu} job {spec.name}")
            out(f"watch it: {stack.workflow_url(spec.workflow_id)}")
            printer = progress_printer(out)
            placed = await handle.wait_for(  # ready, and the work given out at once
                lambda s: s.ready_at is not None, timeout=300, on_change=printer
            )
            ending = asyncio.create_task(  # the job's progress, printed as it comes
                handle.wait_for(lambda s: False, timeout=300, on_change=printer)
            )
            if placed.ready_at is not None:
                await show_heartbeats(stack.records, placed, out)
                out("the nodes run the work; its output as they send it (gpuprov logs -f):")
                follow = read_lines(
                    settings.database_url, spec.name, running=handle.running, run=placed.run
                )
                async for line in follow:
                    out(f"  {prefixed(line)}")
            status = await ending
            out("")
            out(status_text(status))
            out(_cloud_ledger(settings.providers.fake))
            out(f"Temporal UI for this job: {stack.workflow_url(spec.workflow_id)}")
            out(f"dashboard page for this job: {stack.api_url}/ui/jobs/{spec.name}")
            if hold is not None:  # in a thread: the API serves the dashboard meanwhile
                await asyncio.to_thread(hold)
        out("dev server and worker stopped; nothing left running.")
        return status


async def show_heartbeats(records: Records, status: JobStatus, out: Callable[[str], None]) -> None:
    """Each placed node's worker once its agent has sent a few heartbeats."""
    nodes = {node.worker_id: node.vm for node in status.live_nodes() if node.worker_id}
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        rows = [records.get_worker(worker_id) for worker_id in nodes]
        done = all(row is not None and row.heartbeats >= SHOWN_BEATS for row in rows)
        if done or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.2)
    for row in rows:
        if row is not None:
            out(
                f"  {nodes[row.id]}: worker {row.id} {row.liveness}, {row.health}, "
                f"{row.heartbeats} heartbeats (one every {HEARTBEAT:g}s)"
            )


def _cloud_ledger(config: FakeProviderConfig | None) -> str:
    """What the fake cloud itself says is left: the proof that nothing leaked."""
    assert config is not None
    state = FakeCloudState(config.state_path)
    try:
        live = state.live_instances(config.delete_delay_seconds)
        creates = state.creates_per_vm()
        side = state.live_side_resources()
    finally:
        state.close()
    per_vm = ", ".join(f"{vm}={n}" for vm, n in sorted(creates.items())) or "none"
    return (
        f"fake cloud ledger: {len(live)} live instance(s), {len(side)} side resource(s); "
        f"instances ever created per VM: {per_vm}"
    )


def progress_printer(out: Callable[[str], None]) -> Callable[[JobStatus], None]:
    seen: set[str] = set()
    reported_attempts: set[int] = set()
    registered: set[str] = set()

    def on_change(status: JobStatus) -> None:
        line = progress_line(status)
        if line not in seen:
            seen.add(line)
            out(line)
        for attempt in status.attempts:
            if attempt.kind is not None and attempt.number not in reported_attempts:
                reported_attempts.add(attempt.number)
                out(f"  attempt {attempt.describe()}")
        for node in status.nodes:
            if node.worker_id and node.capabilities and node.worker_id not in registered:
                registered.add(node.worker_id)
                out(
                    f"  {node.vm} registered through the API as worker {node.worker_id}: "
                    f"{capabilities_text(node.capabilities)}"
                )

    return on_change


def main(hold: bool = False) -> int:
    wait: Callable[[], object] | None = None
    if hold:

        def wait() -> object:
            return input("the UI stays up; press Enter to shut down... ")

    status = asyncio.run(run_demo(hold=wait))
    return 0 if status.state is JobState.COMPLETED else 1


def add_parser(commands: Commands) -> None:
    demo = commands.add_parser("demo", help="run the fake-cloud failover story end to end")
    demo.add_argument("--hold", action="store_true", help="keep the UI up until Enter")
    demo.set_defaults(standalone=lambda args: main(hold=args.hold))

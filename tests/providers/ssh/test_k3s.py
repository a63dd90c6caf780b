"""The k3s profile on machines you own: a 2-node job on two local sshds,
bootstrapped over SSH by the workflow, then node 0 runs the k3s server and node 1 joins it as an
agent. The installer is a stub script on the SSH host (installer_url file://...) that records
how it was run; the cluster's join token travels only over SSH stdin: never in the job's
history."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from activities.ssh_keys import KeyStore
from gpuprov.api.app import create_app, serving
from gpuprov.config import JobsSettings, K3sSettings
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.models import JobState
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.ssh_records import SshRecords
from providers.ssh.cloud import SshMachines
from providers.ssh.config import SshConfig, SshHost
from tests.helpers import decoded_history, job, until
from tests.sshd import free_port, running_sshd

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

NODE_TOKEN = "K10stub-cluster-join-token::server:4f1c2b"

STUB_INSTALLER = """#!/bin/sh
# A stand-in for get.k3s.io: records each run, and as a server writes the node token and a
# kubeconfig where the flags say.
set -e
role="$1"; shift
node=""; data=""; kubeconfig=""
while [ $# -gt 0 ]; do
  case "$1" in
    --node-name) node="$2"; shift 2 ;;
    --data-dir) data="$2"; shift 2 ;;
    --write-kubeconfig) kubeconfig="$2"; shift 2 ;;
    *) shift ;;
  esac
done
echo "$role node=$node url=${K3S_URL:-none} token=${K3S_TOKEN:-none}" >> "@LOG@"
if [ "$role" = server ]; then
  mkdir -p "$data/server"
  echo "@TOKEN@" > "$data/server/node-token"
  echo "apiVersion: v1" > "$kubeconfig"
fi
"""

# A job waits in queued (planning) and then provisioning (an offer being brought up).
WAITING_STATES = (JobState.QUEUED, JobState.PROVISIONING)


async def test_a_k3s_job_runs_the_server_on_node_0_and_joins_the_others(
    tmp_path: Path, client: Client, task_queue: str, job_name: str
) -> None:
    log = tmp_path / "k3s-calls.log"
    stub = tmp_path / "install-k3s.sh"
    stub.write_text(STUB_INSTALLER.replace("@LOG@", str(log)).replace("@TOKEN@", NODE_TOKEN))
    k3s = K3sSettings(
        installer_url=f"file://{stub}",
        data_dir=str(tmp_path / "k3s-data"),
        kubeconfig=str(tmp_path / "k3s.yaml"),
    )
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    with running_sshd(tmp_path / "sshd-a") as box_a, running_sshd(tmp_path / "sshd-b") as box_b:
        hosts = [
            SshHost(
                name=name,
                host="127.0.0.1",
                port=sshd.port,
                key_path=str(sshd.client_key_path),
                price=price,
            )
            for name, sshd, price in (("box-a", box_a, 1.0), ("box-b", box_b, 1.0))
        ]
        machines = SshMachines(
            SshConfig(
                hosts=hosts,
                claims_url=f"sqlite:///{tmp_path / 'claims.db'}",
                boot_timeout=20,
                poll_interval=0.2,
                connect_timeout=2,
            )
        )
        worker = build_worker(
            client,
            task_queue,
            {"ssh": machines},
            records,
            api_url=api_url,
            jobs=JobsSettings(k3s=k3s),
            ssh_keys=KeyStore(SshRecords(records.db), directory=tmp_path / "worker-keys"),
            ssh_bootstrap={"ssh"},
        )
        try:
            api = create_app(records)
            async with serving(api, "127.0.0.1", port), worker:
                gpuprov = GpuprovClient(client, task_queue)
                spec = job(
                    job_name,
                    nodes=2,
                    resources={"gpus_per_node": 0},
                    placement={"providers": ["ssh"]},
                    profile="k3s",
                    provisioning_timeout_seconds=60,
                    health_check_interval_seconds=None,
                )
                handle = await gpuprov.submit(spec)
                ready = await until(handle, lambda s: s.state not in WAITING_STATES)
                await handle.release()
                final = await until(handle, lambda s: s.state.terminal, timeout=30)
                history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
        finally:
            await machines.aclose()
            records.db.dispose()

    assert ready.state is JobState.READY, ready.error
    node0, node1 = ready.live_nodes()
    assert ready.kubeconfig == f"root@127.0.0.1:{tmp_path / 'k3s.yaml'}"
    server, agent = log.read_text().splitlines()
    assert server == f"server node={node0.vm} url=none token=none"
    assert agent == f"agent node={node1.vm} url=https://127.0.0.1:6443 token={NODE_TOKEN}"
    assert final.state is JobState.COMPLETED
    text = decoded_history(history)
    assert node0.vm in text  # the decoding reads the payloads
    assert NODE_TOKEN not in text

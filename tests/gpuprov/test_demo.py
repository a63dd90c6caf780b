"""`gpuprov demo`, the README's first command, end to end: the story (a failover, the nodes'
work and its output as it comes, the end on its own), then nothing left."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

GPUPROV = str(Path(sys.executable).parent / "gpuprov")


async def test_demo_fails_over_runs_the_work_completes_on_its_own_and_leaves_no_process():
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        "demo",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), 180)
    out = stdout.decode()
    assert process.returncode == 0, out

    assert "Capacity at create: InsufficientInstanceCapacity" in out
    assert "[provisioning] - waiting for teardown of attempt #1" in out
    assert "[running]" in out and "[releasing]" in out
    assert "job demo-train: completed" in out
    assert "#2 fake/us-east-1b/h100x8 (fake/us-east-1): succeeded" in out
    assert "offer fake/us-east-1a/h100x8: Capacity" in out
    assert "0 live instance(s), 0 side resource(s)" in out
    # attempt 1 landed one of its two nodes (either) before the stockout, and tore it down;
    # every VM was created exactly once.
    tag = r"-[0-9a-f]{6}"  # every VM identity ends with the job's run tag
    landed = re.search(
        rf"attempt 1 node (\d) demo-train-a1-n\1{tag} \[fake/us-east-1\] fake-i-000001: terminated",
        out,
    )
    assert landed, out
    ledger = re.search(r"instances ever created per VM: (.*)", out)
    assert ledger, out
    created = sorted(re.sub(tag, "", entry) for entry in ledger.group(1).split(", "))
    assert created == sorted(
        [f"demo-train-a1-n{landed.group(1)}=1", "demo-train-a2-n0=1", "demo-train-a2-n1=1"]
    )
    # the nodes of the winning attempt ran the real agent: it registered through the real API
    # with the node's token, with what its probe read from the captured nvidia-smi, then
    # heartbeated
    for node in ("demo-train-a2-n0", "demo-train-a2-n1"):
        assert re.search(rf"{node}{tag} registered through the API as worker", out), out
        beats = re.search(rf"{node}{tag}: worker \w+ alive, healthy, (\d+) heartbeats", out)
        assert beats and int(beats.group(1)) >= 3, out
    assert out.count("8 x NVIDIA H100 80GB HBM3; driver 550.90.07; CUDA 12.4; ") >= 2
    assert "GPU runtime OK" in out
    # The work ran on both nodes, its output streamed while the job ran, and the job completed
    # on its own once both exited 0 (nothing released it).
    streamed = out[out.index("its output as they send it") : out.index("job demo-train: completed")]
    for rank in (0, 1):
        steps = re.findall(
            rf"^  \[{rank}\] rank {rank} step (\d)/5 loss \d\.\d{{3}}$", streamed, re.M
        )
        assert steps == ["1", "2", "3", "4", "5"], streamed
        assert f"  [{rank}] node {rank} of 2 ready; master " in streamed
        assert f"  [{rank}] rank {rank} done" in streamed
        assert re.search(rf"node {rank} demo-train-a2-n{rank}{tag}: exited, exit code 0", out)
    # the first steps came in while the job ran: before it began releasing its machines
    assert out.index("[0] rank 0 step 1/5") < out.index("[releasing]"), out
    assert "Temporal UI for this job: http://127.0.0.1:" in out
    assert "/namespaces/default/workflows/job-demo-train" in out
    assert re.search(r"dashboard at http://127\.0\.0\.1:\d+/ui \(sign in with .* gpo_", out)
    assert re.search(
        r"dashboard page for this job: http://127\.0\.0\.1:\d+/ui/jobs/demo-train", out
    )

    # Nothing the demo started (dev server, UI) outlives it.
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError("a process from the demo's session is still running")
